package wake

import (
	"context"
	"testing"

	"github.com/weft-io/weft/internal/testenv"
)

// newWatch returns a CtxWatch whose function sends on the returned
// channel.
func newWatch() (*CtxWatch, chan struct{}) {
	fired := make(chan struct{}, 16)
	w := new(CtxWatch)
	w.Init(func() { fired <- struct{}{} })
	return w, fired
}

// TestCtxWatchFires: a context done while a wait holds the watch runs its
// function, whether the wait holds a kept registration, one a wait before
// it left, or one of its own (every kept one held by others), and a
// context whose registration was replaced is registered again.
func TestCtxWatchFires(t *testing.T) {
	t.Run("kept", func(t *testing.T) {
		w, fired := newWatch()
		ctx, cancel := context.WithCancel(context.Background())
		w.Hold(ctx).Release() // registers, kept
		h := w.Hold(ctx)      // reuses
		defer h.Release()
		cancel()
		testenv.Recv(t, fired, "the function of a held watch whose context is done")
	})
	t.Run("own", func(t *testing.T) {
		w, fired := newWatch()
		for range CtxWatchSlots {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			defer w.Hold(ctx).Release()
		}
		ctx, cancel := context.WithCancel(context.Background())
		h := w.Hold(ctx)
		defer h.Release()
		if h.own == nil {
			t.Fatal("a hold with every slot held uses a slot")
		}
		cancel()
		testenv.Recv(t, fired, "the function of a hold with a registration of its own")
	})
	t.Run("replaced", func(t *testing.T) {
		w, fired := newWatch()
		ctx, cancel := context.WithCancel(context.Background())
		w.Hold(ctx).Release()
		for range CtxWatchSlots { // the least recently used goes: ctx's
			other, cancelOther := context.WithCancel(context.Background())
			defer cancelOther()
			w.Hold(other).Release()
		}
		h := w.Hold(ctx)
		defer h.Release()
		cancel()
		testenv.Recv(t, fired, "the function of a context registered again")
	})
}

// TestCtxWatchDoneBeforeHold: a hold of a context that was done while
// no wait held its kept registration (which fired and ran nothing) runs
// the function itself: a wait that checked its context just before it
// was cancelled, then held, is woken.
func TestCtxWatchDoneBeforeHold(t *testing.T) {
	w, fired := newWatch()
	ctx, cancel := context.WithCancel(context.Background())
	w.Hold(ctx).Release()
	cancel()
	if !testenv.Eventually(testenv.Timeout, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.fires == 1
	}) {
		t.Fatal("timed out waiting for the registration to fire")
	}
	select {
	case <-fired:
		t.Fatal("the registration of a context no wait held ran the function")
	default:
	}
	h := w.Hold(ctx)
	defer h.Release()
	testenv.Recv(t, fired, "the function of a hold of a context done already")
}

// TestCtxWatchNoAllocs: holds of the last contexts, and of a context that
// is never done, allocate nothing; a new context is registered once.
func TestCtxWatchNoAllocs(t *testing.T) {
	w, _ := newWatch()
	read, cancelRead := context.WithCancel(context.Background())
	defer cancelRead()
	write, cancelWrite := context.WithCancel(context.Background())
	defer cancelWrite()
	cycle := func() {
		h := w.Hold(read)
		w.Hold(write).Release() // both held at once, then one at a time
		h.Release()
		w.Hold(write).Release()
		w.Hold(context.Background()).Release()
	}
	cycle()
	if n := testing.AllocsPerRun(100, cycle); n != 0 {
		t.Errorf("holds of kept contexts: %v allocations", n)
	}
	if n := testing.AllocsPerRun(10, func() {
		ctx, cancel := context.WithCancel(context.Background())
		w.Hold(ctx).Release()
		cancel()
	}); n == 0 {
		t.Error("a new context each time allocates nothing: is it registered?")
	}
}

// TestCtxWatchStop: Stop drops the registrations and the next hold
// registers again.
func TestCtxWatchStop(t *testing.T) {
	w, fired := newWatch()
	ctx, cancel := context.WithCancel(context.Background())
	w.Hold(ctx).Release()
	w.Stop()
	for i := range w.slots {
		if w.slots[i].stop != nil || w.slots[i].done != nil {
			t.Fatalf("slot %d still registered after Stop", i)
		}
	}
	h := w.Hold(ctx)
	defer h.Release()
	cancel()
	testenv.Recv(t, fired, "the function of a context held after Stop")
}
