package main

import (
	"runtime"
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

// pin locks the calling goroutine to its OS thread and that thread to
// CPU cpu (modulo the CPUs available), so the two spinning ends of a
// sweep do not share a core. It reports the CPU, or -1 if it could not.
func pin(cpu int) int {
	var avail unix.CPUSet
	if err := unix.SchedGetaffinity(0, &avail); err != nil || avail.Count() < 2 {
		return -1
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < avail.Count(); i++ {
		if avail.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	c := cpus[cpu%len(cpus)]
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(c)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return -1
	}
	return c
}

// cpuTime returns the CPU time the process has used (user and system).
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// share measures the CPU share of the process over a phase: CPU time over
// wall time. Both ends of the sweep spin, so a share well below 1 means
// the host took the CPU away (other load), which stalls the pipeline.
type share struct {
	cpu  time.Duration
	wall time.Time
}

func startShare() share { return share{cpuTime(), time.Now()} }

func (s share) end() float64 {
	w := time.Since(s.wall)
	if w <= 0 {
		return 0
	}
	return float64(cpuTime()-s.cpu) / float64(w)
}
