//go:build race

package vnet

const raceEnabled = true
