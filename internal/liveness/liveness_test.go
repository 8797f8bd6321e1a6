package liveness

import (
	"fmt"
	"testing"
	"time"
)

func TestStalls(t *testing.T) {
	ms := int64(time.Millisecond)
	s := New(20*time.Millisecond, 5*time.Second) // allowance 5s/16 = 312.5ms
	if s.Check(1000*ms) != 0 {
		t.Fatal("the first Check without Start must only start the clock")
	}
	for _, c := range []struct {
		now  int64
		want time.Duration
	}{
		{1020 * ms, 0},                                      // on time
		{1332 * ms, 0},                                      // late, within the allowance
		{7332 * ms, 6*time.Second - 312500*time.Microsecond}, // a 6s stop
		{7352 * ms, 0},
	} {
		if got := s.Check(c.now); got != c.want {
			t.Fatalf("Check(%v) = %v, want %v", time.Duration(c.now), got, c.want)
		}
	}

	// The allowance is four periods when that is longer.
	s = New(100*time.Millisecond, time.Second)
	s.Start(ms)
	if got := s.Check(501 * ms); got != 100*time.Millisecond {
		t.Fatalf("after a 500ms gap with a 100ms period: %v, want 100ms", got)
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
	stalls := New(20*time.Millisecond, timeout)
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
