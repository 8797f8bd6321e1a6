// Package stats summarises latency samples the way perftest does.
package stats

import (
	"slices"
	"time"
)

// Summary holds order statistics of a sample.
type Summary struct {
	N                           int
	Min, Median, P99, P999, Max time.Duration
	Mean                        time.Duration
}

// Summarize sorts d in place and summarises it.
func Summarize(d []time.Duration) Summary {
	if len(d) == 0 {
		return Summary{}
	}
	slices.Sort(d)
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return Summary{N: len(d), Min: d[0], Median: q(0.5), P99: q(0.99), P999: q(0.999), Max: d[len(d)-1],
		Mean: sum / time.Duration(len(d))}
}

// Median returns the median of xs (sorting a copy).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	c := slices.Clone(xs)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}
