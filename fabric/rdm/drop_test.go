package rdm

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// stubConn is a connection of a backend no wait set can watch (it is not
// a fabric.Waitable, as an ethernet endpoint is not): Recv hands out
// what the test queued, or the peer's loss once it is gone.
type stubConn struct {
	fabric.Endpoint // the methods the test does not use

	mu     sync.Mutex
	queued int           // messages Recv hands out, one a call
	gone   error         // returned once nothing is queued
	polled chan struct{} // a send for each Recv that found nothing
}

func newStubConn() *stubConn { return &stubConn{polled: make(chan struct{}, 1)} }

func (s *stubConn) Recv(msgs []fabric.Message) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queued > 0 && len(msgs) > 0 {
		s.queued--
		msgs[0].Len = 0
		return 1, nil
	}
	if s.gone != nil {
		return 0, s.gone
	}
	select {
	case s.polled <- struct{}{}:
	default:
	}
	return 0, nil
}

func (s *stubConn) queue(n int) {
	s.mu.Lock()
	s.queued += n
	s.mu.Unlock()
}

func (s *stubConn) Events() <-chan fabric.Event { return nil }
func (s *stubConn) Close() error                { return nil }

// TestDropOnce: a gone peer's connection, drained, is dropped from the
// ones Recv polls once, however many of one Recv's passes find it
// failing. Each drop counted it out of the connections no wait set
// watches; two drops counted a live one out too, RecvWait parked in its
// wait set with nothing left to wake it, and the live peer's messages
// sat unread until the peer gave up on its unacknowledged data
// (TestAllToAllProcesses/ethernet, about 1 run in 20 under -race).
func TestDropOnce(t *testing.T) {
	e, err := Open(context.Background(), "stub", "", &Config{Options: fabric.Options{Spin: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.set == nil {
		t.Skip("no wait set on this platform: RecvWait always sleeps in steps")
	}
	attach := func(name string, s *stubConn) *peer {
		p, _ := e.av.get(e, name)
		if !p.attach(&conn{ep: s, peer: p}) {
			t.Fatalf("attach %s: the peer failed", name)
		}
		return p
	}
	// Recv polls the connections in the order they came, from the first.
	goneConn, live := newStubConn(), newStubConn()
	gonePeer := attach("gone", goneConn)
	attach("live", live)
	if n := e.unwaitable.Load(); n != 2 {
		t.Fatalf("%d unwaitable connections counted after two came, want 2", n)
	}
	lost := fmt.Errorf("stub: %w", fabric.ErrPeerGone)
	goneConn.mu.Lock()
	goneConn.gone = lost
	goneConn.mu.Unlock()
	gonePeer.fail(lost)

	// Two messages wait on the live connection, one taken per pass: the
	// first pass finds the gone connection drained and drops it, and the
	// second, over the same list, finds it failing again.
	live.queue(2)
	msgs := make([]fabric.Message, 2)
	if n, err := e.Recv(msgs, nil); n != 2 || err != nil {
		t.Fatalf("Recv: %d, %v; want the live peer's 2 messages", n, err)
	}
	if n := len(*e.rx.Load()); n != 1 {
		t.Fatalf("Recv polls %d connections after the drop, want 1", n)
	}
	if n := e.unwaitable.Load(); n != 1 {
		t.Fatalf("%d unwaitable connections counted with the live one left, want 1", n)
	}

	// RecvWait takes a message that arrives after it found none.
	for len(live.polled) > 0 {
		<-live.polled
	}
	type result struct {
		n   int
		err error
	}
	ctx := testenv.Context(t)
	done := make(chan result, 1)
	go func() {
		n, err := e.RecvWait(ctx, msgs[:1], nil)
		done <- result{n, err}
	}()
	testenv.Recv(t, live.polled, "RecvWait's first poll of the live connection")
	live.queue(1)
	if r := testenv.Recv(t, done, "RecvWait's message"); r.n != 1 || r.err != nil {
		t.Fatalf("RecvWait: %d, %v; want the message that arrived while it waited", r.n, r.err)
	}
}
