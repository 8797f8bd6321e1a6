// Package spin is the one wait policy of Weft's blocking calls: poll for
// a spin budget (what keeps latency low), then block (what keeps an idle
// caller cheap).
//
// Spin is the first phase, which every backend's busy-poll uses: the
// caller polls while Next reports true, and once the budget is spent
// blocks on its own wake-up (a channel, a doorbell, poll(2) on a socket).
// Waiter is both phases for callers without a wake-up to block on, such
// as a poller over many endpoints: after the budget it sleeps in growing
// steps up to a ceiling.
//
// The budget is fabric.Options.SpinBudget: exactly that long, and a zero
// budget does not spin at all.
package spin

import (
	"context"
	"runtime"
	"time"
)

// Every is how many polls a spin makes between two readings of the clock
// (and of the context). Each reading also yields the processor, so that
// a spinning goroutine shares it with the one it waits for (in the same
// process, on as few as one processor): 32 is the most often any
// backend's own loop yielded before they shared this one, so none yields
// less.
const Every = 32

// Spin is the spin phase of one wait.
//
//	s := spin.Start(budget)
//	for s.Next(ctx) {
//		if ready() {
//			return
//		}
//	}
//	// block on the wake-up
type Spin struct {
	budget   time.Duration
	deadline time.Time
	rounds   uint
}

// Start begins a spin phase of budget; a budget of zero or less spins
// for no time.
func Start(budget time.Duration) Spin {
	s := Spin{budget: budget}
	if budget > 0 {
		s.deadline = time.Now().Add(budget)
	}
	return s
}

// Next reports whether to poll once more: true until the budget is spent
// or ctx is done (checked every Every polls, when it also yields the
// processor), false from then on.
func (s *Spin) Next(ctx context.Context) bool {
	s.rounds++
	if s.rounds&(Every-1) != 0 && s.budget > 0 {
		return true // the common case, inlined
	}
	return s.check(ctx)
}

// check is Next's reading of the clock and the context.
func (s *Spin) check(ctx context.Context) bool {
	if s.budget <= 0 || ctx.Err() != nil || !time.Now().Before(s.deadline) {
		s.budget = 0
		s.rounds--
		return false
	}
	runtime.Gosched()
	return true
}

// Rounds returns how many times Next returned true.
func (s *Spin) Rounds() int { return int(s.rounds) }

// Sleep steps after the spin budget: the first sleep, and the ceiling
// the doubling stops at.
const (
	FirstSleep = 20 * time.Microsecond
	MaxSleep   = time.Millisecond
)

// Waiter is the state of one wait. The zero value spins for no time.
type Waiter struct {
	budget  time.Duration
	spin    Spin
	started bool
	sleep   time.Duration
}

// New returns a waiter that spins for budget before it sleeps.
func New(budget time.Duration) Waiter { return Waiter{budget: budget} }

// Wait waits once between two polls: it yields while the spin budget
// lasts, then sleeps, each sleep twice the last up to MaxSleep. It returns
// ctx's error once ctx is done.
func (w *Waiter) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.sleep == 0 {
		if !w.started {
			w.spin, w.started = Start(w.budget), true
		}
		if w.spin.Next(ctx) {
			if w.spin.rounds&(Every-1) != 0 { // Next yielded on the others
				runtime.Gosched()
			}
			return nil
		}
		w.sleep = FirstSleep
	} else {
		w.sleep = min(2*w.sleep, MaxSleep)
	}
	t := time.NewTimer(w.sleep)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Reset starts a new wait: the next Wait spins again.
func (w *Waiter) Reset() { w.started, w.sleep = false, 0 }
