// Package liveness is the one policy for declaring a quiet peer gone:
// the peer must stay silent for a timeout of the time this process was
// running, not of the wall clock.
//
// A periodic check (a transport's timer tick, a link monitor) that finds
// far more time passed since its previous run than its period was not
// running in between: the process was stopped, the machine paused, or
// the goroutine starved on a loaded host. A peer in the same process or
// on the same machine was stopped as well, and one elsewhere has
// messages waiting unread; either way the gap says nothing about the
// peer. The check asks Stalls how long it was away and moves its
// silence stamps forward by that much, so that the peer gets its whole
// timeout, less what it had used before the stall, to be heard again.
//
// The wall clock alone failed live peers: on a CI host, four of 64
// connections that had finished their handshakes a moment before
// declared their peers (in the same process) silent for 5 s, which
// only a stop of the whole process fits; stopping a test process with
// SIGSTOP reproduces it, on the first tick after the stop, before the
// peers' own ticks can send their keepalives.
package liveness

import "time"

// Stalls measures, for one periodic check, the time its caller was not
// running. The zero value is not usable: make one with New.
type Stalls struct {
	allow int64 // a gap between checks up to this long is running time
	last  int64
}

// New returns Stalls for a check that runs every period (at most; it
// may run more often). A gap between two checks counts as running time
// up to two periods: a check late by less is the ordinary jitter of
// timers, and the rest is time the caller was away. The allowance is
// kept that short because it is spent against every timeout the caller
// keeps, the shortest included (a listener's handshake limit of 100 ms
// beside a peer timeout of 5 s); discounting a late tick that was not a
// stop only delays noticing a dead peer by that tick's lateness.
func New(period time.Duration) Stalls {
	return Stalls{allow: int64(2 * period)}
}

// Start starts the clock at now, as if a check ran then: the time
// from it to the first Check counts like any other gap. Without it the
// first Check only starts the clock.
func (s *Stalls) Start(now int64) { s.last = now }

// Check returns how much of the time since the previous Check (now and
// the previous now are the caller's monotonic clock, in nanoseconds) the
// caller was not running: 0 unless the gap exceeds the allowance, and
// then the gap less the allowance. The caller moves each of its silence stamps forward by the
// result (never past now).
func (s *Stalls) Check(now int64) time.Duration {
	last := s.last
	s.last = now
	if last == 0 || now-last <= s.allow {
		return 0
	}
	return time.Duration(now - last - s.allow)
}

// Forward moves a silence stamp (monotonic nanoseconds) forward by a
// stall that Check returned, but never past now.
func Forward(stamp *int64, stall time.Duration, now int64) {
	*stamp = min(*stamp+int64(stall), now)
}

var epoch = time.Now()

// Now is a monotonic clock in nanoseconds, for callers without one of
// their own.
func Now() int64 { return int64(time.Since(epoch)) }
