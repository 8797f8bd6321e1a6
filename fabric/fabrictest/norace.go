//go:build !race

package fabrictest

// raceScale stretches Timeout under the race detector (see race.go).
const raceScale = 1
