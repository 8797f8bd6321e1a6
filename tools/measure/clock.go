package measure

import (
	"time"

	"golang.org/x/sys/unix"
)

// Packets carry CLOCK_MONOTONIC timestamps, so that a receiver, another
// process (in another namespace) on the same host, can measure one-way
// latency. Reading that clock through x/sys/unix is a system call, while
// time.Now reads it through the vDSO; so each process pairs one
// system-call reading with time.Now once (the closest of a few tries),
// and from then on a timestamp is that offset plus the monotonic time
// elapsed since, at the cost of time.Now.
var (
	clockBase time.Time // a time.Now reading
	monoBase  int64     // CLOCK_MONOTONIC in ns at clockBase
	clockErr  time.Duration
)

// InitClock pairs CLOCK_MONOTONIC with time.Now for Mono and MonoNow. A
// process calls it once, before it takes timestamps; it fails only if
// CLOCK_MONOTONIC could not be read at all.
func InitClock() error {
	best := time.Duration(1 << 62)
	var last error
	for range 20 {
		var ts unix.Timespec
		t0 := time.Now()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			last = err
			continue
		}
		if gap := time.Since(t0); gap < best {
			best, clockBase, monoBase = gap, t0, ts.Nano()-int64(gap/2)
		}
	}
	if best == 1<<62 {
		return last
	}
	clockErr = best / 2
	return nil
}

// Mono converts a time.Now reading to CLOCK_MONOTONIC nanoseconds.
func Mono(t time.Time) int64 { return monoBase + int64(t.Sub(clockBase)) }

// MonoNow returns CLOCK_MONOTONIC in nanoseconds.
func MonoNow() int64 { return monoBase + int64(time.Since(clockBase)) }

// ClockErr bounds the error of InitClock's pairing: half the closest gap
// between the two readings.
func ClockErr() time.Duration { return clockErr }
