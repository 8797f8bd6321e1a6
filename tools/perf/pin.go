package main

import (
	"runtime"

	"golang.org/x/sys/unix"
)

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
