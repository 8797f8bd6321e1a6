package fabric

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/internal/wake"
)

// WaitSet waits for any of many endpoints, listeners or queues at once,
// with one goroutine parked in Go's netpoller for all of them: libfabric's
// wait set (fi_wait, fi_trywait), UCX's worker event descriptor
// (ucp_worker_get_efd, ucp_worker_arm).
//
// It is built on an epoll descriptor that the netpoller watches. Members
// whose wake-up is a descriptor (a FIFO the peer's doorbell rings, a
// socket, a completion channel) add it to the set; members woken from
// inside the process (an engine's receive goroutine, Close) ring the
// set's own eventfd, once per wait however many of them do.
//
// Readiness is level-style and may be spurious, as with fi_trywait: after
// Wait returns, poll the members (Recv, Accept, Poll), and call Wait again
// when none had work.
//
//	for {
//		n, _ := a.Recv(msgs) // and b, c...
//		if n == 0 {
//			set.Wait(ctx)
//		}
//	}
//
// A member that is closed is dropped at the next Wait, which returns so
// that the caller can notice; the set keeps working for the others.
type WaitSet struct {
	mu      sync.Mutex
	members []Waitable
	closed  bool
	ep      *wake.Parker // epoll over the watched descriptors and bell
	bell    *wake.Parker // eventfd of in-process wake-ups
	waker   Waker
	watched map[int]Waitable // descriptor -> the member that watched it last
	arming  Waitable         // the member in ArmWait (under waitMu)

	// waitMu serialises Wait, whose arming state is the set's.
	waitMu  sync.Mutex
	armed   []Waitable // this wait's armed members (reused)
	period  atomic.Int64
	ringers atomic.Uint64
	timer   *time.Timer // bounds a sleep (WaitFor, PollEvery); under waitMu
	// watch rings bell when a sleeping Wait's context is done; it keeps
	// the registrations of the last contexts, so that a caller's waits
	// with one context allocate nothing.
	watch wake.CtxWatch
}

// Waitable is implemented by what a WaitSet can wait on: endpoints,
// listeners, completion queues and queues of the backends that support
// it. Callers use the set; backends implement this.
type Waitable interface {
	// ArmWait readies the member to wake w when it may have work, and
	// reports whether it may have some already (the set then does not
	// sleep), as fi_trywait does. An error matching os.ErrClosed drops
	// the member from the set.
	ArmWait(w *Waker) (ready bool, err error)
	// DisarmWait undoes ArmWait. The set calls it after every wait, for
	// every member it armed.
	DisarmWait(w *Waker)
}

// Waker is a WaitSet's wake-up as its members see it.
type Waker struct {
	s    *WaitSet
	rung atomic.Bool
}

// Wake wakes the set's waiter from this process. Calls after the first of
// one wait cost an atomic load.
func (w *Waker) Wake() {
	if !w.rung.Load() && w.rung.CompareAndSwap(false, true) {
		w.s.bell.Ring()
		w.s.ringers.Add(1)
	}
}

// WatchFD makes the set wake while fd is readable. Members whose wake-up
// is a descriptor call it from ArmWait; a member watching its descriptor
// again costs a map lookup. The readiness is level-triggered: the member
// consumes what woke it (in DisarmWait or when polled), or the set does
// not sleep. A descriptor's close takes it out of the set, and with it
// any wake-up it had pending, so a member that closes it rings Wake
// first.
func (w *Waker) WatchFD(fd int) error {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return os.ErrClosed
	}
	if m, ok := s.watched[fd]; ok && m == s.arming {
		return nil
	}
	// A new descriptor, or a number another member watched (shared, or
	// closed and reused): add it again; the kernel says if it is there.
	if err := s.ep.Watch(fd); err != nil {
		return err
	}
	s.watched[fd] = s.arming
	return nil
}

// PollEvery bounds this wait's sleep to d, for a member that has no
// wake-up of its own (a bridge whose doorbell register can only be
// polled): the set then looks again after d, or sooner if the caller's
// WaitFor asked for less.
func (w *Waker) PollEvery(d time.Duration) {
	for {
		cur := w.s.period.Load()
		if cur != 0 && cur <= int64(d) {
			return
		}
		if w.s.period.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// NewWaitSet returns an empty wait set. Close it to release its two
// descriptors.
func NewWaitSet() (*WaitSet, error) {
	ep, err := wake.NewEpoll()
	if err != nil {
		return nil, err
	}
	bell, err := wake.NewEventfd()
	if err != nil {
		ep.Close()
		return nil, err
	}
	if err := ep.Watch(bell.FD()); err != nil {
		ep.Close()
		bell.Close()
		return nil, err
	}
	s := &WaitSet{ep: ep, bell: bell, watched: map[int]Waitable{}}
	s.waker.s = s
	s.watch.Init(bell.Ring)
	return s, nil
}

// Add makes m a member. Adding a member twice is not an error.
func (s *WaitSet) Add(m Waitable) error {
	if m == nil {
		return &OpError{Op: "waitset add", Err: ErrInvalid}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &OpError{Op: "waitset add", Err: ErrClosed}
	}
	if !slices.Contains(s.members, m) {
		s.members = append(s.members, m)
	}
	s.Wake() // a waiter looks at the new member
	return nil
}

// Remove drops m from the set. Removing a member that is not in it is not
// an error.
func (s *WaitSet) Remove(m Waitable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(s.members, m); i >= 0 {
		s.members = slices.Delete(s.members, i, i+1)
	}
	for fd, w := range s.watched {
		if w == m {
			s.ep.Unwatch(fd)
			delete(s.watched, fd)
		}
	}
}

// Len returns the number of members.
func (s *WaitSet) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.members)
}

// Wake wakes the set's waiter from outside its members: a caller whose
// own state changed (a new connection to add, a stop request).
func (s *WaitSet) Wake() {
	s.waker.Wake()
}

// Wakeups returns how many in-process wake-ups rang the set's eventfd.
func (s *WaitSet) Wakeups() uint64 { return s.ringers.Load() }

// Wait returns when any member may have work, ctx is done (its error) or
// the set is closed (an error matching os.ErrClosed). It arms every
// member and, unless one is ready already, parks until one wakes it.
// Calls to Wait are serialised.
func (s *WaitSet) Wait(ctx context.Context) error { return s.WaitFor(ctx, 0) }

// WaitFor is Wait that also returns, with nil, after d (0: no bound): for
// a loop that has its own deadlines, such as a batch to flush. It
// allocates nothing unless ctx can be cancelled.
func (s *WaitSet) WaitFor(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return &OpError{Op: "waitset wait", Err: ErrClosed}
	}
	s.armed = append(s.armed[:0], s.members...)
	s.mu.Unlock()

	s.waker.rung.Store(false)
	s.period.Store(int64(d))
	ready := false
	n := 0
	for _, m := range s.armed {
		s.arming = m
		r, err := m.ArmWait(&s.waker)
		s.arming = nil
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				s.Remove(m)
				ready = true // the caller notices it gone
			}
			continue
		}
		s.armed[n] = m
		n++
		ready = ready || r
	}
	s.armed = s.armed[:n]
	var err error
	if !ready {
		err = s.park(ctx)
	}
	for _, m := range s.armed {
		m.DisarmWait(&s.waker)
	}
	clear(s.armed)
	s.bell.Drain()
	if err != nil {
		return err
	}
	return ctx.Err()
}

// park sleeps in the netpoller until the epoll set is ready, ctx is done
// or a member's polling period ends.
func (s *WaitSet) park(ctx context.Context) error {
	h := s.watch.Hold(ctx)
	defer h.Release()
	if d := time.Duration(s.period.Load()); d > 0 {
		if s.timer == nil {
			s.timer = time.AfterFunc(d, s.bell.Ring)
		} else {
			s.timer.Reset(d)
		}
		defer s.timer.Stop()
	}
	if err := s.ep.Wait(nil); err != nil {
		return &OpError{Op: "waitset wait", Err: ErrClosed}
	}
	return nil
}

// Close releases the set and wakes its waiter with an error matching
// os.ErrClosed. Members are not closed. It is idempotent.
func (s *WaitSet) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.members = nil
	s.mu.Unlock()
	s.ep.Close()
	s.bell.Close()
	s.watch.Stop()
	return nil
}
