package testenv

import (
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// childEnv names the variable that makes TestChild do its work; in a
// normal run TestChild has nothing to do and returns.
const childEnv = "WEFT_TESTENV_CHILD"

// TestChild is run by the tests below in a child process: it calls the
// helper named by WEFT_TESTENV_CHILD as a test that needs a missing
// environment would.
func TestChild(t *testing.T) {
	switch os.Getenv(childEnv) {
	case "":
		return // not a child: nothing to check here
	case "SkipOrFail":
		SkipOrFail(t, "the environment is missing")
	case "RequireRoot":
		RequireRoot(t)
	case "Hardware":
		SkipNoHardware(t, "ntb", "no such hardware")
	default:
		t.Fatalf("unknown child %q", os.Getenv(childEnv))
	}
	t.Log("child ran past the skip")
}

// child runs TestChild in a fresh process with the given environment and
// returns its verbose output and whether it exited with success.
func child(t *testing.T, env ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		t.Fatalf("running the child: %v", err)
	}
	return string(out), err == nil
}

// TestSkipOrFail checks the rule itself: a skip for a missing
// environment is a skip outside CI and a failure under CI=true.
func TestSkipOrFail(t *testing.T) {
	out, ok := child(t, childEnv+"=SkipOrFail", "CI=true")
	if ok || !strings.Contains(out, "--- FAIL: TestChild") || !strings.Contains(out, "CI=true: cannot skip: the environment is missing") {
		t.Errorf("under CI=true SkipOrFail did not fail the test (exit ok %v):\n%s", ok, out)
	}
	for _, ci := range []string{"CI=", "CI=false", "CI=banana"} {
		out, ok = child(t, childEnv+"=SkipOrFail", ci)
		if !ok || !strings.Contains(out, "--- SKIP: TestChild") || !strings.Contains(out, "the environment is missing") {
			t.Errorf("with %s SkipOrFail did not skip with its reason (exit ok %v):\n%s", ci, ok, out)
		}
		if strings.Contains(out, "child ran past the skip") {
			t.Errorf("with %s the test ran on after SkipOrFail:\n%s", ci, out)
		}
	}
}

// TestRequireRoot checks that RequireRoot lets root through and, for
// anyone else, follows SkipOrFail.
func TestRequireRoot(t *testing.T) {
	out, ok := child(t, childEnv+"=RequireRoot", "CI=true")
	if os.Geteuid() == 0 {
		if !ok || !strings.Contains(out, "child ran past the skip") {
			t.Errorf("RequireRoot stopped a test running as root:\n%s", out)
		}
		return
	}
	if ok || !strings.Contains(out, "cannot skip: needs root") {
		t.Errorf("RequireRoot under CI=true without root did not fail:\n%s", out)
	}
}

// TestSkipNoHardware checks that a test for hardware the machine does
// not declare skips even under CI, and fails once WEFT_HW declares it.
func TestSkipNoHardware(t *testing.T) {
	out, ok := child(t, childEnv+"=Hardware", "CI=true", "WEFT_HW=")
	if !ok || !strings.Contains(out, "--- SKIP: TestChild") || !strings.Contains(out, "no such hardware") {
		t.Errorf("undeclared hardware: want a skip with the reason (exit ok %v):\n%s", ok, out)
	}
	out, ok = child(t, childEnv+"=Hardware", "WEFT_HW=rdma,ntb")
	if ok || !strings.Contains(out, "WEFT_HW declares ntb") {
		t.Errorf("declared but missing hardware: want a failure (exit ok %v):\n%s", ok, out)
	}
}

// TestInCI checks how the CI variable is read.
func TestInCI(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "1": true, "TRUE": true, "false": false, "0": false, "": false, "yes": false} {
		t.Setenv("CI", v)
		if got := InCI(); got != want {
			t.Errorf("CI=%q: InCI = %v, want %v", v, got, want)
		}
	}
}

// TestStopProcess: the process really stops: a goroutine that ticks
// every millisecond sees one gap as long as the stop.
func TestStopProcess(t *testing.T) {
	var gap, ticks atomic.Int64
	done := make(chan struct{})
	go func() {
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			now := time.Now()
			if g := int64(now.Sub(last)); g > gap.Load() {
				gap.Store(g)
			}
			last = now
			ticks.Add(1)
		}
	}()
	defer close(done)
	// waitTicks waits until the ticker has ticked past n: the stop must
	// find it running (a ticker that starts after the resume sees no
	// gap), and it must have ticked after the resume to measure the gap.
	waitTicks := func(n int64) {
		for ticks.Load() <= n {
			time.Sleep(time.Millisecond)
		}
	}
	waitTicks(0)
	StopProcess(t, 300*time.Millisecond)
	waitTicks(ticks.Load())
	if g := time.Duration(gap.Load()); g < 250*time.Millisecond {
		t.Fatalf("longest gap between ticks %v during a 300ms stop", g)
	}
}
