// Package rdm is Weft's multi-peer reliable endpoint: one object that
// sends to and receives from any number of peers, with the connections
// hidden, in the manner of libfabric's FI_EP_RDM (over ofi_rxm) and of a
// UCX worker with its endpoints.
//
// # Model
//
// An Endpoint listens at an address of a backend (fabric.Listen) and is
// known to its peers by a name, by default that listener's address. Peers
// go into an address vector: Insert takes a peer's name and returns a Peer
// handle, as fi_av_insert does; Remove takes it out. Send names the peer
// and Recv reports which peer each message came from (fi_cq_readfrom). A
// peer that connects first is inserted on its own, and its handle is
// reported with the messages it sends, so a server can answer peers it
// never inserted.
//
// Connections are made on first use, or at Insert with Config.Eager. A
// connection is a reliable fabric.Endpoint of the backend, dialled with
// fabric.Open to the address that Config.Resolve gives for the peer's
// name (the name itself by default), and opened by a hello message that
// carries the dialer's name. Each side sends to a peer over one
// connection, the first one that came up between the two; if both dialled
// at once, each side's messages still travel over one connection only.
//
// # Semantics
//
//   - Reliability and order: messages to one peer are delivered exactly
//     once and in the order they were sent, as on the backend's reliable
//     endpoints. There is no order between peers.
//   - Receive memory: Recv scatters messages straight into the caller's
//     buffers, one pool that serves every peer; the endpoint keeps no
//     receive buffers of its own. Each connection keeps the receive queue
//     of its backend (sized by Options.QueueDepth and Options.MaxMsgSize),
//     which is what grows with the number of peers.
//   - Fairness: Recv takes at most Config.Quantum messages from one
//     connection before it moves to the next, and starts each call one
//     connection further on.
//   - Backpressure is per peer: Send returns n < len(msgs) when that peer's
//     connection is full, or while it is still being made (0 messages);
//     SendWait waits. A slow peer never blocks sends to the others.
//   - Failure is per peer: a peer whose connection fails (its process
//     died, the link went down, it refused us) is reported once on Events
//     as fabric.EventPeerGone with its handle, its messages already
//     received stay readable, and sends to it fail with an error matching
//     fabric.ErrPeerGone. Traffic with the other peers goes on. Inserting
//     the name again gives a new handle and a new connection.
//   - Close says goodbye: each backend tells the peer of every connection
//     that it closed (roce: a DREQ, rdma_disconnect's message, also on
//     connections made by the exchange; ntb: the closed state in the
//     bridge's scratchpad; ethernet: a FIN), so peers report the endpoint
//     gone within 100 ms of Close returning, with an error matching
//     fabric.ErrPeerClosed (and fabric.ErrPeerGone). A peer that crashes
//     or falls silent says nothing, and is found by its backend's
//     liveness instead, with default parameters: roce, the keep-alive
//     (100 ms) and then the RC retries (timeout 12, retry 7: about 3.3 s
//     in all); ntb, within the 2 ms link poll for a bridge file (the dead
//     process's file lock goes) and after dead= (1 s) of heartbeat
//     silence over a PCI BAR;
//     ethernet, after timeout= (5 s) of silence. Such a loss matches
//     fabric.ErrPeerGone and never ErrPeerClosed. A goodbye travels
//     once: if it is lost, the liveness bound applies.
//
// Memory beyond the backend's connections is a few hundred bytes per peer.
package rdm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/spin"
)

// Config configures an Endpoint. The zero value selects every default.
type Config struct {
	// Options configure the connections, dialled and accepted, and the
	// listener (Backlog, HandshakeTimeout). Spin is also the busy-poll
	// budget of RecvWait and SendWait.
	Options fabric.Options
	// Name is how this endpoint introduces itself to the peers it dials,
	// and the name they Insert to reach it (default: the listener's
	// address). An endpoint without a listener and without a name can
	// send to peers, and they can answer it over the same connection, but
	// nobody can dial it.
	Name string
	// Listen are further addresses to listen at, besides the one Open
	// takes: a backend whose connections join two hosts only (one NTB
	// bridge per pair) needs one per peer.
	Listen []string
	// Resolve returns the address to dial for a peer's name (default: the
	// name itself).
	Resolve func(name string) (string, error)
	// Eager connects to a peer at Insert instead of at the first Send.
	Eager bool
	// Quantum is the most messages Recv takes from one connection before
	// it serves the next (0: 16).
	Quantum int
	// DialTimeout bounds one connection attempt (0: 10 s).
	DialTimeout time.Duration
	// Events is the capacity of the Events channel (0: 256).
	Events int
}

// Peer is a handle of the address vector. The zero Peer is no peer.
type Peer uint32

// PeerNone is the zero Peer, reported for messages whose connection has
// no peer any more.
const PeerNone Peer = 0

// Event is a peer event.
type Event struct {
	// Kind is fabric.EventPeerGone: the peer failed or left.
	Kind fabric.EventKind
	// Peer is the peer concerned.
	Peer Peer
	// Name is its name.
	Name string
	// Err is the cause.
	Err  error
	Time time.Time
}

// Stats are an endpoint's counters.
type Stats struct {
	// Peers and Conns are the live peers and connections.
	Peers, Conns int
	// Accepted and Dialed count connections made.
	Accepted, Dialed uint64
	// BadHellos counts accepted connections dropped because their hello
	// was malformed or never came.
	BadHellos uint64
	// PeersGone counts peers reported gone.
	PeersGone uint64
	// EventsDropped counts events that found the Events channel full.
	EventsDropped uint64
}

// Endpoint is a multi-peer reliable endpoint. Its methods are safe for
// concurrent use.
type Endpoint struct {
	backend string
	cfg     Config
	name    string
	quantum int
	spin    time.Duration

	listeners []fabric.Listener
	av        addressVector
	rx        atomic.Pointer[[]*conn] // connections Recv polls, copy on write
	rxMu      sync.Mutex              // Recv's cursor
	cursor    int
	// set is RecvWait's one wake-up for every connection whose backend
	// supports it (fabric.Waitable); while any connection's does not
	// (unwaitable > 0), RecvWait sleeps in steps instead.
	set        *fabric.WaitSet
	unwaitable atomic.Int32

	evs                       chan Event
	accepted, dialed, badHelo atomic.Uint64
	gone, evDrops             atomic.Uint64

	closed atomic.Bool
	base   context.Context // ends at Close: bounds dials and hellos
	cancel context.CancelFunc
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// Open starts a multi-peer endpoint of the backend that listens at
// listen (and at cfg.Listen). With listen empty and no cfg.Listen it only
// dials. cfg may be nil.
func Open(ctx context.Context, backend, listen string, cfg *Config) (*Endpoint, error) {
	e := &Endpoint{backend: backend, stop: make(chan struct{})}
	e.base, e.cancel = context.WithCancel(context.Background())
	if cfg != nil {
		e.cfg = *cfg
	}
	e.quantum = e.cfg.Quantum
	if e.quantum <= 0 {
		e.quantum = 16
	}
	if e.cfg.DialTimeout <= 0 {
		e.cfg.DialTimeout = 10 * time.Second
	}
	if e.cfg.Events <= 0 {
		e.cfg.Events = 256
	}
	e.spin = e.cfg.Options.SpinBudget()
	e.evs = make(chan Event, e.cfg.Events)
	e.av.init()
	e.rx.Store(new([]*conn))
	e.set, _ = fabric.NewWaitSet() // nil: RecvWait sleeps in steps
	addrs := e.cfg.Listen
	if listen != "" {
		addrs = append([]string{listen}, addrs...)
	}
	for _, a := range addrs {
		l, err := fabric.Listen(ctx, backend, a, &e.cfg.Options)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.listeners = append(e.listeners, l)
		e.wg.Add(1)
		go e.acceptLoop(l)
	}
	e.name = e.cfg.Name
	if e.name == "" && len(e.listeners) > 0 {
		e.name = e.listeners[0].Addr()
	}
	if len(e.name) > maxName {
		e.Close()
		return nil, e.opErr("open", fmt.Errorf("name of %d bytes, at most %d: %w", len(e.name), maxName, fabric.ErrInvalid))
	}
	return e, nil
}

// Name returns the name peers Insert to reach this endpoint.
func (e *Endpoint) Name() string { return e.name }

// Addrs returns the addresses the endpoint listens at.
func (e *Endpoint) Addrs() []string {
	out := make([]string, len(e.listeners))
	for i, l := range e.listeners {
		out[i] = l.Addr()
	}
	return out
}

// Events returns the channel of peer events.
func (e *Endpoint) Events() <-chan Event { return e.evs }

// Stats returns a snapshot of the counters.
func (e *Endpoint) Stats() Stats {
	peers := e.av.live()
	return Stats{Peers: peers, Conns: len(*e.rx.Load()), Accepted: e.accepted.Load(), Dialed: e.dialed.Load(),
		BadHellos: e.badHelo.Load(), PeersGone: e.gone.Load(), EventsDropped: e.evDrops.Load()}
}

func (e *Endpoint) opErr(op string, err error) error {
	return &fabric.OpError{Op: op, Backend: e.backend, Addr: e.name, Err: err}
}

// Close closes the listeners and every connection. It is idempotent.
func (e *Endpoint) Close() error {
	e.once.Do(func() {
		e.closed.Store(true)
		close(e.stop)
		e.cancel()
		for _, l := range e.listeners {
			l.Close()
		}
		for _, p := range e.av.all() {
			p.fail(errClosed)
		}
		e.wg.Wait()
		// Connections close in parallel: a backend's Close may linger to
		// deliver what was sent.
		var cwg sync.WaitGroup
		for _, c := range *e.rx.Load() {
			cwg.Add(1)
			go func() { defer cwg.Done(); c.ep.Close() }()
		}
		cwg.Wait()
		if e.set != nil {
			e.set.Close()
		}
	})
	return nil
}

var errClosed = fmt.Errorf("rdm endpoint closed: %w", fabric.ErrClosed)

// emit reports an event without blocking.
func (e *Endpoint) emit(ev Event) {
	select {
	case e.evs <- ev:
	default:
		e.evDrops.Add(1)
	}
}

// addConn makes c one of the connections Recv polls.
func (e *Endpoint) addConn(c *conn) {
	e.rxMu.Lock()
	defer e.rxMu.Unlock()
	old := *e.rx.Load()
	next := make([]*conn, len(old), len(old)+1)
	copy(next, old)
	next = append(next, c)
	e.rx.Store(&next)
	if w, ok := c.ep.(fabric.Waitable); ok && e.set != nil {
		e.set.Add(w) // wakes a RecvWait, to look at c too
	} else {
		e.unwaitable.Add(1)
		if e.set != nil {
			e.set.Wake() // a RecvWait moves to sleeping in steps
		}
	}
}

// dropConn removes a drained connection of a gone peer from the ones
// Recv polls and closes it in the background, once: a Recv that took the
// list before the drop finds the connection failing again on its next
// pass, and a second drop would count it out of unwaitable twice, until
// RecvWait parked in the set while connections no set can watch were
// left (TestDropOnce).
func (e *Endpoint) dropConn(c *conn) {
	e.rxMu.Lock()
	old := *e.rx.Load()
	if !slices.Contains(old, c) {
		e.rxMu.Unlock()
		return // dropped already
	}
	next := make([]*conn, 0, len(old))
	for _, d := range old {
		if d != c {
			next = append(next, d)
		}
	}
	e.rx.Store(&next)
	e.rxMu.Unlock()
	if w, ok := c.ep.(fabric.Waitable); ok && e.set != nil {
		e.set.Remove(w)
	} else {
		e.unwaitable.Add(-1)
	}
	go c.ep.Close()
}

// Recv stores up to len(msgs) messages from any peers into the messages'
// SGEs, as fabric.Endpoint.Recv does, and the sender of msgs[i] into
// from[i]; from may be nil, and otherwise needs len(msgs) entries. It
// never blocks.
func (e *Endpoint) Recv(msgs []fabric.Message, from []Peer) (int, error) {
	if e.closed.Load() {
		return 0, e.opErr("recv", fabric.ErrClosed)
	}
	if from != nil && len(from) < len(msgs) {
		return 0, e.opErr("recv", fmt.Errorf("%d peer slots for %d messages: %w", len(from), len(msgs), fabric.ErrInvalid))
	}
	conns := *e.rx.Load()
	if len(conns) == 0 || len(msgs) == 0 {
		return 0, nil
	}
	e.rxMu.Lock()
	start := e.cursor % len(conns)
	e.cursor = start + 1
	e.rxMu.Unlock()
	got := 0
	for {
		progress := false
		for i := range conns {
			if got == len(msgs) {
				return got, nil
			}
			c := conns[(start+i)%len(conns)]
			k := min(e.quantum, len(msgs)-got)
			n, err := c.ep.Recv(msgs[got : got+k])
			if from != nil {
				id := c.peer.id
				for j := got; j < got+n; j++ {
					from[j] = id
				}
			}
			got += n
			progress = progress || n > 0
			if n < k && (err != nil || c.gone.Load()) {
				// Drained (or failing): a gone peer's connection goes.
				c.peer.fail(err)
				if c.gone.Swap(false) || err != nil {
					e.dropConn(c)
				}
			}
		}
		if !progress {
			return got, nil
		}
	}
}

// RecvWait is Recv that waits until at least one message has arrived or
// ctx is done. It spins for Options.Spin, then parks on one wake-up for
// every connection (a fabric.WaitSet), so an idle endpoint costs one
// parked goroutine however many peers it has. Where a connection's
// backend has no wake-up a set can watch, it sleeps in steps that grow
// from 20 µs to 1 ms instead.
func (e *Endpoint) RecvWait(ctx context.Context, msgs []fabric.Message, from []Peer) (int, error) {
	if n, err := e.Recv(msgs, from); n > 0 || err != nil || len(msgs) == 0 {
		return n, err
	}
	for s := spin.Start(e.spin); s.Next(ctx); {
		if n, err := e.Recv(msgs, from); n > 0 || err != nil {
			return n, err
		}
	}
	var w spin.Waiter // no spin left: it only sleeps
	for {
		var err error
		if e.set != nil && e.unwaitable.Load() == 0 {
			err = e.set.Wait(ctx)
		} else {
			err = w.Wait(ctx)
		}
		if e.closed.Load() {
			return 0, e.opErr("recv", fabric.ErrClosed)
		}
		if err != nil {
			return 0, e.opErr("recv", err)
		}
		if n, err := e.Recv(msgs, from); n > 0 || err != nil {
			return n, err
		}
	}
}

// Send posts messages to peer p over its connection, as
// fabric.Endpoint.Send does. While the connection is being made it
// returns 0 (and starts making it, if nobody has).
func (e *Endpoint) Send(p Peer, msgs []fabric.Message) (int, error) {
	pe, err := e.peer(p, "send")
	if err != nil {
		return 0, err
	}
	c := pe.tx.Load()
	if c == nil {
		if err := pe.err(); err != nil {
			return 0, e.opErr("send", err)
		}
		e.connect(pe)
		return 0, nil
	}
	n, err := c.ep.Send(msgs)
	return n, e.sendErr(pe, c, err)
}

// sendErr turns a connection's send error into the peer's: a connection
// that failed fails its peer, and one that the peer's failure closed
// reports that failure.
func (e *Endpoint) sendErr(pe *peer, c *conn, err error) error {
	switch {
	case err == nil:
		return nil
	case c.gone.Load() || pe.isGone():
		return e.opErr("send", pe.err())
	case errors.Is(err, fabric.ErrPeerGone):
		pe.fail(err)
		return e.opErr("send", pe.err())
	}
	return err
}

// SendWait is Send that waits until it has posted at least one message,
// ctx is done or the peer fails.
func (e *Endpoint) SendWait(ctx context.Context, p Peer, msgs []fabric.Message) (int, error) {
	pe, err := e.peer(p, "send")
	if err != nil {
		return 0, err
	}
	c := pe.tx.Load()
	if c == nil {
		e.connect(pe)
		select {
		case <-pe.ready:
		case <-ctx.Done():
			return 0, e.opErr("send", ctx.Err())
		}
		if c = pe.tx.Load(); c == nil {
			return 0, e.opErr("send", pe.err())
		}
	}
	n, err := c.ep.SendWait(ctx, msgs)
	return n, e.sendErr(pe, c, err)
}

// Connect makes the connection to p now and waits until it is up, ctx is
// done or it fails.
func (e *Endpoint) Connect(ctx context.Context, p Peer) error {
	pe, err := e.peer(p, "connect")
	if err != nil {
		return err
	}
	e.connect(pe)
	select {
	case <-pe.ready:
	case <-ctx.Done():
		return e.opErr("connect", ctx.Err())
	}
	if pe.tx.Load() == nil {
		return e.opErr("connect", pe.err())
	}
	return nil
}

// Register describes buf as memory for the SGEs of Send and Recv to any
// peer: a host-memory region (fabric.NewHostRegion), which every
// connection of a backend that copies with the CPU accepts. access may
// include fabric.AccessLocalWrite (receive buffers); nothing else.
func (e *Endpoint) Register(buf []byte, access fabric.Access) (*fabric.Region, error) {
	if access&^fabric.AccessLocalWrite != 0 {
		return nil, e.opErr("register", fmt.Errorf("%v: remote access goes through a peer's connection (Endpoint): %w", access, fabric.ErrNotSupported))
	}
	return fabric.NewHostRegion(buf, access), nil
}

// Alloc returns size bytes of memory for Send and Recv to any peer, like
// Register, writable by receives.
func (e *Endpoint) Alloc(size int) (*fabric.Region, error) {
	if size <= 0 {
		return nil, e.opErr("alloc", fabric.ErrInvalid)
	}
	return fabric.NewHostRegion(make([]byte, size), fabric.AccessLocalWrite), nil
}

// Endpoint returns the connection that carries messages to p, for what
// the multi-peer API does not cover (RMA, registration, views), or nil
// while there is none.
func (e *Endpoint) Endpoint(p Peer) fabric.Endpoint {
	pe, err := e.peer(p, "endpoint")
	if err != nil {
		return nil
	}
	if c := pe.tx.Load(); c != nil {
		return c.ep
	}
	return nil
}
