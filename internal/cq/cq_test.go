package cq

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

func TestQueue(t *testing.T) {
	q := New(4, 0)
	for i := 0; i < 5; i++ {
		ok := q.Push(fabric.Completion{Context: uint64(i)})
		if ok != (i < 4) {
			t.Fatalf("push %d = %v", i, ok)
		}
	}
	if q.Overruns.Load() != 1 || q.Len() != 4 || q.Free() != 0 {
		t.Fatalf("overruns %d len %d free %d", q.Overruns.Load(), q.Len(), q.Free())
	}
	out := make([]fabric.Completion, 3)
	if n := q.Poll(out); n != 3 || out[0].Context != 0 || out[2].Context != 2 {
		t.Fatalf("poll = %d %v", n, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if n, err := q.Wait(ctx, out); n != 1 || err != nil || out[0].Context != 3 {
		t.Fatalf("wait = %d %v %v", n, err, out[0])
	}
	short, c2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer c2()
	if _, err := q.Wait(short, out); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on empty = %v", err)
	}
	// A sleeping waiter is woken by Push, and by Close.
	got := make(chan error, 1)
	bg := testenv.Context(t)
	go func() {
		_, err := q.Wait(bg, out)
		got <- err
	}()
	if !testenv.Eventually(testenv.Timeout, func() bool { return q.waiters.Load() != 0 }) {
		t.Fatal("timed out waiting for the waiter to sleep")
	}
	q.Push(fabric.Completion{Context: 9})
	if err := testenv.Recv(t, got, "the Wait a Push wakes"); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := q.Wait(bg, out)
		got <- err
	}()
	if !testenv.Eventually(testenv.Timeout, func() bool { return q.waiters.Load() != 0 }) {
		t.Fatal("timed out waiting for the waiter to sleep")
	}
	q.Close()
	q.Close()
	if err := testenv.Recv(t, got, "the Wait a Close wakes"); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("wait after Close = %v", err)
	}
	if n := testing.AllocsPerRun(100, func() { q.Push(fabric.Completion{}); q.Poll(out) }); n != 0 {
		t.Fatalf("%v allocations per push+poll", n)
	}
}

// TestGrow: the ring starts small and doubles up to the capacity while
// completions wait, wrapped around its end, and keeps their order; at
// the capacity Push refuses and counts an overrun.
func TestGrow(t *testing.T) {
	const size = 1000 // not a power of two: the last doubling is partial
	q := New(size, 0)
	if len(q.ring) != initRing || q.Cap() != size || q.Free() != size {
		t.Fatalf("new: ring %d cap %d free %d", len(q.ring), q.Cap(), q.Free())
	}
	out := make([]fabric.Completion, 7)
	next, want := uint64(0), uint64(0)
	// Push 5, poll 3, over and over: the backlog grows by 2 a round, so
	// head and tail wrap at every ring length on the way up.
	for q.Free() >= 5 {
		for range 5 {
			if !q.Push(fabric.Completion{Context: next}) {
				t.Fatalf("push %d refused with %d free", next, q.Free())
			}
			next++
		}
		n := q.Poll(out[:3])
		for _, c := range out[:n] {
			if c.Context != want {
				t.Fatalf("polled %d, want %d (ring %d)", c.Context, want, len(q.ring))
			}
			want++
		}
	}
	if len(q.ring) != size {
		t.Fatalf("ring %d at %d waiting, want grown to %d", len(q.ring), q.Len(), size)
	}
	for q.Free() > 0 {
		q.Push(fabric.Completion{Context: next})
		next++
	}
	if q.Push(fabric.Completion{}) || q.Overruns.Load() != 1 {
		t.Fatalf("push at capacity accepted (overruns %d)", q.Overruns.Load())
	}
	for q.Len() > 0 {
		n := q.Poll(out)
		for _, c := range out[:n] {
			if c.Context != want {
				t.Fatalf("polled %d, want %d", c.Context, want)
			}
			want++
		}
	}
	if want != next {
		t.Fatalf("polled %d of %d", want, next)
	}
}
