package exchange

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/wire"
)

// Dest is what the two ends of a connection tell each other out of band
// before their queue pairs can talk: the LID (unused on RoCE), QP number,
// first PSN and GID. It is what rdma-core's ibv_rc_pingpong and
// ibv_ud_pingpong exchange over TCP port 18515.
type Dest struct {
	LID uint16
	QPN uint32
	PSN wire.PSN
	GID wire.GID
}

// WeftLID is the LID a Weft endpoint sends in the pingpong exchange, to
// tell its peer that it is Weft. LIDs mean nothing on RoCE: rdma-core's
// programs send their port's LID, which is 0 there, and the kernel
// ignores the LID of a RoCE destination, so the mark costs them nothing.
// A peer that sends another LID is foreign (fabric.Caps.Foreign): it says
// no goodbye on Close, and a Weft endpoint sends it none.
const WeftLID = 0x5746

// WeftShmLID is the LID a Weft endpoint sends instead of WeftLID when its
// engine also takes packets through a shared-memory ring on its host, the
// one named after its address (roce's automatic link, link.AutoLink). A
// Weft peer on the same host that finds that ring alive sends through it;
// any other peer sees a foreign LID that means nothing, or a Weft one.
const WeftShmLID = 0x5753

// IsWeft reports whether d came from a Weft endpoint (its LID is WeftLID
// or WeftShmLID).
func (d Dest) IsWeft() bool { return d.LID == WeftLID || d.LID == WeftShmLID }

// OffersShm reports whether d's engine takes packets through a
// shared-memory ring on its host (its LID is WeftShmLID).
func (d Dest) OffersShm() bool { return d.LID == WeftShmLID }

// PingpongMsgSize is the size of the message ibv_*_pingpong exchange:
// sizeof "0000:000000:000000:00000000000000000000000000000000", the text
// "LLLL:QQQQQQ:PPPPPP:" and the GID as 32 lower-case hex digits, NUL
// terminated (see INTEROP.md, section 2.1). Each side sends it in one
// write, and reads it whole.
const PingpongMsgSize = 52

// DefaultBootstrapPort is the TCP port of the pingpong programs and
// perftest.
const DefaultBootstrapPort = 18515

// MarshalPingpong formats d as the pingpong programs do.
func (d Dest) MarshalPingpong() [PingpongMsgSize]byte {
	var b [PingpongMsgSize]byte
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN&0xffffff, uint32(d.PSN)&0xffffff, hex.EncodeToString(d.GID[:]))
	copy(b[:], s)
	return b
}

// refusalMarker starts the reply of a Weft listener that refuses a
// connection: a message of PingpongMsgSize bytes, so that a Weft dialer
// reads it where it expects the server's address and recognises it, while
// ibv_rc_pingpong's parser simply rejects it.
const refusalMarker = "weft:refused:"

// MarshalRefusal formats the refusal a listener sends in place of its
// address (reason is cut to fit).
func MarshalRefusal(reason string) [PingpongMsgSize]byte {
	var b [PingpongMsgSize]byte
	n := copy(b[:PingpongMsgSize-1], refusalMarker)
	copy(b[n:PingpongMsgSize-1], reason)
	return b
}

// ParsePingpong parses a pingpong exchange message. A refusal
// (MarshalRefusal) gives a *fabric.RefusedError, with the Reason the peer
// gave (a full backlog, a closing listener), which matches fabric.ErrRefused;
// anything else that is not an address gives an error matching
// fabric.ErrMalformed.
func ParsePingpong(b []byte) (Dest, error) {
	if r, ok := bytes.CutPrefix(b, []byte(refusalMarker)); ok {
		if i := bytes.IndexByte(r, 0); i >= 0 {
			r = r[:i]
		}
		reason := strings.Map(func(c rune) rune {
			if c < 0x20 || c > 0x7e {
				return '?'
			}
			return c
		}, string(r))
		return Dest{}, &fabric.RefusedError{Reason: reason}
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	f := strings.Split(strings.TrimSpace(string(b)), ":")
	if len(f) != 4 || len(f[3]) != 32 {
		return Dest{}, fmt.Errorf("roce: pingpong address %q: %w", b, fabric.ErrMalformed)
	}
	lid, err1 := strconv.ParseUint(f[0], 16, 16)
	qpn, err2 := strconv.ParseUint(f[1], 16, 24)
	psn, err3 := strconv.ParseUint(f[2], 16, 24)
	g, err4 := hex.DecodeString(f[3])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return Dest{}, fmt.Errorf("roce: pingpong address %q: %w", b, fabric.ErrMalformed)
	}
	var d Dest
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), wire.PSN(psn)
	copy(d.GID[:], g)
	return d, nil
}

// CheckPeer rejects a peer address that no real queue pair can have: the
// special QPs 0 and 1, and GIDs that are not a unicast IP address. A
// listener must not aim a queue pair at such a target on a stranger's
// word.
func CheckPeer(d Dest) error {
	a := d.GID.Addr()
	if d.QPN <= 1 || !a.IsValid() || a.IsUnspecified() || a.IsMulticast() ||
		(a.Is4() && a.As4() == [4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("roce: peer address %06x@%v: %w", d.QPN, a, fabric.ErrMalformed)
	}
	return nil
}

// WatchDeadline makes ctx's deadline and cancellation end conn's reads
// and writes, until the function it returns is called.
func WatchDeadline(ctx context.Context, conn net.Conn) func() {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	return func() { stop(); conn.SetDeadline(time.Time{}) }
}

// Client runs the client side of the pingpong exchange on conn:
// send our address, read the server's, call connect with it, send
// "done". The queue pair is ready before "done" tells the server so:
// ibv_rc_pingpong's client connects after, which is harmless there, as
// its server waits for the client's first message, but a Weft server
// may send at once, and its first packets would find a queue pair not
// yet ready to receive them (dropped, and sent again only after the
// timeout).
func Client(ctx context.Context, conn net.Conn, local Dest, connect func(Dest) error) (Dest, error) {
	defer WatchDeadline(ctx, conn)()
	msg := local.MarshalPingpong()
	if _, err := conn.Write(msg[:]); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: %w", err)
	}
	var in [PingpongMsgSize]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: reading the server's address: %w", err)
	}
	remote, err := ParsePingpong(in[:])
	if err != nil {
		return Dest{}, err
	}
	if err := connect(remote); err != nil {
		return Dest{}, err
	}
	if _, err := conn.Write([]byte("done\x00")); err != nil {
		return Dest{}, fmt.Errorf("roce: bootstrap: %w", err)
	}
	return remote, nil
}

// Server runs the server side of the pingpong exchange: read the
// client's address, call connect with it (the server's QP must be ready
// before the client learns its address), send ours, wait for "done".
func Server(ctx context.Context, conn net.Conn, local Dest, connect func(Dest) error) (Dest, error) {
	defer WatchDeadline(ctx, conn)()
	remote, err := ReadClient(conn)
	if err != nil {
		return Dest{}, err
	}
	if err := connect(remote); err != nil {
		return Dest{}, err
	}
	return remote, Reply(conn, local)
}

// ReadClient reads and parses the client's address: the server's first
// step, which a listener takes before it spends a queue pair on the peer.
func ReadClient(conn net.Conn) (Dest, error) {
	var in [PingpongMsgSize]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w (%w)", err, fabric.ErrMalformed)
		}
		return Dest{}, fmt.Errorf("roce: bootstrap: reading the client's address: %w", err)
	}
	return ParsePingpong(in[:])
}

// Reply sends the server's address and waits for the client's "done":
// the server's last step.
func Reply(conn net.Conn, local Dest) error {
	msg := local.MarshalPingpong()
	if _, err := conn.Write(msg[:]); err != nil {
		return fmt.Errorf("roce: bootstrap: %w", err)
	}
	var done [5]byte
	if _, err := io.ReadFull(conn, done[:4]); err != nil {
		return fmt.Errorf("roce: bootstrap: no \"done\" from the client: %w", err)
	}
	if string(done[:4]) != "done" {
		return fmt.Errorf("roce: bootstrap: %q from the client instead of \"done\": %w", done[:4], fabric.ErrMalformed)
	}
	return nil
}

// Refuse answers a client the server cannot take with a refusal (see
// MarshalRefusal) within ctx. It reads the client's address first, so
// that closing does not reset the connection under the refusal, and
// waits for the client to close.
func Refuse(ctx context.Context, conn net.Conn, reason string) {
	defer WatchDeadline(ctx, conn)()
	var in [PingpongMsgSize]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return
	}
	msg := MarshalRefusal(reason)
	conn.Write(msg[:])
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(conn, 64)) // until the peer closes
}
