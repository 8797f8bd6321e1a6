package fabric

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/internal/wake"
)

// fdMember is a Waitable with a real wake-up descriptor: an eventfd that
// the set watches, the way a backend's doorbell FIFO or socket is. Its
// knobs make ArmWait behave as a backend might: ready at once, closed, a
// failure, in-process Wakes, a polling period.
type fdMember struct {
	ev       *wake.Parker
	ready    atomic.Bool
	closed   atomic.Bool
	fail     atomic.Bool
	wakes    int           // Wake calls per ArmWait
	poll     time.Duration // PollEvery per ArmWait, if not 0
	noWatch  atomic.Bool   // ArmWait watches nothing (its descriptor is closed)
	arms     atomic.Int32
	disarms  atomic.Int32
	watchErr error
}

func newFDMember(t *testing.T) *fdMember {
	t.Helper()
	ev, err := wake.NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ev.Close() })
	return &fdMember{ev: ev}
}

func (m *fdMember) ArmWait(w *Waker) (bool, error) {
	m.arms.Add(1)
	if m.closed.Load() {
		return false, os.ErrClosed
	}
	if m.fail.Load() {
		return false, errors.New("member failure")
	}
	for range m.wakes {
		w.Wake()
	}
	if m.poll != 0 {
		w.PollEvery(m.poll)
	}
	if !m.noWatch.Load() {
		m.watchErr = w.WatchFD(m.ev.FD())
	}
	return m.ready.Load(), nil
}

func (m *fdMember) DisarmWait(*Waker) { m.disarms.Add(1) }

func newSet(t *testing.T) *WaitSet {
	t.Helper()
	s, err := NewWaitSet()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// within runs f, bounded by testenv.Await: a wait that does not end
// fails the test naming what it waited for.
func within(t *testing.T, what string, f func(ctx context.Context) error) error {
	t.Helper()
	var err error
	testenv.Await(t, what, func() { err = f(context.Background()) })
	return err
}

// TestWaitSetDescriptor: a member's descriptor wakes the set; every
// armed member is disarmed after every wait; a descriptor wake-up is not
// counted as an in-process one.
func TestWaitSetDescriptor(t *testing.T) {
	s := newSet(t)
	a, b := newFDMember(t), newFDMember(t)
	s.Add(a)
	s.Add(b)
	s.Add(a) // twice is once
	if s.Len() != 2 {
		t.Fatalf("Len = %d, want 2", s.Len())
	}
	s.Wait(context.Background()) // consumes Add's wake-up
	base := s.Wakeups()
	b.ev.Ring()
	if err := within(t, "b's descriptor to wake the set", s.Wait); err != nil {
		t.Fatal(err)
	}
	if a.watchErr != nil || b.watchErr != nil {
		t.Fatal(a.watchErr, b.watchErr)
	}
	if a.arms.Load() != a.disarms.Load() || b.arms.Load() != b.disarms.Load() || a.arms.Load() != 2 {
		t.Fatalf("arms %d/%d, disarms %d/%d: want every arm undone, 2 each", a.arms.Load(), b.arms.Load(), a.disarms.Load(), b.disarms.Load())
	}
	if s.Wakeups() != base {
		t.Fatalf("Wakeups %d -> %d: a descriptor wake-up counted as an in-process one", base, s.Wakeups())
	}
}

// TestWaitSetWakeOnce: a wait rings its eventfd once however many times
// members call Wake in it.
func TestWaitSetWakeOnce(t *testing.T) {
	s := newSet(t)
	m := newFDMember(t)
	m.wakes = 3
	s.Add(m)
	s.Wait(context.Background())
	for i := range 3 {
		base := s.Wakeups()
		if err := within(t, "a member's own Wake", s.Wait); err != nil {
			t.Fatal(err)
		}
		if got := s.Wakeups() - base; got != 1 {
			t.Fatalf("wait %d: %d in-process wake-ups for 3 Wake calls, want 1", i, got)
		}
	}
}

// TestWaitSetReady: a member ready at arming keeps the set from sleeping.
func TestWaitSetReady(t *testing.T) {
	s := newSet(t)
	m := newFDMember(t)
	s.Add(m)
	s.Wait(context.Background())
	m.ready.Store(true)
	if err := within(t, "a ready member", s.Wait); err != nil {
		t.Fatal(err)
	}
}

// TestWaitSetMemberErrors: a member that reports closed is dropped and
// the wait returns so the caller notices; one that fails otherwise stays
// and is not armed (not disarmed either).
func TestWaitSetMemberErrors(t *testing.T) {
	s := newSet(t)
	gone, bad := newFDMember(t), newFDMember(t)
	s.Add(gone)
	s.Add(bad)
	s.Wait(context.Background())
	gone.closed.Store(true)
	bad.fail.Store(true)
	if err := within(t, "the closed member to end the wait", s.Wait); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 1 {
		t.Fatalf("Len = %d after a member closed, want 1", s.Len())
	}
	if d := bad.disarms.Load(); d != 1 {
		t.Fatalf("a member whose ArmWait failed was disarmed (%d disarms, want the 1 of the first wait)", d)
	}
	// The failing member stays; its failure does not end a wait.
	if err := s.WaitFor(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

// TestWaitSetRemove: a removed member's descriptor no longer wakes the
// set (its readiness is level-triggered, so a watch left behind would end
// every wait at once).
func TestWaitSetRemove(t *testing.T) {
	s := newSet(t)
	m := newFDMember(t)
	s.Add(m)
	s.Wait(context.Background())
	s.Remove(m)
	s.Remove(m) // not a member: no error
	m.ev.Ring()
	const d = 20 * time.Millisecond
	start := time.Now()
	if err := s.WaitFor(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Fatalf("WaitFor(%v) returned after %v: the removed member's descriptor still wakes the set", d, took)
	}
}

// TestWaitSetPollEvery: a member with no wake-up of its own bounds the
// sleep to its period, the shortest of the caller's and the members'.
func TestWaitSetPollEvery(t *testing.T) {
	s := newSet(t)
	m := newFDMember(t)
	m.poll = time.Millisecond
	s.Add(m)
	s.Wait(context.Background())
	if err := within(t, "the member's 1ms polling period with no bound of the caller's", s.Wait); err != nil {
		t.Fatal(err)
	}
	if err := within(t, "the member's 1ms polling period under the caller's hour", func(ctx context.Context) error { return s.WaitFor(ctx, time.Hour) }); err != nil {
		t.Fatal(err)
	}
	m.poll = time.Hour
	if err := within(t, "the caller's 1ms under a member's hour", func(ctx context.Context) error { return s.WaitFor(ctx, time.Millisecond) }); err != nil {
		t.Fatal(err)
	}
}

// TestWaitSetClosed: Add(nil) is invalid; after Close, Add, Wait and a
// member's WatchFD fail with os.ErrClosed, and Close is idempotent.
func TestWaitSetClosed(t *testing.T) {
	s := newSet(t)
	if err := s.Add(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Add(nil) = %v, want ErrInvalid", err)
	}
	m := newFDMember(t)
	s.Add(m)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if err := s.Add(m); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Add after Close = %v, want os.ErrClosed", err)
	}
	if err := s.Wait(context.Background()); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Wait after Close = %v, want os.ErrClosed", err)
	}
	if err := s.waker.WatchFD(m.ev.FD()); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("WatchFD after Close = %v, want os.ErrClosed", err)
	}
}

// TestWaitSetCancel: a cancelled context ends a parked wait with its
// error, and one cancelled before the wait ends it at once.
func TestWaitSetCancel(t *testing.T) {
	s := newSet(t)
	s.Add(newFDMember(t))
	s.Wait(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context = %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := s.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline = %v, want context.DeadlineExceeded", err)
	}
}

// TestWaitSetReusedFD: a descriptor number that one member watched, then
// closed, and another member's new descriptor now has, is watched again
// for the new member (the kernel dropped the old one at its close).
func TestWaitSetReusedFD(t *testing.T) {
	s := newSet(t)
	a := newFDMember(t)
	s.Add(a)
	s.Wait(context.Background()) // a watches its descriptor
	num := a.ev.FD()
	a.noWatch.Store(true) // a stays a member, with nothing to watch
	a.ev.Close()
	b := newFDMember(t)
	if b.ev.FD() != num {
		t.Fatalf("the new eventfd is %d, not the closed %d: the test needs the number reused", b.ev.FD(), num)
	}
	b.ev.Ring()
	s.Add(b) // its wake-up is taken by the next Wait, the one after arms b
	s.Wait(context.Background())
	if err := within(t, "the reused descriptor, readable, to wake the set", s.Wait); err != nil {
		t.Fatal(err)
	}
}

// TestWaitSetSleepNoAllocs: a Wait that parks, with a context that can be
// cancelled, allocates nothing once the context's registration is kept
// (wake.CtxWatch; counted without the race detector: testenv.Race), and
// that context, cancelled while a later Wait parks,
// still wakes it.
func TestWaitSetSleepNoAllocs(t *testing.T) {
	s := newSet(t)
	m := newFDMember(t)
	s.Add(m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := func() {
		m.ev.Ring() // the park returns at once, on the member's descriptor
		if err := s.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		m.ev.Drain()
	}
	wait()
	if n := testing.AllocsPerRun(100, wait); n != 0 && !testenv.Race {
		t.Errorf("a Wait that parks: %v allocations", n)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx) }()
	cancel()
	if err := testenv.Recv(t, done, "the Wait whose context was cancelled"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
}
