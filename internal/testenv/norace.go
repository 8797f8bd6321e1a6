//go:build !race

package testenv

// Race reports whether the race detector is on. Under it some system
// calls' buffers escape (wake.Parker's drain of its descriptor allocates
// them), so a test that counts allocations on a path that parks checks
// the count only without it.
const Race = false
