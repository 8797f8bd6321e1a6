package measure

import (
	"math"
	"math/bits"
)

// Hist is a log-linear latency histogram in nanoseconds: exact below
// 64 ns, then 32 buckets per power of two (3% resolution). Recording
// allocates nothing. The zero value is empty and ready.
type Hist struct {
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
	return min(32*e+int(v>>e), len(Hist{}.b)-1)
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

// Add records one latency in ns; a negative one (the clocks of two
// processes disagree by more than it) is counted by Neg and recorded as 0.
func (h *Hist) Add(ns int64) {
	if ns < 0 {
		h.neg++
		ns = 0
	}
	h.b[bucketOf(ns)]++
	h.n++
	h.max = max(h.max, ns)
}

// Quantile returns the q-quantile in ns (nearest rank; 0 if empty).
func (h *Hist) Quantile(q float64) float64 {
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

// N returns the number of samples recorded.
func (h *Hist) N() uint64 { return h.n }

// Neg returns the number of negative samples recorded (as 0).
func (h *Hist) Neg() uint64 { return h.neg }

// Max returns the largest sample recorded, exactly.
func (h *Hist) Max() int64 { return h.max }

// Reset empties h.
func (h *Hist) Reset() { *h = Hist{} }

// Merge adds o's samples to h.
func (h *Hist) Merge(o *Hist) {
	for i, x := range o.b {
		h.b[i] += x
	}
	h.n += o.n
	h.neg += o.neg
	h.max = max(h.max, o.max)
}
