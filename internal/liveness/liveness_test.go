package liveness

import (
	"fmt"
	"testing"
	"time"
)

func TestStalls(t *testing.T) {
	ms := int64(time.Millisecond)
	s := New(20 * time.Millisecond) // allowance 40ms
	if s.Check(1000*ms) != 0 {
		t.Fatal("the first Check without Start must only start the clock")
	}
	for _, c := range []struct {
		now  int64
		want time.Duration
	}{
		{1020 * ms, 0}, // on time
		{1060 * ms, 0}, // late, within the allowance
		{7060 * ms, 6*time.Second - 40*time.Millisecond}, // a 6s stop
		{7080 * ms, 0},
	} {
		if got := s.Check(c.now); got != c.want {
			t.Fatalf("Check(%v) = %v, want %v", time.Duration(c.now), got, c.want)
		}
	}
	s = New(100 * time.Millisecond)
	s.Start(ms)
	if got := s.Check(501 * ms); got != 300*time.Millisecond {
		t.Fatalf("after a 500ms gap with a 100ms period: %v, want 300ms", got)
	}
}

func TestForward(t *testing.T) {
	stamp := int64(100)
	Forward(&stamp, 50, 1000)
	if stamp != 150 {
		t.Fatalf("stamp %d, want 150", stamp)
	}
	Forward(&stamp, time.Hour, 1000)
	if stamp != 1000 {
		t.Fatalf("stamp %d, want it held at now (1000)", stamp)
	}
}

// Example: a timer tick that declares its peer gone after a timeout of
// its own running time.
func Example() {
	const timeout = 5 * time.Second
	stalls := New(20 * time.Millisecond)
	heard := Now() // updated whenever the peer is heard
	stalls.Start(heard)

	tick := func() (gone bool) {
		now := Now()
		if st := stalls.Check(now); st > 0 {
			Forward(&heard, st, now)
		}
		return now-heard > int64(timeout)
	}
	fmt.Println("gone:", tick())
	// Output: gone: false
}
