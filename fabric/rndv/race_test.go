//go:build race

package rndv

const raceEnabled = true
