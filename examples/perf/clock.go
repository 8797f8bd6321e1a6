package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// The packets of the sweep carry CLOCK_MONOTONIC timestamps, so latency
// is measured end to end across the two processes on one host. Reading
// CLOCK_MONOTONIC through x/sys/unix is a system call; the Go runtime reads
// the same clock through the vDSO for time.Now's monotonic reading. So
// each process pairs one CLOCK_MONOTONIC reading with time.Now once (the
// closest of a few tries), and from then on a timestamp is that offset
// plus the monotonic time elapsed since, at the cost of time.Now.
var (
	clockBase time.Time // a time.Now reading
	monoBase  int64     // CLOCK_MONOTONIC in ns at clockBase
	clockErr  time.Duration
)

func initClock() {
	best := time.Duration(1 << 62)
	for i := 0; i < 20; i++ {
		var ts unix.Timespec
		t0 := time.Now()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			fatal(err)
		}
		t1 := time.Now()
		if gap := t1.Sub(t0); gap < best {
			best = gap
			clockBase = t0
			monoBase = ts.Nano() - int64(gap/2)
		}
	}
	clockErr = best / 2
}

// mono converts a time.Now reading to CLOCK_MONOTONIC nanoseconds.
func mono(t time.Time) int64 { return monoBase + int64(t.Sub(clockBase)) }
