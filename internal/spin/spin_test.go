package spin

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSpinThenSleep(t *testing.T) {
	w := New(2 * time.Millisecond)
	start := time.Now()
	n := 0
	for time.Since(start) < 2*time.Millisecond {
		if err := w.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if w.sleep != 0 {
		t.Fatalf("slept within the spin budget (after %d waits)", n)
	}
	for range 64 + 10 { // the clock is read every 64 spins
		w.Wait(context.Background())
	}
	if w.sleep != MaxSleep {
		t.Fatalf("sleep step %v after the budget, want the ceiling %v", w.sleep, MaxSleep)
	}
	w.Reset()
	if w.Wait(context.Background()); w.sleep != 0 {
		t.Fatal("Reset did not restart the spin")
	}
}

func TestZeroBudgetSleepsAtOnce(t *testing.T) {
	var w Waiter
	w.Wait(context.Background())
	if w.sleep != FirstSleep {
		t.Fatalf("zero budget: first step %v, want a sleep of %v", w.sleep, FirstSleep)
	}
}

func TestContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := New(time.Second)
	if err := w.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v", err)
	}
}
