package main

import (
	"context"
	"testing"
	"time"
)

// TestSpinner checks the idle loops' wait policy: Spin < 0 never parks,
// 0 parks at once, and a budget spins (no park while it lasts) and parks
// once it has run out; work ends a spin.
func TestSpinner(t *testing.T) {
	ctx := context.Background()
	never := newSpinner(-1)
	for i := range 10000 {
		if never.idle(ctx) {
			t.Fatalf("Spin < 0 parked at idle poll %d", i)
		}
	}
	if !newSpinner(0).idle(ctx) {
		t.Fatal("Spin 0 did not park at the first idle poll")
	}
	// A budget of an hour spins through many polls without parking.
	long := newSpinner(time.Hour)
	for i := range 1000 {
		if long.idle(ctx) {
			t.Fatalf("a budget of an hour parked at idle poll %d", i)
		}
	}
	long.work()
	if long.on {
		t.Fatal("work did not end the spin")
	}
	// A short budget runs out: the loop parks within its budget (plus
	// one clock reading's polls), bounded here by a generous deadline.
	short := newSpinner(50 * time.Microsecond)
	deadline := time.Now().Add(time.Minute)
	for !short.idle(ctx) {
		if time.Now().After(deadline) {
			t.Fatal("a 50µs budget never parked")
		}
	}
	if short.on {
		t.Fatal("a spin that ran out is still under way")
	}
	// A cancelled context ends a spin at its next clock reading.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	parked := false
	for range 10000 {
		if long.idle(cctx) {
			parked = true
			break
		}
	}
	if !parked {
		t.Fatal("a spin went on past its context")
	}
}
