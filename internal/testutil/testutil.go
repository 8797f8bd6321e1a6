// Package testutil holds helpers shared by Weft's network tests, on top
// of internal/testenv's rule: a test that needs root, a kernel feature
// or a tool skips with a reason when it is missing, but under CI
// (CI=true) such a skip is a failure, so a CI machine that lost a
// capability cannot turn the suite green by skipping everything.
package testutil

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
	"golang.org/x/sys/unix"
)

// InCI reports whether the tests run under CI (testenv.InCI).
func InCI() bool { return testenv.InCI() }

// Skip skips the test with the formatted reason, or fails it under CI
// (testenv.SkipOrFail).
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	testenv.SkipOrFail(t, fmt.Sprintf(format, args...))
}

// SkipOn skips (or, in CI, fails) the test when err matches any of
// targets, and fails it on any other non-nil error. It is the usual way
// to handle the error of a feature probe:
//
//	testutil.SkipOn(t, err, fabric.ErrNotSupported)
func SkipOn(t testing.TB, err error, targets ...error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, tg := range targets {
		if errors.Is(err, tg) {
			Skip(t, "%v", err)
			return
		}
	}
	t.Fatal(err)
}

// RequireRoot skips (or fails in CI) unless the process has
// CAP_NET_ADMIN and CAP_SYS_ADMIN, approximated by euid 0.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root (CAP_NET_ADMIN, CAP_BPF, CAP_SYS_ADMIN); euid is %d", os.Geteuid())
	}
}

// RequireLinux skips (or fails in CI) on other operating systems.
func RequireLinux(t testing.TB) {
	t.Helper()
	if runtime.GOOS != "linux" {
		Skip(t, "needs Linux, running on %s", runtime.GOOS)
	}
}

// RequireAFXDP skips (or fails in CI) unless the kernel can create
// AF_XDP sockets.
func RequireAFXDP(t testing.TB) {
	t.Helper()
	RequireLinux(t)
	RequireRoot(t)
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		Skip(t, "kernel has no AF_XDP sockets: %v", err)
		return
	}
	unix.Close(fd)
}

var pollerOnce sync.Once

// FDCount returns the number of open file descriptors of the process.
// It first makes sure the Go runtime's network poller exists, because the
// poller opens its own descriptors (epoll and a wake-up eventfd) the first
// time anything pollable is opened; a count taken before that would read
// the poller as a leak of whatever the test opened first.
func FDCount(t testing.TB) int {
	t.Helper()
	pollerOnce.Do(func() {
		r, w, err := os.Pipe() // pipes are pollable: this starts the poller
		if err == nil {
			r.Close()
			w.Close()
		}
	})
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("count fds: %v", err)
	}
	return len(ents)
}

// Eventually polls cond every few milliseconds until it is true or d
// has passed, and reports whether it became true.
func Eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Goroutines returns runtime.NumGoroutine after letting exiting
// goroutines finish: it waits up to d for the count to drop to at most
// want and returns the last count seen.
func Goroutines(want int, d time.Duration) int {
	n := runtime.NumGoroutine()
	Eventually(d, func() bool { n = runtime.NumGoroutine(); return n <= want })
	return n
}
