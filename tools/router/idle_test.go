package main

import (
	"testing"
	"time"
)

// TestIdleAllocs: polling an idle back-plane (no traffic) allocates
// nothing, on every back-plane kind the benchmark covers.
func TestIdleAllocs(t *testing.T) {
	for _, bp := range []string{"ntb", "ntb+batch"} {
		t.Run(bp, func(t *testing.T) {
			a, peer := meshPair(t, bp)
			f := func([]byte) {}
			allocs := testing.AllocsPerRun(20000, func() {
				a.Flush(a.links[1], time.Now())
				a.links[1].Receive(f)
				peer.Flush(peer.links[0], time.Now())
				peer.links[0].Receive(f)
			})
			if allocs != 0 {
				t.Errorf("idle poll allocates %v per iteration", allocs)
			}
		})
	}
}
