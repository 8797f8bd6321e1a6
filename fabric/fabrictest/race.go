//go:build race

package fabrictest

// raceScale stretches Timeout under the race detector, which slows the
// many-endpoint cases (64 clients streaming at once) several times over.
const raceScale = 3
