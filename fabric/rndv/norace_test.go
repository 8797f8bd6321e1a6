//go:build !race

package rndv

const raceEnabled = false
