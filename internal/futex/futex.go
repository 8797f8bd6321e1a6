//go:build linux

// Package futex wraps the futex(2) wait and wake operations on 32-bit words
// in memory shared between processes (no FUTEX_PRIVATE_FLAG), so a word in
// a MAP_SHARED mapping can put one process to sleep and let another wake
// it.
package futex

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	opWait = 0 // FUTEX_WAIT
	opWake = 1 // FUTEX_WAKE
)

// Wait sleeps while *addr == val, for at most timeout (0 means no limit).
// It returns early on a wake, a signal or a spurious wake-up; callers
// re-check their condition. It reports whether it slept until woken or
// timed out (true), or returned at once because *addr != val (false).
func Wait(addr *atomic.Uint32, val uint32, timeout time.Duration) bool {
	var tsp unsafe.Pointer
	var ts unix.Timespec
	if timeout > 0 {
		ts = unix.NsecToTimespec(int64(timeout))
		tsp = unsafe.Pointer(&ts)
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opWait,
		uintptr(val), uintptr(tsp), 0, 0)
	return errno != unix.EAGAIN
}

// Wake wakes up to n waiters on addr and returns how many it woke.
func Wake(addr *atomic.Uint32, n int) int {
	r, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opWake,
		uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0
	}
	return int(r)
}
