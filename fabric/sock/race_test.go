//go:build race

package sock

// raceEnabled scales down the longest tests under the race detector,
// which slows the copy loops they check by an order of magnitude.
const raceEnabled = true
