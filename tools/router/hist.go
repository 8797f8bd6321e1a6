package main

import "math/bits"

// Hist is a log-linear latency histogram in nanoseconds (16 sub-buckets
// per power of two: at most 6% error), so a sink records every packet
// without allocating.
type Hist struct {
	Counts [64 * 16]uint64
	N      uint64
}

func histBucket(ns int64) int {
	if ns < 16 {
		if ns < 0 {
			ns = 0
		}
		return int(ns)
	}
	e := bits.Len64(uint64(ns)) - 5 // ns >> e is in [16, 32)
	return e*16 + int(uint64(ns)>>e)
}

func histValue(b int) float64 {
	if b < 32 {
		return float64(b)
	}
	e, m := b/16-1, b%16+16
	return float64(uint64(m)<<e) + float64(uint64(1)<<e)/2
}

// Add records one latency.
func (h *Hist) Add(ns int64) {
	b := histBucket(ns)
	if b >= len(h.Counts) {
		b = len(h.Counts) - 1
	}
	h.Counts[b]++
	h.N++
}

// Quantile returns the q-quantile in nanoseconds (0 if empty).
func (h *Hist) Quantile(q float64) float64 {
	if h.N == 0 {
		return 0
	}
	want := uint64(q*float64(h.N-1)) + 1
	var seen uint64
	for b, c := range h.Counts {
		if seen += c; seen >= want {
			return histValue(b)
		}
	}
	return 0
}
