package ntb

import (
	"testing"
	"time"
)

// TestPollPeriod: a quiet poll doubles its period up to the slow one, and
// a change drops it back to the fast one.
func TestPollPeriod(t *testing.T) {
	p := pollPeriod{fast: 2 * time.Millisecond, slow: 16 * time.Millisecond}
	want := []time.Duration{2, 4, 8, 16, 16}
	for i, w := range want {
		if got := p.next(i == 0); got != w*time.Millisecond {
			t.Fatalf("poll %d: %v, want %v", i, got, w*time.Millisecond)
		}
	}
	if got := p.next(true); got != 2*time.Millisecond {
		t.Fatalf("after a change: %v, want the fast period", got)
	}
	q := pollPeriod{fast: 10 * time.Millisecond, slow: 10 * time.Millisecond}
	if q.next(false) != 10*time.Millisecond || q.next(false) != 10*time.Millisecond {
		t.Fatal("a fixed period changed")
	}
}
