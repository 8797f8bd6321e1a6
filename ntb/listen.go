package ntb

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/acceptq"
)

// A bridge has one peer, so a listener on a bridge accepts one endpoint
// per transport queue: one bridge then carries several independent
// endpoints, for example one per core. The listener brings the bridge up
// with maxQueues queues and waits on each for a connect request, the
// first message a dialer sends on a queue it has picked:
//
//	connect: "WEFTNTBC" nonce[8]
//	answer:  "WEFTNTBA" nonce[8]   accepted
//	         "WEFTNTBR" nonce[8]   refused (backlog full)
//
// The nonce ties the answer to the request, so a stale answer left on a
// queue by an earlier dialer is not taken for the current one. Dialers in
// one process share their side of the bridge and take free queues in
// turn; the address parameter listener=1 selects this (Listener.Addr
// includes it), queue=N picks a queue.
//
// A queue serves one connection per session of the bridge. An accepted
// or dialled endpoint lives for the session it was connected in: when
// the session ends (the dialers' side closes its bridge once its last
// endpoint is closed, or a side dies) it stays detached for good, and the
// next session starts every such queue with a fresh endpoint, on which
// the listener listens again and which a dialer may take again. Within a
// session, a queue serves again once both its endpoints (the accepted one
// and the dialled one) are closed: each side's Close tells the other
// (ctrlFin in the control page), and each side clears its receive ring of
// the queue and says so (ctrlRdy) before the queue's next endpoint sends
// (Transport.reclaim, which the listener runs at each poll and a dialer
// before it picks a queue). A dialer takes the lowest free queue; one
// whose accepted endpoint is still open is not free.
//
// Anything on a queue that is not a connect message (what an endpoint of
// an earlier connection sent, a hostile peer's bytes) is counted and
// skipped, by the listener (Stats' failed handshakes) and by a dialer
// waiting for its answer (the endpoint's DropMalformed).

const (
	connMsgLen = 16
	connMagic  = "WEFTNTB"
	connReq    = 'C'
	connAcc    = 'A'
	connRef    = 'R'
	// listenPoll is how often the listener looks for connect requests
	// after one came; it backs off to listenSlow while none does.
	listenPoll = time.Millisecond
	listenSlow = 16 * time.Millisecond
)

// sharedBridge is one side of a bridge shared by the endpoints of a
// listener or by a process's dialers: the transport stays open until the
// last user lets go.
type sharedBridge struct {
	path  string
	t     *Transport
	ready chan struct{} // dialers: closed once t is open, or failed to
	err   error         // why it failed
	// closing (under the dialers lock) marks a dialers' bridge whose
	// last user let go: it stays in dialers.m until its transport is
	// closed (gone), so that a new dialer waits for that rather than
	// opening the side of the bridge still held.
	closing bool
	gone    chan struct{}
	mu      sync.Mutex
	refs    int
	// given is the endpoint handed out (or being connected) on each
	// queue: the queue is free again once the transport replaced it
	// (Transport.reset).
	given [maxQueues]*Endpoint
}

func (b *sharedBridge) acquire() { b.mu.Lock(); b.refs++; b.mu.Unlock() }

// release drops one reference, closing the transport with the last one.
func (b *sharedBridge) release() {
	dialers.Lock() // before b.mu, as dialListener takes them
	b.mu.Lock()
	b.refs--
	last := b.refs == 0
	b.mu.Unlock()
	mine := last && dialers.m[b.path] == b
	if mine {
		b.closing = true
	}
	dialers.Unlock()
	if mine && testHooks.closing != nil {
		testHooks.closing()
	}
	if last && b.t != nil {
		b.t.Close()
	}
	if mine {
		dialers.Lock()
		delete(dialers.m, b.path)
		dialers.Unlock()
		close(b.gone)
	}
}

// testHooks let tests stop a dialers' bridge in the middle of closing
// (closing runs after its last user let go, before its transport is
// closed) and see a dialer wait for it (waiting). Nil outside tests.
var testHooks struct{ closing, waiting func() }

// dialers are the bridges this process dials listeners over, by path.
var dialers struct {
	sync.Mutex
	m map[string]*sharedBridge
}

// openBridge opens this side of the bridge at path with a transport of
// (by default) the most queues it allows. With wait it waits for the peer
// (a dialer); without, the transport comes up whenever the peer appears
// (a listener).
func openBridge(ctx context.Context, path string, sc ShmConfig, tc Config, wait bool) (*Transport, error) {
	if tc.Queues == 0 {
		tc.Queues = maxQueues
	}
	if sc.MemSize == 0 {
		sc.MemSize = max(16<<20, (tc.Queues+2)*max(tc.RingSize, 1<<20))
	}
	dev, err := OpenShm(path, sc)
	if err != nil {
		return nil, &fabric.OpError{Op: "open", Backend: "ntb", Addr: path, Err: err}
	}
	t, err := newTransport(dev, tc)
	if err == nil && wait {
		if err = t.waitUp(ctx); err != nil {
			t.shutdown(false)
		}
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	return t, nil
}

func connMsg(kind byte, nonce uint64) [connMsgLen]byte {
	var m [connMsgLen]byte
	copy(m[:], connMagic)
	m[7] = kind
	binary.LittleEndian.PutUint64(m[8:], nonce)
	return m
}

// parseConnMsg returns the kind and nonce of a connect message.
func parseConnMsg(b []byte) (byte, uint64, error) {
	if len(b) != connMsgLen || string(b[:7]) != connMagic {
		return 0, 0, fmt.Errorf("ntb: connect message of %d bytes: %w", len(b), fabric.ErrMalformed)
	}
	switch b[7] {
	case connReq, connAcc, connRef:
	default:
		return 0, 0, fmt.Errorf("ntb: connect message kind %q: %w", b[7], fabric.ErrMalformed)
	}
	return b[7], binary.LittleEndian.Uint64(b[8:]), nil
}

// connIO sends and receives connect messages on one queue.
type connIO struct {
	ep   *Endpoint
	sbuf *fabric.Region
	rbuf *fabric.Region
	msg  [1]fabric.Message
	sge  [1]fabric.SGE // the listener polls every millisecond: no allocation per poll
}

func newConnIO(ep *Endpoint) (*connIO, error) {
	s, err := ep.Register(make([]byte, connMsgLen), 0)
	if err != nil {
		return nil, err
	}
	r, err := ep.Register(make([]byte, connMsgLen+1), fabric.AccessLocalWrite)
	if err != nil {
		s.Close()
		return nil, err
	}
	return &connIO{ep: ep, sbuf: s, rbuf: r}, nil
}

func (c *connIO) close() { c.sbuf.Close(); c.rbuf.Close() }

func (c *connIO) send(ctx context.Context, m [connMsgLen]byte) error {
	copy(c.sbuf.Bytes(), m[:])
	c.sge[0] = fabric.SGEOf(c.sbuf)
	c.msg[0] = fabric.Message{SGEs: c.sge[:]}
	_, err := c.ep.SendWait(ctx, c.msg[:])
	return err
}

// poll returns a received message (nil if none arrived).
func (c *connIO) poll() ([]byte, error) {
	c.sge[0] = fabric.SGEOf(c.rbuf)
	c.msg[0] = fabric.Message{SGEs: c.sge[:]}
	n, err := c.ep.Recv(c.msg[:])
	if n == 0 || err != nil {
		return nil, err
	}
	return c.rbuf.Bytes()[:c.msg[0].Len], nil
}

// Listener is a fabric.Listener on one side of a bridge: it accepts one
// endpoint per transport queue (see Listen).
type Listener struct {
	b    *sharedBridge
	addr string
	q    *acceptq.Queue
	io   []*connIO   // per queue; nil once accepted
	acc  []*Endpoint // per queue, the endpoint accepted on it
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

var _ fabric.Listener = (*Listener)(nil)

// Listen implements fabric.ListenDriver: it opens the bridge at addr with
// (by default) the most queues it allows and accepts one endpoint per
// queue that a peer connects on.
func (driver) Listen(ctx context.Context, addr string, o fabric.Options) (fabric.Listener, error) {
	a, err := parseAddr(addr)
	if err == nil && a.kind != "" {
		err = fmt.Errorf("a listener over a %s: bridge: %w", a.kind, fabric.ErrNotSupported)
	}
	if err != nil {
		return nil, &fabric.OpError{Op: "listen", Backend: "ntb", Addr: addr, Err: err}
	}
	path, sc, tc := a.path, a.sc, a.tc
	applyOptions(&tc, o)
	t, err := openBridge(ctx, path, sc, tc, false)
	if err != nil {
		return nil, err
	}
	l := &Listener{b: &sharedBridge{path: path, t: t, refs: 1}, stop: make(chan struct{}), done: make(chan struct{})}
	eps := t.endpoints()
	q := url.Values{"listener": {"1"}, "queues": {strconv.Itoa(len(eps))}}
	l.addr = path + "?" + q.Encode()
	l.q = acceptq.New("ntb", l.addr, o.BacklogSize())
	l.acc = make([]*Endpoint, len(eps))
	for _, ep := range eps {
		c, err := newConnIO(ep)
		if err != nil {
			for _, c := range l.io {
				c.close()
			}
			t.Close()
			return nil, err
		}
		l.io = append(l.io, c)
	}
	go l.run()
	return l, nil
}

func (l *Listener) run() {
	defer close(l.done)
	p := pollPeriod{fast: listenPoll, slow: listenSlow}
	tick := time.NewTimer(p.next(true))
	defer tick.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Close ends an answer the peer holds up (its ring full, or a
	// reclaimed queue it never says it reset: ctrlRdy).
	go func() {
		select {
		case <-l.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		came := false
		l.b.t.reclaim()
		eps := l.b.t.endpoints()
		for i := range l.io {
			if c := l.io[i]; c != nil && c.ep.peerFin() {
				// The peer closed its end of this queue before it
				// connected (a dial that gave up): close ours, so
				// that reclaim gives the queue a fresh endpoint.
				c.close()
				c.ep.close()
				l.io[i] = nil
			}
			l.rearm(i, eps[i])
			if c := l.io[i]; c != nil && l.b.t.Up() {
				came = l.serve(ctx, i, c) || came
			}
		}
		tick.Reset(p.next(came))
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
	}
}

// rearm listens on queue i again once a new session gave it a fresh
// endpoint cur in place of the one accepted on it.
func (l *Listener) rearm(i int, cur *Endpoint) {
	if c := l.io[i]; (c != nil && c.ep == cur) || cur == l.acc[i] || cur.closed.Load() {
		return
	}
	if l.io[i] != nil {
		l.io[i].close()
		l.io[i] = nil
	}
	c, err := newConnIO(cur)
	if err != nil {
		return // tried again at the next poll
	}
	l.io[i] = c
}

// serve answers a connect request on queue i, if one came, and reports
// whether one did.
func (l *Listener) serve(ctx context.Context, i int, c *connIO) bool {
	b, err := c.poll()
	if b == nil || err != nil {
		return false
	}
	kind, nonce, err := parseConnMsg(b)
	if err != nil || kind != connReq {
		l.q.Malformed() // counted; the queue keeps listening
		return true
	}
	if !l.q.Reserve() {
		c.send(ctx, connMsg(connRef, nonce))
		return true
	}
	ep := c.ep
	ep.conn.Store(true) // before the answer: the connection ends with this session
	if err := c.send(ctx, connMsg(connAcc, nonce)); err != nil {
		l.q.Fail()
		return true
	}
	c.close()
	l.io[i], l.acc[i] = nil, ep
	l.b.acquire()
	ep.addr, ep.release = l.b.path, l.b.release
	l.q.Offer(ep)
	return true
}

// Accept implements fabric.Listener.
func (l *Listener) Accept(ctx context.Context) (fabric.Endpoint, error) { return l.q.Accept(ctx) }

// Addr implements fabric.Listener: the bridge's path with listener=1 and
// the queue count, which fabric.Open dials.
func (l *Listener) Addr() string { return l.addr }

// Stats implements fabric.Listener. Malformed connect requests count as
// failed handshakes.
func (l *Listener) Stats() fabric.ListenerStats { return l.q.Stats() }

// Close implements fabric.Listener: the bridge stays up until the
// endpoints already accepted are closed.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		l.q.Close()
		for _, c := range l.io {
			if c != nil {
				c.close()
			}
		}
		l.b.release()
	})
	return nil
}

// dialListener connects to a listener across the bridge at path: it
// shares this process's side of the bridge with its other dialers, takes
// a free queue (or the one asked for) and exchanges connect messages on
// it.
func dialListener(ctx context.Context, addr, path string, sc ShmConfig, tc Config, queue int) (*Endpoint, error) {
	opErr := func(err error) error { return &fabric.OpError{Op: "open", Backend: "ntb", Addr: addr, Err: err} }
	dialers.Lock()
	if dialers.m == nil {
		dialers.m = map[string]*sharedBridge{}
	}
	b := dialers.m[path]
	for b != nil && b.closing {
		// The last endpoint over this bridge was just closed: wait
		// until its transport has let go of our side of the bridge.
		gone := b.gone
		dialers.Unlock()
		if testHooks.waiting != nil {
			testHooks.waiting()
		}
		select {
		case <-gone:
		case <-ctx.Done():
			return nil, opErr(ctx.Err())
		}
		dialers.Lock()
		b = dialers.m[path]
	}
	if b == nil {
		// The first dialer opens the bridge, outside the lock: a peer
		// that never comes holds up only the dialers of its bridge.
		b = &sharedBridge{path: path, ready: make(chan struct{}), gone: make(chan struct{})}
		dialers.m[path] = b
		b.refs++
		dialers.Unlock()
		b.t, b.err = openBridge(ctx, path, sc, tc, true)
		if b.err != nil {
			dialers.Lock()
			delete(dialers.m, path)
			dialers.Unlock()
		}
		close(b.ready)
	} else {
		b.acquire()
		dialers.Unlock()
	}
	select {
	case <-b.ready:
	case <-ctx.Done():
		b.release()
		return nil, opErr(ctx.Err())
	}
	if b.err != nil {
		return nil, b.err
	}

	// The queues are those the session negotiated: the listener's side
	// may have fewer than ours, and a queue past its count carries
	// nothing.
	n := b.t.Queues()
	b.t.reclaim()
	eps := b.t.endpoints()
	free := func(i int) bool { return eps[i] != b.given[i] && !eps[i].closed.Load() }
	b.mu.Lock()
	if queue < 0 {
		for i := 0; i < n; i++ {
			if free(i) {
				queue = i
				break
			}
		}
	}
	if queue < 0 || queue >= n || !free(queue) {
		b.mu.Unlock()
		b.release()
		return nil, opErr(fmt.Errorf("no free queue %d on the bridge (%d queues): %w", queue, n, fabric.ErrRefused))
	}
	ep := eps[queue]
	b.given[queue] = ep
	ep.conn.Store(true) // the connection ends with this session
	b.mu.Unlock()

	fail := func(err error) (*Endpoint, error) {
		ep.close()
		b.release()
		return nil, opErr(err)
	}
	c, err := newConnIO(ep)
	if err != nil {
		return fail(err)
	}
	defer c.close()
	var nb [8]byte
	rand.Read(nb[:])
	nonce := binary.LittleEndian.Uint64(nb[:])
	if err := c.send(ctx, connMsg(connReq, nonce)); err != nil {
		return fail(err)
	}
	for {
		if err := ctx.Err(); err != nil { // a peer flooding the queue does not hold us past ctx
			return fail(fmt.Errorf("no answer from a listener on queue %d: %w", queue, err))
		}
		m, err := c.poll()
		if err != nil {
			return fail(err)
		}
		if m != nil {
			kind, got, err := parseConnMsg(m)
			switch {
			case err != nil:
				// Not a connect message: what an endpoint of an earlier
				// connection on this queue sent. Counted and skipped,
				// as the listener does.
				ep.ctr.Drop(fabric.DropMalformed, 1)
				continue
			case got != nonce:
				continue // an answer to an earlier dialer of this queue
			case kind == connRef:
				return fail(&fabric.RefusedError{Addr: "queue " + strconv.Itoa(queue), Reason: "backlog full"})
			case kind != connAcc:
				return fail(fmt.Errorf("queue %d: answer %q: %w", queue, kind, fabric.ErrMalformed))
			}
			ep.addr, ep.release = addr, b.release
			return ep, nil
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("no answer from a listener on queue %d: %w", queue, ctx.Err()))
		case <-time.After(100 * time.Microsecond):
		}
	}
}
