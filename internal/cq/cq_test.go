package cq

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
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
	go func() {
		_, err := q.Wait(context.Background(), out)
		got <- err
	}()
	time.Sleep(5 * time.Millisecond)
	q.Push(fabric.Completion{Context: 9})
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := q.Wait(context.Background(), out)
		got <- err
	}()
	time.Sleep(5 * time.Millisecond)
	q.Close()
	q.Close()
	if err := <-got; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("wait after Close = %v", err)
	}
	if n := testing.AllocsPerRun(100, func() { q.Push(fabric.Completion{}); q.Poll(out) }); n != 0 {
		t.Fatalf("%v allocations per push+poll", n)
	}
}
