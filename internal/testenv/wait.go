package testenv

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"
)

// Timeout bounds every wait of a test that has no bound of its own: a
// wait that takes longer has hung, and the test fails with a message that
// names what it waited for, long before go test's own -timeout (ten
// minutes) would end the whole package with an empty log. It is a bound
// for a hang, not a measure of speed: the slowest legitimate wait of a
// test, under the race detector on a loaded machine, is far below it.
//
// It is 60 s, or shorter where WEFT_TIMEOUT (a duration, as "15s") says
// so: the mutation stage (internal/mutation) sets it for the tests it
// runs on broken code, whose hangs it need not wait a minute for. A value
// that does not parse, is not positive or is longer than 60 s is ignored:
// the bound can be tightened, never loosened.
var Timeout = timeoutFrom(os.Getenv(TimeoutEnv))

// TimeoutEnv is the environment variable that shortens Timeout.
const TimeoutEnv = "WEFT_TIMEOUT"

// maxTimeout is Timeout when TimeoutEnv does not shorten it.
const maxTimeout = 60 * time.Second

func timeoutFrom(v string) time.Duration {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > maxTimeout {
		return maxTimeout
	}
	return d
}

// Context returns a context for the blocking calls of a test (Accept,
// Dial, RecvWait, Wait): it is done Timeout after the call, or when the
// test ends (it derives from t.Context, which ends just before the
// t.Cleanup functions run). A call cut short returns the context's error;
// the test reports it beside the name of the call, as it would any error
// (t.Fatalf("Accept: %v", err)); once the bound has passed, t also logs
// that it did, at the end of the test. Make it once, outside a
// benchmark's loop.
func Context(t testing.TB) context.Context {
	t.Helper()
	return within(t, Timeout)
}

func within(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	bound := errors.New("testenv.Context: " + timedOut(d))
	ctx, cancel := context.WithTimeoutCause(t.Context(), d, bound)
	t.Cleanup(func() {
		if context.Cause(ctx) == bound {
			t.Logf("%v: the waits it cut short returned %v", bound, ctx.Err())
		}
		cancel()
	})
	return ctx
}

// Recv receives a value from ch and returns it (the zero value if ch is
// closed). If nothing arrives within Timeout the test fails with
// "timed out after 60s waiting for <what>", so what names the event the
// value stands for: "the server's Accept", "the sender's result". Call
// it from the test's goroutine (it calls t.Fatalf).
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return recvWithin(t, ch, what, Timeout)
}

func recvWithin[T any](t testing.TB, ch <-chan T, what string, d time.Duration) T {
	t.Helper()
	return recvTimer(t, ch, what, d, time.NewTimer(d))
}

// recvTimer is recvWithin with its timer made by the caller, before
// whatever it waits for starts: Await's f may be measured by
// testing.AllocsPerRun, which counts the allocations of every goroutine.
func recvTimer[T any](t testing.TB, ch <-chan T, what string, d time.Duration, timer *time.Timer) T {
	t.Helper()
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s waiting for %s", timedOut(d), what)
		panic("unreachable")
	}
}

// Await runs f in a goroutine of its own and waits for it to return, at
// most Timeout; past that the test fails with "timed out after 60s
// waiting for <what>". It bounds a call that takes no context and no
// deadline: wg.Wait, an io.ReadFull on a reader without deadlines, a
// cmd.Wait:
//
//	testenv.Await(t, "the stream goroutines", wg.Wait)
//
// Call it from the test's goroutine. f must not call t.FailNow (nor
// t.Fatal): report through variables the caller reads once Await has
// returned. A goroutine that hangs stays blocked when the test fails, so
// f should be one that the test's cleanup unblocks (by closing what it
// reads), as a blocked call in the test's own goroutine would need.
func Await(t testing.TB, what string, f func()) {
	t.Helper()
	awaitWithin(t, what, f, Timeout)
}

func awaitWithin(t testing.TB, what string, f func(), d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	timer := time.NewTimer(d)
	go func() {
		defer close(done)
		f()
	}()
	recvTimer(t, done, what, d, timer)
}

// Deadline returns a deadline for a wait on something that takes one
// (a net.Conn's SetReadDeadline, an os.File's SetDeadline): Timeout from
// now. A read cut short by it fails with os.ErrDeadlineExceeded, which
// the test reports beside what it read (t.Fatalf("reading the reply: %v",
// err)). It is for deadlines the test relies on, not ones it tests: a
// wait on a fabric/sock Conn, whose deadlines are the code under test,
// goes through Await, which a broken deadline cannot defeat.
func Deadline() time.Time { return time.Now().Add(Timeout) }

func timedOut(d time.Duration) string {
	return "timed out after " + strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}
