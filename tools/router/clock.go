package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// Packets carry CLOCK_MONOTONIC timestamps so that the sink, another
// process in another namespace on the same host, can measure one-way
// latency. Reading that clock through x/sys/unix is a system call, while
// time.Now reads it through the vDSO; so each process pairs one system-call
// reading with time.Now once, at start, and a timestamp is that offset
// plus time.Since, at the cost of time.Now.
var (
	clockBase time.Time
	monoBase  int64
)

func initClock() {
	best := time.Duration(1 << 62)
	for range 20 {
		var ts unix.Timespec
		t0 := time.Now()
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
			continue
		}
		if gap := time.Since(t0); gap < best {
			best, clockBase, monoBase = gap, t0, ts.Nano()-int64(gap/2)
		}
	}
}

// monoNow returns CLOCK_MONOTONIC in nanoseconds.
func monoNow() int64 { return monoBase + int64(time.Since(clockBase)) }

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
