// Package spin is the wait policy of callers that poll something without
// a wake-up to sleep on: spin for a budget (what keeps latency low), then
// sleep in growing steps up to a ceiling (what keeps an idle caller
// cheap). Backends with a doorbell or a file descriptor to sleep on use
// that instead once the budget is spent; this is for the rest, such as a
// poller over many endpoints.
package spin

import (
	"context"
	"runtime"
	"time"
)

// Sleep steps after the spin budget: the first sleep, and the ceiling
// the doubling stops at.
const (
	FirstSleep = 20 * time.Microsecond
	MaxSleep   = time.Millisecond
)

// Waiter is the state of one wait. The zero value spins for no time.
type Waiter struct {
	budget   time.Duration
	deadline time.Time
	sleep    time.Duration
	spins    int
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
	if w.spins == 0 {
		w.deadline = time.Now().Add(w.budget)
	}
	w.spins++
	// Within the budget, yield; read the clock only every 64 rounds.
	if w.sleep == 0 && w.budget > 0 && (w.spins&63 != 0 || time.Now().Before(w.deadline)) {
		runtime.Gosched()
		return nil
	}
	if w.sleep == 0 {
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
func (w *Waiter) Reset() { w.spins, w.sleep = 0, 0 }
