// Package testenv decides what tests that need privileges or kernel
// features do when those are missing: skip with the reason, except under
// CI (CI=true), where a skip would hide a broken machine or a broken test
// and is therefore a failure.
package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
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

// RequireRoot skips (or fails under CI) unless the process runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root")
	}
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
