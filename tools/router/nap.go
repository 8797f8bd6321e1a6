package main

import (
	"time"

	"golang.org/x/sys/unix"
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
