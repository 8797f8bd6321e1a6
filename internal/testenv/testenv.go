// Package testenv decides what tests that need privileges or kernel
// features do when those are missing: skip with the reason, except under
// CI (CI=true), where a skip would hide a broken machine or a broken test
// and is therefore a failure.
package testenv

import (
	"os"
	"strconv"
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

// RequireRoot skips (or fails under CI) unless the process runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root")
	}
}
