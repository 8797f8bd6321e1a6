package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// fakeTB is a test whose failures are recorded instead of reported, so
// that the helpers' failure paths can be checked: Fatalf records the
// message and ends the goroutine, as testing.T's does. The rest
// (Cleanup, Context, Logf) is the real test's.
type fakeTB struct {
	testing.TB
	msg string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs body with a fakeTB in a goroutine of its own and returns
// the message it failed with ("" if it did not) and how long it ran.
func failure(t *testing.T, body func(tb testing.TB)) (string, time.Duration) {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		body(f)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out after 10s waiting for the helper under test to return or fail")
	}
	return f.msg, time.Since(start)
}

// TestTimeoutMessage: the message names the bound as the brief says it
// (60s, not 1m0s).
func TestTimeoutMessage(t *testing.T) {
	if got := timedOut(maxTimeout); got != "timed out after 60s" {
		t.Errorf("timedOut(60s) = %q", got)
	}
	if got := timedOut(50 * time.Millisecond); got != "timed out after 0.05s" {
		t.Errorf("timedOut(50ms) = %q", got)
	}
}

// TestTimeoutFrom: WEFT_TIMEOUT shortens the bound and nothing else
// changes it: an empty, malformed, zero, negative or longer value leaves
// it at 60 s.
func TestTimeoutFrom(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"":      60 * time.Second,
		"15s":   15 * time.Second,
		"500ms": 500 * time.Millisecond,
		"60s":   60 * time.Second,
		"2m":    60 * time.Second,
		"0":     60 * time.Second,
		"-5s":   60 * time.Second,
		"15":    60 * time.Second,
		"soon":  60 * time.Second,
	} {
		if got := timeoutFrom(v); got != want {
			t.Errorf("timeoutFrom(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestRecv: a value that arrives is returned, a closed channel gives
// the zero value, and a channel that stays silent fails the test after
// the bound, naming what it waited for.
func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, "seven"); got != 7 {
		t.Fatalf("Recv = %d, want 7", got)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		ch <- 8
	}()
	if got := Recv(t, ch, "eight, sent later"); got != 8 {
		t.Fatalf("Recv = %d, want 8", got)
	}
	closed := make(chan error)
	close(closed)
	if err := Recv(t, closed, "a closed channel"); err != nil {
		t.Fatalf("Recv of a closed channel = %v, want nil", err)
	}

	silent := make(chan error)
	var got error = errors.New("unchanged")
	msg, took := failure(t, func(tb testing.TB) {
		got = recvWithin(tb, silent, "the server's answer", 50*time.Millisecond)
	})
	if msg != "timed out after 0.05s waiting for the server's answer" {
		t.Errorf("failure message %q", msg)
	}
	if took < 50*time.Millisecond {
		t.Errorf("failed after %v, before its 50ms bound", took)
	}
	if got == nil {
		t.Errorf("Recv returned after failing")
	}
}

// TestAwait: Await returns once f has, with f's effects visible; an f
// that blocks fails the test after the bound, naming what it waited for.
func TestAwait(t *testing.T) {
	var wg sync.WaitGroup
	n := 0
	wg.Go(func() {
		time.Sleep(20 * time.Millisecond)
		n = 1
	})
	Await(t, "the goroutine", wg.Wait)
	if n != 1 {
		t.Fatalf("Await returned before f did")
	}

	release := make(chan struct{})
	defer close(release) // the blocked f ends with the test
	after := false
	msg, took := failure(t, func(tb testing.TB) {
		awaitWithin(tb, "the stream goroutines", func() { <-release }, 50*time.Millisecond)
		after = true
	})
	if msg != "timed out after 0.05s waiting for the stream goroutines" {
		t.Errorf("failure message %q", msg)
	}
	if took < 50*time.Millisecond {
		t.Errorf("failed after %v, before its 50ms bound", took)
	}
	if after {
		t.Errorf("the test ran on after Await failed")
	}
}

// TestContext: the context of a test ends at the bound, with the cause
// that says so, or when the test ends, whichever comes first; a context
// that the bound did not end is not reported.
func TestContext(t *testing.T) {
	var ctx context.Context
	t.Run("ends", func(t *testing.T) {
		ctx = Context(t)
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) > Timeout || time.Until(dl) < Timeout-10*time.Second {
			t.Errorf("deadline %v (set %v), want %v from now", dl, ok, Timeout)
		}
		if ctx.Err() != nil {
			t.Errorf("a new context is done: %v", ctx.Err())
		}
	})
	if ctx.Err() == nil {
		t.Errorf("the context outlived its test")
	}
	if context.Cause(ctx) != context.Canceled {
		t.Errorf("the end of the test reads as the bound passing")
	}

	t.Run("bound", func(t *testing.T) {
		ctx = within(t, 20*time.Millisecond)
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("timed out after 10s waiting for a context bound to 20ms")
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) || context.Cause(ctx).Error() != "testenv.Context: timed out after 0.02s" {
			t.Errorf("at the bound: Err %v, Cause %v", ctx.Err(), context.Cause(ctx))
		}
	})
}

// TestDeadline: a read on a pipe with the Deadline set waits, and the
// deadline is Timeout away.
func TestDeadline(t *testing.T) {
	if d := time.Until(Deadline()); d > Timeout || d < Timeout-10*time.Second {
		t.Fatalf("Deadline is %v away, want %v", d, Timeout)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := r.SetReadDeadline(Deadline()); err != nil {
		t.Fatal(err)
	}
	go w.Write([]byte("x"))
	b := make([]byte, 1)
	if _, err := r.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("read %q, %v", b, err)
	}
}

// TestThreads: Threads counts the threads that goroutines locked to
// them hold, and the one that runs the test beside them. (Not more than
// before: the locked goroutines may take threads that idled.)
func TestThreads(t *testing.T) {
	RequireLinux(t)
	before := Threads(t)
	if before < 1 {
		t.Fatalf("Threads = %d", before)
	}
	const k = 5
	release := make(chan struct{})
	var locked sync.WaitGroup
	var ended sync.WaitGroup
	for range k {
		locked.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			runtime.LockOSThread() // not unlocked: the thread ends with the goroutine
			locked.Done()
			<-release
		}()
	}
	Await(t, "the goroutines to lock their threads", locked.Wait)
	if got := Threads(t); got < k+1 {
		t.Errorf("Threads = %d with %d goroutines parked on threads of their own and the test running", got, k)
	}
	close(release)
	Await(t, "the locked goroutines to end", ended.Wait)
}
