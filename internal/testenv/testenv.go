// Package testenv holds what Weft's tests share about their environment.
//
// Its rule: a test that needs root, a kernel feature or a tool skips with
// the reason when it is missing, except under CI (CI=true), where a skip
// would hide a broken machine or a broken test and is therefore a failure
// (SkipOrFail, Skip, SkipOn and the Require functions). Hardware no CI
// machine has skips with SkipNoHardware. It also has the small helpers of
// the network and leak tests: FDCount, Threads, Eventually, Goroutines;
// and the bound of every wait (wait.go): a test that waits gives the wait
// a deadline, Timeout, through Context, Recv, Await or Deadline, so that a
// hang fails that test within a minute with a message that names what it
// waited for, instead of ending the whole package at go test's -timeout.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// InCI reports whether the tests run under CI (the CI variable is true).
func InCI() bool {
	v, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && v
}

// SkipOrFail skips the test with reason, or fails it under CI.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true: cannot skip: %s", reason)
	}
	t.Skip(reason)
}

// SkipNoHardware skips a test that needs hardware this machine does not
// have (kind names it: "ntb", "rdma"), with reason. Such hardware is rare
// and CI machines have none, so this skip is not a failure under CI; a
// machine that has the hardware declares it in WEFT_HW (a comma-separated
// list of kinds), and there the skip is a failure, so that losing the
// hardware or its driver cannot pass unnoticed.
func SkipNoHardware(t testing.TB, kind, reason string) {
	t.Helper()
	if slices.Contains(strings.Split(os.Getenv("WEFT_HW"), ","), kind) {
		t.Fatalf("WEFT_HW declares %s, but: %s", kind, reason)
	}
	t.Skip(reason)
}

// Skip skips the test with the formatted reason, or fails it under CI
// (SkipOrFail).
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	SkipOrFail(t, fmt.Sprintf(format, args...))
}

// SkipOn skips (or, under CI, fails) the test when err matches any of
// targets, and fails it on any other non-nil error. It is the usual way
// to handle the error of a feature probe:
//
//	testenv.SkipOn(t, err, fabric.ErrNotSupported)
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

// RequireRoot skips (or fails under CI) unless the process runs as root,
// which stands for the capabilities the privileged tests need
// (CAP_NET_ADMIN, CAP_BPF, CAP_SYS_ADMIN).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root (CAP_NET_ADMIN, CAP_BPF, CAP_SYS_ADMIN); euid is %d", os.Geteuid())
	}
}

// RequireLinux skips (or fails under CI) on other operating systems.
func RequireLinux(t testing.TB) {
	t.Helper()
	if runtime.GOOS != "linux" {
		Skip(t, "needs Linux, running on %s", runtime.GOOS)
	}
}

// RequireAFXDP skips (or fails under CI) unless the kernel can create
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

// RxeHarness returns the directory of the Soft-RoCE VM harness (rxe-vm):
// $WEFT_RXE_VM, or shared/rxe-vm beside a directory above the working
// directory. It skips (or fails under CI) if there is none.
func RxeHarness(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("WEFT_RXE_VM"); d != "" {
		return d
	}
	dir, _ := os.Getwd()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		for _, p := range []string{filepath.Join(d, "shared", "rxe-vm"), filepath.Join(filepath.Dir(d), "shared", "rxe-vm")} {
			if _, err := os.Stat(filepath.Join(p, "run.sh")); err == nil {
				return p
			}
		}
	}
	SkipOrFail(t, "no rxe-vm harness (set WEFT_RXE_VM)")
	return ""
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

// Threads returns the number of OS threads of the process, as
// /proc/self/status counts them: the measure of a wait that parks a
// thread instead of a goroutine.
func Threads(t testing.TB) int {
	t.Helper()
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("count threads: %v", err)
	}
	for line := range strings.Lines(string(st)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("count threads: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatal("count threads: no Threads: line in /proc/self/status")
	return 0
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

// StopProcess stops this whole process for d, as a loaded host that
// deschedules it or a paused virtual machine would: a child shell sends
// it SIGSTOP, sleeps, and sends SIGCONT. It returns once the process
// runs again.
func StopProcess(t testing.TB, d time.Duration) {
	t.Helper()
	RequireLinux(t)
	pid := strconv.Itoa(os.Getpid())
	secs := strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
	cmd := exec.Command("/bin/sh", "-c", `kill -STOP "$0"; sleep "$1"; kill -CONT "$0"`, pid, secs)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("stopping the process: %v: %s", err, out)
	}
	if got := time.Since(start); got < d {
		t.Fatalf("the process ran again after %v of a %v stop", got, d)
	}
}
