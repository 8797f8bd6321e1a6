package main

import (
	"context"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/internal/spin"
)

// napTime is one idle nap (Settings.Nap).
var napTime = unix.NsecToTimespec(int64(defaultNap))

const defaultNap = 20 * time.Microsecond

// setNap sets the length of this process's idle naps (0: the default).
func setNap(d time.Duration) {
	if d <= 0 {
		d = defaultNap
	}
	napTime = unix.NsecToTimespec(int64(d))
}

// nap gives the core away for a moment. It sleeps in nanosleep(2) on the
// calling thread rather than in time.Sleep, whose timers wake no sooner
// than about a millisecond on this kind of host; a nap here costs the
// kernel's timer slack (50 µs) plus the wake-up.
func nap() { unix.Nanosleep(&napTime, nil) }

// sleepFor sleeps d in nanosleep(2).
func sleepFor(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Nanosleep(&ts, nil)
}

// spinner decides when an idle loop (a node's, the sink's) stops polling
// and parks: Weft's one wait policy (internal/spin's Budget), whose
// maximum is Settings.Spin. Each idle stretch spins for the budget, which
// grows while spins end in work and shrinks while they run out, and is
// zero while the host has more runnable threads than cores: a router of
// four to six processes on a 2-core host then parks at once instead of
// holding a core that the process it waits for needs. A fixed spin did
// not: at 5,000 packets/s every node spun through every gap, the host
// ran at 1.7 of 2 cores and a hop took hundreds of µs.
type spinner struct {
	b     spin.Budget
	s     spin.Spin
	on    bool // a spin is under way
	never bool // Settings.Spin < 0: poll, never park
}

func newSpinner(max time.Duration) *spinner {
	p := &spinner{never: max < 0}
	p.b.Init(max)
	return p
}

// idle is called after a poll that found nothing; it reports whether the
// loop should park now.
func (p *spinner) idle(ctx context.Context) bool {
	if p.never {
		return false
	}
	if !p.on {
		p.s, p.on = p.b.Start(), true
	}
	if p.s.Next(ctx) {
		return false
	}
	p.b.Slept(&p.s)
	p.on = false
	return true
}

// work is called after a poll that found work.
func (p *spinner) work() {
	if p.on {
		p.b.Arrived(&p.s)
		p.on = false
	}
}
