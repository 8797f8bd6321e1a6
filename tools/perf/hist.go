package main

import (
	"math"
	"math/bits"
)

// hist is a log-linear latency histogram in nanoseconds: exact below
// 64 ns, then 32 buckets per power of two (3% resolution). Recording
// allocates nothing.
type hist struct {
	b   [64 * 32]uint64
	n   uint64
	neg uint64 // negative samples (clock offset error), recorded as 0
	max int64
}

func bucketOf(v int64) int {
	if v < 64 {
		return int(v)
	}
	e := bits.Len64(uint64(v)) - 6
	return min(32*e+int(v>>e), len(hist{}.b)-1)
}

// bucketMid returns the middle of bucket i's range.
func bucketMid(i int) float64 {
	if i < 64 {
		return float64(i)
	}
	e := i/32 - 1
	m := i - 32*e
	return (float64(m) + 0.5) * math.Ldexp(1, e)
}

func (h *hist) add(v int64) {
	if v < 0 {
		h.neg++
		v = 0
	}
	h.b[bucketOf(v)]++
	h.n++
	h.max = max(h.max, v)
}

// quantile returns the q-quantile in ns.
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var c uint64
	for i, x := range h.b {
		c += x
		if c >= rank {
			return bucketMid(i)
		}
	}
	return float64(h.max)
}

func (h *hist) reset() { *h = hist{} }

// merge adds o's samples to h.
func (h *hist) merge(o *hist) {
	for i, x := range o.b {
		h.b[i] += x
	}
	h.n += o.n
	h.neg += o.neg
	h.max = max(h.max, o.max)
}
