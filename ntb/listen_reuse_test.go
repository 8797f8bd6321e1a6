package ntb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
)

// connectPair dials the listener l and accepts the endpoint, then checks
// that a message goes each way.
func connectPair(t *testing.T, ctx context.Context, l fabric.Listener, round int) (d, a *Endpoint) {
	t.Helper()
	de, err := fabric.Open(ctx, "ntb", l.Addr(), nil)
	if err != nil {
		t.Fatalf("dial %d: %v", round, err)
	}
	ae, err := l.Accept(ctx)
	if err != nil {
		de.Close()
		t.Fatalf("accept %d: %v", round, err)
	}
	d, a = de.(*Endpoint), ae.(*Endpoint)
	if d.q != a.q {
		t.Fatalf("round %d: dialled queue %d, accepted queue %d", round, d.q, a.q)
	}
	ping := fmt.Sprintf("ping %d", round)
	sendRaw(t, ctx, d, []byte(ping))
	if got := recvRaw(t, ctx, a, "the dialer's message"); string(got) != ping {
		t.Fatalf("round %d: the accepted endpoint got %q, want %q", round, got, ping)
	}
	pong := fmt.Sprintf("pong %d", round)
	sendRaw(t, ctx, a, []byte(pong))
	if got := recvRaw(t, ctx, d, "the listener's message"); string(got) != pong {
		t.Fatalf("round %d: the dialer got %q, want %q", round, got, pong)
	}
	return d, a
}

// listenFresh listens on a new bridge for one test, within a context of
// 20 s; the listener closes, and the context ends, when the test does.
func listenFresh(t *testing.T) (context.Context, fabric.Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	l, err := driver{}.Listen(ctx, path, fabric.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return ctx, l, path
}

// TestListenerQueueReuseNewSession: with nothing else open, closing a
// dialled endpoint closes the dialers' side of the bridge, and the next
// dial opens it again in a new session: the listener must listen on the
// queue again (it used to serve each queue once: the second dial waited
// for an answer on queue 0 until its context ended).
func TestListenerQueueReuseNewSession(t *testing.T) {
	ctx, l, _ := listenFresh(t)
	for i := range 20 {
		d, a := connectPair(t, ctx, l, i)
		d.Close()
		a.Close()
	}
	if s := l.Stats(); s.Accepted != 20 || s.Failed != 0 {
		t.Fatalf("listener stats %+v, want 20 accepted, none failed", s)
	}
}

// TestListenerQueueReuseSameSession: with one connection kept open (it
// keeps the dialers' side of the bridge open, so the session goes on),
// 20 dial/accept/close cycles on an 8-queue bridge must each find a queue
// (the ninth used to be refused: "no free queue").
func TestListenerQueueReuseSameSession(t *testing.T) {
	ctx, l, _ := listenFresh(t)
	kd, ka := connectPair(t, ctx, l, -1)
	defer kd.Close()
	defer ka.Close()
	for i := range 20 {
		d, a := connectPair(t, ctx, l, i)
		if d.q != 1 {
			t.Fatalf("round %d: dialled queue %d; want queue 1, reclaimed after each round", i, d.q)
		}
		if i%2 == 0 { // either end may close first
			d.Close()
			a.Close()
		} else {
			a.Close()
			d.Close()
		}
	}
	// A queue whose accepted end is still open is not taken: the next
	// dial gets queue 2, and queue 1 serves again once its end closes.
	d, a := connectPair(t, ctx, l, 20)
	d.Close()
	d2, a2 := connectPair(t, ctx, l, 21)
	if d2.q != 2 {
		t.Fatalf("dialled queue %d while queue 1's accepted end is open, want queue 2", d2.q)
	}
	a.Close()
	d3, a3 := connectPair(t, ctx, l, 22)
	if d3.q != 1 {
		t.Fatalf("dialled queue %d after queue 1's ends both closed, want queue 1", d3.q)
	}
	for _, e := range []*Endpoint{d2, a2, d3, a3} {
		e.Close()
	}
	// The kept connection still works.
	sendRaw(t, ctx, kd, []byte("still there"))
	if got := recvRaw(t, ctx, ka, "the kept connection's message"); string(got) != "still there" {
		t.Fatalf("the kept connection got %q", got)
	}
}

// TestListenerConnEndsWithSession: an accepted endpoint left open when
// the dialers' side closes the bridge lives no longer than its session:
// the next dialer gets its queue, served by a fresh endpoint, and the old
// endpoint reports the peer's close instead of reaching the new session's
// rings.
func TestListenerConnEndsWithSession(t *testing.T) {
	ctx, l, _ := listenFresh(t)
	d, old := connectPair(t, ctx, l, 0)
	defer old.Close()
	d.Close() // the dialers' side of the bridge closes: the session ends
	d2, a2 := connectPair(t, ctx, l, 1)
	defer d2.Close()
	defer a2.Close()
	if a2 == old || a2.q != old.q {
		t.Fatalf("the new connection is on queue %d (same endpoint: %v), want a fresh endpoint on queue %d", a2.q, a2 == old, old.q)
	}
	r, err := old.Register([]byte("stale"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := old.Send([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}); !errors.Is(err, fabric.ErrPeerClosed) && !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("sending on the endpoint of the ended session: %v, want ErrPeerClosed or ErrPeerGone", err)
	}
	if n, err := old.Recv([]fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}); n != 0 || err == nil {
		t.Fatalf("receiving on the endpoint of the ended session: %d, %v, want an error", n, err)
	}
}

// bridgePair opens both sides of a bridge at path as a listener and a
// dialer do, and waits until both are up.
func bridgePair(t *testing.T, ctx context.Context, path string) (a, b *Transport) {
	t.Helper()
	type res struct {
		t   *Transport
		err error
	}
	ch := make(chan res, 1)
	go func() {
		tr, err := openBridge(ctx, path, ShmConfig{}, Config{}, true)
		ch <- res{tr, err}
	}()
	a, err := openBridge(ctx, path, ShmConfig{}, Config{}, true)
	r := <-ch
	if err != nil || r.err != nil {
		if a != nil {
			a.Close()
		}
		if r.t != nil {
			r.t.Close()
		}
		t.Fatalf("openBridge: %v / %v", err, r.err)
	}
	t.Cleanup(func() { a.Close(); r.t.Close() })
	return a, r.t
}

// TestQueueReclaim: a queue whose endpoints are closed on both sides gets
// a fresh endpoint on each side within the session (Transport.reclaim):
// not before the peer's endpoint is closed too, with nothing of the old
// connection left in its ring, and sending only once the peer has reset
// its side.
func TestQueueReclaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := bridgePair(t, ctx, filepath.Join(t.TempDir(), "bridge"))
	ea, eb := a.endpoints()[0], b.endpoints()[0]
	// Records left unread on both sides when the queue closes.
	sendRaw(t, ctx, ea, []byte("old a->b 1"))
	sendRaw(t, ctx, ea, []byte("old a->b 2"))
	sendRaw(t, ctx, eb, []byte("old b->a"))
	ea.Close()
	a.reclaim()
	if a.endpoints()[0] != ea {
		t.Fatal("queue 0 was reclaimed while the peer's endpoint is open")
	}
	eb.Close()
	b.reclaim()
	nb := b.endpoints()[0]
	if nb == eb || nb.gen != 1 {
		t.Fatalf("queue 0 of the side that closed last: endpoint replaced %v, incarnation %d; want a fresh endpoint of incarnation 1", nb != eb, nb.gen)
	}
	r, err := nb.Register(make([]byte, 64), fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	msg := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}
	if n, err := nb.Recv(msg); n != 0 || err != nil {
		t.Fatalf("the fresh endpoint received %d messages (%q), %v: want nothing of the old connection", n, r.Bytes()[:msg[0].Len], err)
	}
	// a has not reset its receive ring yet: nb must not send into it.
	if n, err := nb.Send(msg); n != 0 || err != nil {
		t.Fatalf("sending before the peer reset its side of the queue: %d, %v; want 0, nil", n, err)
	}
	a.reclaim()
	na := a.endpoints()[0]
	if na == ea || na.gen != 1 {
		t.Fatalf("queue 0 of the other side: endpoint replaced %v, incarnation %d; want a fresh endpoint of incarnation 1", na != ea, na.gen)
	}
	if n, err := na.Recv(msg); n != 0 || err != nil {
		t.Fatalf("the other fresh endpoint received %d messages, %v: want nothing of the old connection", n, err)
	}
	for i := range 3 { // both ways, and the old objects stay closed
		sendRaw(t, ctx, nb, []byte(fmt.Sprint("new b->a ", i)))
		if got := string(recvRaw(t, ctx, na, "b's new message")); got != fmt.Sprint("new b->a ", i) {
			t.Fatalf("a got %q", got)
		}
		sendRaw(t, ctx, na, []byte(fmt.Sprint("new a->b ", i)))
		if got := string(recvRaw(t, ctx, nb, "a's new message")); got != fmt.Sprint("new a->b ", i) {
			t.Fatalf("b got %q", got)
		}
	}
	if _, err := ea.Send(msg); !errors.Is(err, fabric.ErrClosed) {
		t.Fatalf("the old endpoint sends: %v, want ErrClosed", err)
	}
	// The second incarnation ends and the queue serves a third.
	na.Close()
	nb.Close()
	a.reclaim()
	b.reclaim()
	if a.endpoints()[0].gen != 2 || b.endpoints()[0].gen != 2 {
		t.Fatalf("incarnations %d and %d after the second close, want 2", a.endpoints()[0].gen, b.endpoints()[0].gen)
	}
	sendRaw(t, ctx, a.endpoints()[0], []byte("third"))
	if got := string(recvRaw(t, ctx, b.endpoints()[0], "the third incarnation's message")); got != "third" {
		t.Fatalf("b got %q", got)
	}
}

// TestListenerQueueAbandoned: a dialer that closes its end of a queue
// without connecting (a dial that gave up) does not leave the queue
// unusable for the session: the listener closes its listening endpoint
// of that queue too, both sides reclaim it, and a connect request on the
// fresh queue is answered.
func TestListenerQueueAbandoned(t *testing.T) {
	ctx, l, path := listenFresh(t)
	raw := rawBridge(t, ctx, path, Config{})
	old := raw.endpoints()[0]
	old.Close()
	for raw.endpoints()[0] == old {
		if ctx.Err() != nil {
			t.Fatal("queue 0 was not reclaimed within 20 s after the dialer's side closed it")
		}
		raw.reclaim() // done once the listener closed its end
		time.Sleep(time.Millisecond)
	}
	ep := raw.endpoints()[0]
	req := connMsg(connReq, 77)
	sendRaw(t, ctx, ep, req[:])
	a := recvRaw(t, ctx, ep, "the answer on the reclaimed queue")
	if kind, nonce, err := parseConnMsg(a); err != nil || kind != connAcc || nonce != 77 {
		t.Fatalf("answer %q (%v), want an accept of nonce 77", a, err)
	}
	acc, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acc.Close()
}

// TestListenerDialWhileClosing: a dial that comes while the last
// dialled endpoint of the process is closing (net/http closes a
// connection while it dials the next) waits until that endpoint's side
// of the bridge is let go, then opens it again. It used to take the
// closing transport (and lose its endpoint when the close went on) or
// fail with ErrBusy (both sides of the bridge in use).
func TestListenerDialWhileClosing(t *testing.T) {
	ctx, l, _ := listenFresh(t)
	d, a := connectPair(t, ctx, l, 0)
	a.Close()
	type res struct {
		ep  fabric.Endpoint
		err error
	}
	dialled := make(chan res, 1)
	waiting := make(chan struct{}, 1)
	testHooks.waiting = func() { waiting <- struct{}{} }
	testHooks.closing = func() {
		// The bridge is closing: dial now, and go on closing once the
		// dial waits for it (or, broken, has ended).
		go func() {
			ep, err := fabric.Open(ctx, "ntb", l.Addr(), nil)
			dialled <- res{ep, err}
		}()
		select {
		case <-waiting:
		case r := <-dialled:
			dialled <- r
		case <-ctx.Done():
		}
	}
	defer func() { testHooks.closing, testHooks.waiting = nil, nil }()
	d.Close()
	testHooks.closing, testHooks.waiting = nil, nil
	r := <-dialled
	if r.err != nil {
		t.Fatalf("a dial while the bridge was closing: %v", r.err)
	}
	d2 := r.ep.(*Endpoint)
	defer d2.Close()
	a2, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	sendRaw(t, ctx, d2, []byte("after the close"))
	if got := recvRaw(t, ctx, a2.(*Endpoint), "the new dialer's message"); string(got) != "after the close" {
		t.Fatalf("got %q", got)
	}
}

// TestListenerCloseWhileAnswerBlocked: a peer that connects on a
// reclaimed queue without saying it reset its side (ctrlRdy) holds the
// listener's answer up; Listener.Close still returns.
func TestListenerCloseWhileAnswerBlocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := driver{}.Listen(ctx, path, fabric.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Not a deferred Close: it would wait for a Close that hangs.
	defer func() { go l.Close() }()
	raw := rawBridge(t, ctx, path, Config{})
	old := raw.endpoints()[0]
	old.Close()
	for raw.endpoints()[0] == old { // the listener closes its end, then both reclaim
		if ctx.Err() != nil {
			t.Fatal("queue 0 was not reclaimed within 20 s")
		}
		raw.reclaim()
		time.Sleep(time.Millisecond)
	}
	ep := raw.endpoints()[0]
	// Take back the reset the listener's side waits for.
	raw.mu.Lock()
	shm.U32(raw.peerWin, ep.ctrl(ctrlRdy)).Store(0)
	raw.mu.Unlock()
	req := connMsg(connReq, 5)
	sendRaw(t, ctx, ep, req[:])
	for l.Stats().Pending != 1 { // the listener took the request; its answer waits
		if ctx.Err() != nil {
			t.Fatal("the listener did not take the request within 20 s")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Listener.Close did not return within 20 s while an answer was held up")
	}
}

// TestViewEpochNewSession: a view held on a connection whose session
// ends (the dialer closes, and a new session gives its queue to a new
// connection) lies in memory that the new session clears and reuses, so
// the endpoint's ViewEpoch, which fabric/sock checks after copying from
// a held view, must have changed by the time the new session runs.
func TestViewEpochNewSession(t *testing.T) {
	ctx, l, _ := listenFresh(t)
	d, old := connectPair(t, ctx, l, 0)
	defer old.Close()
	e0 := old.ViewEpoch()
	sendRaw(t, ctx, d, []byte("held across the session's end"))
	views := make([]fabric.View, 1)
	n, err := old.RecvViewsWait(ctx, views)
	if n != 1 || err != nil {
		t.Fatalf("RecvViewsWait: %d, %v", n, err)
	}
	if got := old.ViewEpoch(); got != e0 {
		t.Fatalf("ViewEpoch changed within the session: %d, then %d", e0, got)
	}
	d.Close() // the session ends; the view is still held
	d2, a2 := connectPair(t, ctx, l, 1)
	defer d2.Close()
	defer a2.Close()
	if a2.q != old.q {
		t.Fatalf("the new connection took queue %d, not the held view's %d", a2.q, old.q)
	}
	if got := old.ViewEpoch(); got == e0 {
		t.Fatalf("ViewEpoch is still %d after a new session reused the view's queue (the view now reads %q)", got, views[0].Data)
	}
}
