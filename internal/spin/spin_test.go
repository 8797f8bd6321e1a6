package spin

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/weft-io/weft/internal/testenv"
)

func TestSpinThenSleep(t *testing.T) {
	const budget = 2 * time.Millisecond
	w := New(budget)
	// Wait until the first sleep, then check that the spin before it
	// lasted the whole budget: no clock in the test races the waiter's.
	start := time.Now()
	n := 0
	for w.sleep == 0 {
		if err := w.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if d := time.Since(start); d < budget {
		t.Fatalf("slept after %v of spinning (%d waits), want the budget %v", d, n, budget)
	}
	if w.sleep != FirstSleep {
		t.Fatalf("first sleep %v, want %v", w.sleep, FirstSleep)
	}
	for range 6 { // 20, 40, 80, 160, 320, 640 µs, then the ceiling
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

// A zero (or negative) budget does not spin at all: Options.Spin < 0
// means sleep at once.
func TestSpinZeroBudget(t *testing.T) {
	for _, b := range []time.Duration{0, -1} {
		s := Start(b)
		if s.Next(context.Background()) {
			t.Fatalf("budget %v: Next = true", b)
		}
	}
}

// Next spins for the budget, then stops for good.
func TestSpinBudget(t *testing.T) {
	start := time.Now()
	s := Start(time.Millisecond)
	for s.Next(context.Background()) {
	}
	if d := time.Since(start); d < time.Millisecond {
		t.Fatalf("spun %v, want the budget of 1ms", d)
	}
	if s.Next(context.Background()) {
		t.Fatal("Next after the budget")
	}
	if s.Rounds() < Every {
		t.Fatalf("%d rounds", s.Rounds())
	}
}

// A done context ends the spin at the next clock reading.
func TestSpinContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := Start(time.Hour)
	n := 0
	for s.Next(ctx) {
		n++
	}
	if n != Every-1 {
		t.Fatalf("%d rounds after cancel, want %d", n, Every-1)
	}
}

// BenchmarkNext is the cost Spin adds to one poll of a spinning wait
// (the clock, the context and a yield every Every rounds included).
func BenchmarkNext(b *testing.B) {
	ctx := context.Background()
	s := Start(time.Hour)
	for range b.N {
		if !s.Next(ctx) {
			b.Fatal("budget spent")
		}
	}
}

// BenchmarkInline is the loop the backends had before Spin, for
// reference: a counter, and the clock and context every Every rounds.
func BenchmarkInline(b *testing.B) {
	ctx := context.Background()
	deadline := time.Now().Add(time.Hour)
	for i := 1; i <= b.N; i++ {
		if i&(Every-1) == 0 {
			if ctx.Err() != nil || !time.Now().Before(deadline) {
				b.Fatal("budget spent")
			}
		}
	}
}

// TestWaiterSleepNoAllocs: a Waiter's sleeps, bounded by a context that
// can be cancelled, allocate nothing once a timer is pooled. The count is
// checked without the race detector (testenv.Race), under which
// sync.Pool drops a quarter of what it is given.
func TestWaiterSleepNoAllocs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := New(0)
	sleep := func() {
		w.Reset()
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if w.sleep == 0 {
			t.Fatal("a Waiter of no budget did not sleep")
		}
	}
	sleep()
	if n := testing.AllocsPerRun(20, sleep); n != 0 && !testenv.Race {
		t.Errorf("a Waiter's sleep: %v allocations", n)
	}
}
