package ntb

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/shm"
	"github.com/weft-io/weft/internal/testenv"
)

// awaitAbove polls until c exceeds v and reports whether it did before
// testenv's deadline. It allocates nothing, for tests that count.
func awaitAbove(c *atomic.Uint64, v uint64) bool {
	deadline := testenv.Deadline()
	for c.Load() <= v {
		if time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// TestSleepNoAllocs: a round trip whose two receives both sleep in the
// doorbell wait (no spin, and each side sends only once the other is in
// its sleep path) allocates nothing, on either side, with contexts that
// can be cancelled (each side its own, as fabric/sock's read and write
// deadlines): the wait watches a context once, not once per sleep
// (wake.CtxWatch). The count is checked without the race detector
// (testenv.Race).
func TestSleepNoAllocs(t *testing.T) {
	x, y := pair(t, ShmConfig{}, Config{Spin: -1})
	xd, yd := x.t.dev.(*ShmDevice), y.t.dev.(*ShmDevice)
	xctx, yctx := testenv.Context(t), testenv.Context(t)
	if xctx.Done() == nil || xctx.Done() == yctx.Done() {
		t.Fatal("the sides need contexts of their own that can be done")
	}
	msg := func(ep *Endpoint) []fabric.Message {
		r, err := ep.Alloc(64, fabric.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(r)}}}
	}
	xm, ym := msg(x), msg(y)
	// mark is yd's sleep count as y sends its answer: x sends its next
	// request once y has slept since.
	var mark atomic.Uint64
	echoErr := make(chan error, 1)
	go func() {
		for {
			if _, err := y.RecvWait(yctx, ym); err != nil {
				echoErr <- err
				return
			}
			mark.Store(yd.sleeps.Load())
			if _, err := y.SendWait(yctx, ym); err != nil {
				echoErr <- err
				return
			}
		}
	}()
	var failed error
	var skipped atomic.Uint64 // round trips whose receive did not sleep
	roundTrip := func() {
		if failed != nil {
			return
		}
		if !awaitAbove(&yd.sleeps, mark.Load()) {
			failed = errors.New("the echo never slept in its receive")
			return
		}
		before := xd.sleeps.Load()
		if _, err := x.SendWait(xctx, xm); err != nil {
			failed = err
			return
		}
		// The echo answers at once: this receive sleeps unless it is
		// quicker than a send and a receive of the other side, which the
		// count after the run reports.
		if _, err := x.RecvWait(xctx, xm); err != nil {
			failed = err
			return
		}
		if xd.sleeps.Load() == before {
			skipped.Add(1)
		}
	}
	for range 5 { // first registrations, lazily grown state
		roundTrip()
	}
	skipped.Store(0)
	xs, ys := xd.sleeps.Load(), yd.sleeps.Load()
	const runs = 100
	allocs := testing.AllocsPerRun(runs, roundTrip)
	if failed != nil {
		t.Fatal(failed)
	}
	select {
	case err := <-echoErr:
		t.Fatalf("echo: %v", err)
	default:
	}
	if allocs != 0 && !testenv.Race {
		t.Errorf("a round trip whose receives sleep: %v allocations", allocs)
	}
	slept := runs + 1 - skipped.Load()
	if yd.sleeps.Load()-ys < runs || slept == 0 {
		t.Fatalf("the echo slept %d times, the requester in %d of %d round trips: the sleep path was not covered",
			yd.sleeps.Load()-ys, slept, runs+1)
	}
	t.Logf("sleeps: echo %d, requester %d in %d round trips", yd.sleeps.Load()-ys, xd.sleeps.Load()-xs, runs+1)
}

// TestDBWaitCancelKept: a DBWait that sleeps on a context whose
// registration an earlier wait of its bit left (wake.CtxWatch) wakes when
// the context is done, and a DBWait on another bit, with a context of its
// own, sleeps on.
func TestDBWaitCancelKept(t *testing.T) {
	a, b := openPair(t, ShmConfig{DoorbellBits: 8})
	waitLink(t, b, true)
	waiters := shm.U32(b.my, sideDBWaiters)
	// sleep runs DBWait(ctx, bit) until it returns bits or an error
	// (a (0, nil) is a WakeLocal: it waits again), once b has a sleeper
	// more than before.
	type result struct {
		set uint64
		err error
	}
	sleep := func(ctx context.Context, bit uint64) <-chan result {
		n := waiters.Load()
		ch := make(chan result, 1)
		go func() {
			for {
				set, err := b.DBWait(ctx, bit)
				if set != 0 || err != nil {
					ch <- result{set, err}
					return
				}
			}
		}()
		if !testenv.Eventually(testenv.Timeout, func() bool { return waiters.Load() > n }) {
			t.Fatal("timed out waiting for the DBWait to sleep")
		}
		return ch
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other, cancelOther := context.WithCancel(context.Background())
	defer cancelOther()
	for range 3 { // the first registers; the others reuse it
		ch := sleep(ctx, 0b1)
		a.PeerDBSet(0b1)
		if r := testenv.Recv(t, ch, "the DBWait woken by its doorbell"); r.set != 0b1 || r.err != nil {
			t.Fatalf("DBWait = %#b, %v", r.set, r.err)
		}
		b.DBClear(0b1)
	}
	bystander := sleep(other, 0b10)
	ch := sleep(ctx, 0b1)
	cancel()
	if r := testenv.Recv(t, ch, "the DBWait whose context was cancelled"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("DBWait after cancel = %#b, %v", r.set, r.err)
	}
	select {
	case r := <-bystander:
		t.Fatalf("the other bit's DBWait returned %#b, %v on another context's cancel", r.set, r.err)
	default:
	}
	a.PeerDBSet(0b10)
	if r := testenv.Recv(t, bystander, "the other bit's DBWait"); r.set != 0b10 || r.err != nil {
		t.Fatalf("the other bit's DBWait = %#b, %v", r.set, r.err)
	}
}
