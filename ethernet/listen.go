package ethernet

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/acceptq"
)

// Listener is a fabric.Listener on one AF_XDP queue: the queue this
// process shares among all its endpoints on the interface (one socket,
// one UMEM, one XDP steering). Peers dial it with their own interface
// and the listener's MAC address (Addr); each hello addressed to no
// connection starts a handshake, and each accepted peer is an
// independent Endpoint with its own reliability state, told apart from
// the others by the connection id in Weft's header.
//
// Handshakes are bounded by the backlog: a hello that finds it full is
// answered with a refusal (the dialer's Open fails with a
// *fabric.RefusedError, which matches fabric.ErrRefused) and counted. A
// peer that sends a hello and vanishes is given up after
// Options.HandshakeLimit() and counted as failed. Truncated, malformed,
// forged (a nonce echo that does not match) or replayed hellos (the
// connection id and nonce of a connection this listener already served)
// are dropped and counted as failed.
type Listener struct {
	cfg   EndpointConfig // the template of accepted endpoints
	m     *mux
	q     *acceptq.Queue
	limit time.Duration
	addr  string
	id    uint32 // the connection id of refusals
	nonce uint64

	hellos chan *helloFrame
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu      sync.Mutex
	byPeer  map[peerKey]*Endpoint // every live connection, by peer and peer id
	pending map[*Endpoint]bool    // connections in their handshake
	seen    map[replayKey]struct{}
	seenLog []replayKey // oldest first, a ring of len maxSeen
	seenPos int
	closed  bool

	badHellos atomic.Uint64 // refused before they took a slot
	dropped   atomic.Uint64 // hellos lost because the hello queue was full
	refusal   [UDP4HdrLen + hdrLen + helloLen]byte
}

// DefaultListenWindow is the window of accepted connections when the
// listener's address sets none. Accepted connections share one receive
// buffer (the queue's fill ring, 16384 frames), and the window is what a
// connection advertises: 64 connections of 128 packets fill half of it,
// so a burst from all of them at once is not dropped.
const DefaultListenWindow = 128

// maxSeen bounds the memory of served (connection id, nonce) pairs that
// makes replayed hellos recognisable.
const maxSeen = 4096

type peerKey struct {
	mac     [6]byte
	ip      [4]byte
	port    uint16
	session uint32
}

type replayKey struct {
	session uint32
	nonce   uint64
}

// helloFrame is a hello to connection id 0, copied out of the UMEM.
type helloFrame struct {
	n   int
	off int
	b   [UDP4HdrLen + 64 + hdrLen + helloLen]byte
}

var _ fabric.Listener = (*Listener)(nil)

// Listen starts a listener on cfg.Interface (in the calling thread's
// network namespace). cfg.PeerMAC and cfg.PeerIP must be unset; with UDP
// framing the listener listens on LocalIP:LocalPort. backlog and
// handshake are the backlog and the handshake timeout (see
// fabric.Options).
func Listen(cfg EndpointConfig, backlog int, handshake time.Duration) (*Listener, error) {
	oerr := func(err error) error {
		return &fabric.OpError{Op: "listen", Backend: "ethernet", Addr: cfg.Interface, Err: err}
	}
	if cfg.PeerMAC != nil || cfg.PeerIP.IsValid() {
		return nil, oerr(fmt.Errorf("a listener takes no peer= or udp=: %w", fabric.ErrInvalid))
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultListenWindow
	}
	li, frameSize, err := prepare(&cfg, true)
	if err != nil {
		return nil, err
	}
	m, err := acquireMux(li, &cfg, frameSize)
	if err != nil {
		return nil, err
	}
	l := &Listener{cfg: cfg, m: m, limit: handshake, hellos: make(chan *helloFrame, 64),
		stop: make(chan struct{}), done: make(chan struct{}),
		byPeer: map[peerKey]*Endpoint{}, pending: map[*Endpoint]bool{}, seen: map[replayKey]struct{}{}}
	if cfg.UDP {
		l.addr = fmt.Sprintf("%s?udp=%s&listener=1", cfg.Interface, netip.AddrPortFrom(cfg.LocalIP, cfg.LocalPort))
	} else {
		l.addr = fmt.Sprintf("%s?peer=%s&listener=1", cfg.Interface, li.MAC)
		if cfg.EtherType != EtherTypeWeft {
			l.addr += fmt.Sprintf("&ethertype=%#x", cfg.EtherType)
		}
	}
	l.q = acceptq.New("ethernet", l.addr, backlog)
	var b [12]byte
	for l.id == 0 || l.nonce == 0 {
		rand.Read(b[:])
		l.id, l.nonce = binary.BigEndian.Uint32(b[:4]), binary.BigEndian.Uint64(b[4:])
	}
	if !m.lis.CompareAndSwap(nil, l) {
		m.release()
		return nil, oerr(fmt.Errorf("queue %d of %s already has a listener in this process: %w", cfg.Queue, cfg.Interface, ErrXDPInUse))
	}
	go l.run()
	return l, nil
}

// Addr implements fabric.Listener: what a peer on the same segment dials,
// with its own interface name in place of this one: IFACE?peer=MAC (or
// IFACE?udp=IP:PORT with UDP framing), with listener=1 so that the
// dialer's hello reaches this listener even while a dialer here names
// that peer too.
func (l *Listener) Addr() string { return l.addr }

// Accept implements fabric.Listener.
func (l *Listener) Accept(ctx context.Context) (fabric.Endpoint, error) { return l.q.Accept(ctx) }

// Stats implements fabric.Listener. Failed includes hellos refused as
// malformed, forged or replayed before they started a handshake.
func (l *Listener) Stats() fabric.ListenerStats {
	s := l.q.Stats()
	s.Failed += l.badHellos.Load()
	return s
}

// DemuxStats are the counters of the shared queue a listener runs on.
type DemuxStats struct {
	// Unknown counts frames for no connection of this process (an
	// unknown connection id, or anything but a hello to id 0).
	Unknown uint64
	// Malformed counts frames with a bad Weft header.
	Malformed uint64
	// NoBuffer counts frames dropped because their connection's inbox
	// was full.
	NoBuffer uint64
	// HellosDropped counts hellos dropped because the listener's queue
	// of new hellos was full (their peers resend them).
	HellosDropped uint64
}

// DemuxStats returns the counters of the listener's shared queue.
func (l *Listener) DemuxStats() DemuxStats {
	u, m, n := l.m.drops()
	return DemuxStats{Unknown: u, Malformed: m, NoBuffer: n, HellosDropped: l.dropped.Load()}
}

// Close implements fabric.Listener: queued connections nobody accepted
// and handshakes in progress are closed; accepted endpoints stay open.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.m.lis.CompareAndSwap(l, nil)
		close(l.stop)
		<-l.done
		l.q.Close()
		l.mu.Lock()
		l.closed = true
		var hs []*Endpoint
		for e := range l.pending {
			hs = append(hs, e)
		}
		clear(l.pending)
		l.mu.Unlock()
		for _, e := range hs {
			e.Close()
		}
		l.m.release()
	})
	return nil
}

// run starts the handshakes of the hellos the shared queue hands over.
func (l *Listener) run() {
	defer close(l.done)
	for {
		select {
		case <-l.stop:
			return
		case h := <-l.hellos:
			l.hello(h)
		}
	}
}

// onHello queues a hello to connection id 0 for run. It runs under the
// mux's locks, which handshakes cannot take.
func (l *Listener) onHello(b []byte, off int) {
	if len(b) > len(helloFrame{}.b) || len(b) < off+hdrLen {
		l.badHellos.Add(1)
		return
	}
	h := &helloFrame{off: off}
	h.n = copy(h.b[:], b)
	select {
	case l.hellos <- h:
	default:
		l.dropped.Add(1)
	}
}

// hello handles one hello to connection id 0: a retransmission for a
// handshake in progress, a new peer, or something to refuse.
func (l *Listener) hello(h *helloFrame) {
	b := h.b[:h.n]
	var m handshakeMsg
	if err := parseHandshake(b[h.off:], &m); err != nil || m.typ != ptHello || m.echo != 0 {
		l.badHellos.Add(1)
		return
	}
	key := peerKey{mac: [6]byte(b[6:12]), session: m.session}
	var u UDP4
	if l.cfg.UDP {
		if _, ok := ParseUDP4(b, &u); !ok {
			l.badHellos.Add(1)
			return
		}
		key.ip, key.port = u.SrcIP.As4(), u.SrcPort
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	if e := l.byPeer[key]; e != nil {
		l.mu.Unlock()
		// The peer resends its hello until it hears from the
		// connection: hand it over.
		l.m.rxMu.Lock()
		e.in.deliver(b)
		l.m.rxMu.Unlock()
		return
	}
	rk := replayKey{m.session, m.nonce}
	if _, dup := l.seen[rk]; dup {
		l.mu.Unlock()
		l.badHellos.Add(1) // errHsReplay
		return
	}
	l.mu.Unlock()
	if !l.q.Reserve() {
		l.refuse(b, &m, &u)
		return
	}
	c := l.cfg
	c.PeerMAC = net.HardwareAddr(b[6:12:12])
	if c.UDP {
		c.PeerIP, c.PeerPort = u.SrcIP, u.SrcPort
	}
	e, err := newEndpoint(c, l)
	if err != nil {
		l.q.Fail()
		return
	}
	e.mu.Lock()
	e.now = clock()
	e.hsDeadline = e.now + int64(l.limit)
	e.peerSession, e.peerNonce = m.session, m.nonce
	e.lastHeard = e.now
	e.sendHelloLocked(ptHelloAck)
	e.sendHelloLocked(ptHello)
	e.nextHello = e.now + int64(helloEvery)
	e.mu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		close(e.done)
		e.Close()
		return
	}
	l.byPeer[key] = e
	l.pending[e] = true
	l.rememberLocked(rk)
	l.mu.Unlock()
	go e.run()
}

func (l *Listener) rememberLocked(k replayKey) {
	if len(l.seenLog) < maxSeen {
		l.seenLog = append(l.seenLog, k)
	} else {
		delete(l.seen, l.seenLog[l.seenPos])
		l.seenLog[l.seenPos] = k
		l.seenPos = (l.seenPos + 1) % maxSeen
	}
	l.seen[k] = struct{}{}
}

// refuse answers a hello that found the backlog full with a refusal that
// echoes its nonce.
func (l *Listener) refuse(b []byte, m *handshakeMsg, u *UDP4) {
	f := l.refusal[:]
	off := EthHdrLen
	if l.cfg.UDP {
		off = UDP4HdrLen
		PutUDP4(f, &UDP4{SrcMAC: l.m.link.MAC, DstMAC: u.SrcMAC, SrcIP: l.cfg.LocalIP, DstIP: u.SrcIP,
			SrcPort: l.cfg.LocalPort, DstPort: u.SrcPort}, hdrLen+helloLen)
	} else {
		PutEthernet(f, b[6:12], l.m.link.MAC, l.cfg.EtherType)
	}
	putHdr(f[off:], &hdr{typ: ptRefuse, session: l.id, dst: m.session})
	putHello(f[off+hdrLen:], l.nonce, m.nonce)
	l.m.transmitFrame(f[:off+hdrLen+helloLen])
}

// established queues a connection whose handshake completed.
func (l *Listener) established(e *Endpoint) {
	l.mu.Lock()
	delete(l.pending, e)
	l.mu.Unlock()
	l.q.Offer(e) // closes e if the listener closed
}

// abandon gives up a connection whose handshake failed or timed out.
func (l *Listener) abandon(e *Endpoint) {
	l.mu.Lock()
	_, ok := l.pending[e]
	delete(l.pending, e)
	l.mu.Unlock()
	if ok {
		l.q.Fail()
	}
	e.Close()
}

// forget removes a closed connection.
func (l *Listener) forget(e *Endpoint) {
	l.mu.Lock()
	for k, v := range l.byPeer {
		if v == e {
			delete(l.byPeer, k)
			break
		}
	}
	l.mu.Unlock()
}
