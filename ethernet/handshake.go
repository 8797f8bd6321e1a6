package ethernet

// The session handshake: hellos until both sides know each other's
// connection id and nonce, the listener's hand-off, and the end of a
// session (peer gone, refused).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/weft-io/weft/fabric"
)

// handshakeState is the session part of an Endpoint (guarded by its mu):
// the two sides' connection ids and nonces, and for a connection a
// listener accepts, the hand-off to the accept queue.
type handshakeState struct {
	session     uint32 // our connection id
	nonce       uint64 // our handshake nonce
	peerSession uint32
	peerNonce   uint64
	peerMAC     [6]byte
	peerKnown   bool
	up          bool
	gone        error // set when the peer is gone
	nextHello   int64
	hsDrops     uint64 // handshake packets refused (forged, stale, malformed)

	// Set for an endpoint a listener created: the listener, when the
	// handshake must be done, and whether the listener heard the outcome
	// (settled is the background goroutine's alone).
	lis        *Listener
	hsDeadline int64
	settled    bool
}

// handshake exchanges hello packets until both sides know each other's
// connection id and nonce.
func (e *Endpoint) handshake(ctx context.Context) error {
	for {
		e.mu.Lock()
		e.now = clock()
		e.pollLocked(256)
		if e.up {
			e.mu.Unlock()
			return nil
		}
		if e.gone != nil {
			err := e.gone
			e.mu.Unlock()
			return err
		}
		if e.now >= e.nextHello {
			e.sendHelloLocked(ptHello)
			e.nextHello = e.now + int64(helloEvery)
		}
		e.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for the peer: %w", err)
		}
		e.sleep(ctx.Done(), time.Millisecond)
	}
}

// settle hands a listener's connection to the accept queue once its
// handshake is done, or gives it up when the handshake failed or ran out
// of time.
func (e *Endpoint) settle() {
	e.mu.Lock()
	up, gone, late := e.up, e.gone, e.now > e.hsDeadline
	e.mu.Unlock()
	switch {
	case up && gone == nil:
		e.settled = true
		go e.lis.established(e)
	case gone != nil || late:
		e.settled = true
		go e.lis.abandon(e)
	}
}

// failLocked marks the peer gone.
func (e *Endpoint) failLocked(err error) {
	if e.gone != nil {
		return
	}
	if !errors.Is(err, fabric.ErrPeerGone) && !errors.Is(err, fabric.ErrRefused) {
		err = fmt.Errorf("%w: %w", fabric.ErrPeerGone, err)
	}
	e.gone = err
	e.emit(fabric.Event{Kind: fabric.EventPeerGone, Time: time.Now(), Err: err})
}

// sendHelloLocked sends a hello or hello-ack: our connection id and
// nonce, and the peer's nonce as we know it.
func (e *Endpoint) sendHelloLocked(typ uint8) bool {
	var flags uint8
	if typ == ptHello && e.cfg.ToListener {
		flags = pfListener
	}
	return e.sendCtlBodyLocked(typ, flags, 0, helloLen)
}

// helloLocked processes a handshake packet. Hellos and hello-acks
// teach us the peer's connection id and nonce; a hello-ack that echoes
// our nonce completes our side; a refusal that echoes our nonce ends the
// dial with fabric.ErrRefused. Anything forged, stale or malformed is
// dropped and counted (DropMalformed).
func (e *Endpoint) helloLocked(b []byte, off int) {
	var m handshakeMsg
	if err := parseHandshake(b[off:], &m); err != nil {
		e.refuseHelloLocked()
		return
	}
	if m.echo != 0 && m.echo != e.nonce {
		e.refuseHelloLocked() // forged, or from an earlier dial
		return
	}
	if m.typ == ptRefuse {
		if e.up || m.dst != e.session {
			e.refuseHelloLocked()
			return
		}
		e.failLocked(&fabric.RefusedError{Addr: net.HardwareAddr(b[6:12:12]).String(), Reason: "backlog full"})
		return
	}
	if e.peerSession == 0 {
		e.peerSession, e.peerNonce = m.session, m.nonce
		if !e.peerKnown {
			copy(e.peerMAC[:], b[6:12])
			e.peerKnown = true
		}
		e.m.bound(e)
	} else if m.session != e.peerSession || m.nonce != e.peerNonce {
		// Another incarnation of the peer, or a forgery: not ours.
		e.refuseHelloLocked()
		return
	}
	e.lastHeard = e.now
	e.ackLocked(m.ack, m.wnd, false, 0)
	if m.typ == ptHelloAck {
		if !e.up {
			e.lastProgress = e.now
		}
		e.up = true
	} else {
		e.sendHelloLocked(ptHelloAck)
	}
}

func (e *Endpoint) refuseHelloLocked() {
	e.hsDrops++
	e.ctr.Drop(fabric.DropMalformed, 1)
}

// wantsHello reports whether a hello to connection id 0 (frame b, Weft
// header at off) is for this dialer, which does not know its peer's id
// yet: two endpoints dialling each other (a symmetric open) meet this
// way. A dialer that names its peer takes only that peer's hellos; one
// that does not (a broadcast dial) takes any, unless a listener on the
// queue takes them. It runs under the mux's locks and reads only what
// does not change after Dial.
func (e *Endpoint) wantsHello(b []byte, off int) bool {
	c := &e.cfg
	if c.PeerMAC == nil {
		return e.m.lis.Load() == nil
	}
	if [6]byte(b[6:12]) != [6]byte(c.PeerMAC) {
		return false
	}
	if c.UDP {
		u := b[off-UDPHdrLen:]
		if [4]byte(b[EthHdrLen+12:EthHdrLen+16]) != c.PeerIP.As4() || binary.BigEndian.Uint16(u) != c.PeerPort {
			return false
		}
	}
	return true
}
