package wake

import (
	"context"
	"sync"
)

// CtxWatch runs a function when the context of a wait is done, for a
// wait site (a doorbell bit, an endpoint's receive side) whose waits park
// on something a context cannot wake, such as a Parker: the function
// rings it. It is context.AfterFunc kept from one wait to the next: the
// registrations of the last contexts (up to CtxWatchSlots) stay after
// their waits end, and a wait with one of those contexts (one whose Done
// is the same channel) reuses its registration. A site whose waits use a
// few long-lived contexts (a connection's read and write deadlines, a
// server's lifetime) thus registers once per context, not once per
// sleep, where context.AfterFunc allocates 3 to 5 objects a call. A wait
// with another context replaces the least recently used registration
// that no wait holds; if every one is held, it registers one of its own
// for the time it holds.
//
// The function runs only while a wait holds the registration that fired:
// a context done after its waits ended wakes nobody. It may also run when
// no holder's context is done (a replaced registration firing late), so
// whoever it wakes must re-check its condition, as every Parker waiter
// does.
//
// A kept registration keeps its context reachable until it is replaced
// or Stop is called. The zero value is not usable: call Init first. A
// CtxWatch must not be copied after first use.
type CtxWatch struct {
	mu    sync.Mutex
	f     func() // what a done context runs
	slots [CtxWatchSlots]ctxSlot
	uses  uint64 // Hold calls, for the slots' last use
	fires int    // registrations that fired, for tests
}

// CtxWatchSlots is how many registrations a CtxWatch keeps: two for the
// read and write deadlines of a connection whose reads and writes both
// wait for the same arrivals (fabric/sock's credit grants), and room for
// a caller's own contexts beside them.
const CtxWatchSlots = 4

// ctxSlot is one kept registration.
type ctxSlot struct {
	fire func() // what is registered: f while a wait holds the slot
	done <-chan struct{}
	stop func() bool
	held int    // waits holding the registration
	used uint64 // CtxWatch.uses at its last Hold
}

// Init sets the function a done context runs; it must be called before
// any other method.
func (w *CtxWatch) Init(f func()) {
	w.f = f
	for i := range w.slots {
		s := &w.slots[i]
		s.fire = func() {
			w.mu.Lock()
			held := s.held
			w.fires++
			w.mu.Unlock()
			if held > 0 {
				f()
			}
		}
	}
}

// Hold is one wait's hold on a CtxWatch; Release ends it.
type Hold struct {
	w   *CtxWatch
	s   *ctxSlot    // the kept registration held
	own func() bool // or a registration of this wait alone
}

// Hold makes the watch's function run if ctx is done before the hold is
// released. A context that is never done (a nil Done) needs nothing. In
// the steady state (one of the last contexts) it allocates nothing. If
// ctx is done already, the function runs before Hold returns: a kept
// registration that fired while no wait held it did not run it.
func (w *CtxWatch) Hold(ctx context.Context) Hold {
	done := ctx.Done()
	if done == nil {
		return Hold{}
	}
	h := w.hold(ctx, done)
	if h.s != nil {
		select {
		case <-done:
			w.f()
		default:
		}
	}
	return h
}

// hold is Hold under the lock.
func (w *CtxWatch) hold(ctx context.Context, done <-chan struct{}) Hold {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.uses++
	var free *ctxSlot
	for i := range w.slots {
		s := &w.slots[i]
		if s.done == done {
			s.held++
			s.used = w.uses
			return Hold{w: w, s: s}
		}
		if s.held == 0 && (free == nil || s.used < free.used) {
			free = s
		}
	}
	if free == nil {
		return Hold{own: context.AfterFunc(ctx, w.f)}
	}
	if free.stop != nil {
		free.stop()
	}
	free.done, free.stop = done, context.AfterFunc(ctx, free.fire)
	free.held, free.used = 1, w.uses
	return Hold{w: w, s: free}
}

// Release ends the hold. The zero Hold's Release does nothing.
func (h Hold) Release() {
	switch {
	case h.own != nil:
		h.own()
	case h.w != nil:
		h.w.mu.Lock()
		h.s.held--
		h.w.mu.Unlock()
	}
}

// Stop drops the kept registrations, so that their contexts are no
// longer reachable from the watch (for a Close). A wait that holds one
// then has it no more; a later Hold registers again.
func (w *CtxWatch) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.slots {
		s := &w.slots[i]
		if s.stop != nil {
			s.stop()
		}
		s.done, s.stop = nil, nil
	}
}
