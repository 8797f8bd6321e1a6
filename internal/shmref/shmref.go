// Package shmref is the reference that Weft's shared-memory latency is
// measured against: the plainest possible cross-process ping-pong, two
// processes spinning on two words of a shared mapping. Nothing can go
// faster between two processes, so it is the floor for the NTB backend.
package shmref

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-io/weft/internal/shm"
)

const (
	pingOff = 0
	pongOff = 128 // separate cache lines (and adjacent-line prefetch pairs)
	stop    = ^uint64(0)
	size    = 4096
)

func mapFile(path string, create bool) ([]byte, error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if create {
		if err := f.Truncate(size); err != nil {
			return nil, err
		}
	}
	return unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// Serve is the responder: it echoes every ping of the file at path until
// the pinger stops it.
func Serve(path string) error {
	runtime.LockOSThread()
	m, err := mapFile(path, false)
	if err != nil {
		return err
	}
	defer unix.Munmap(m)
	ping, pong := shm.U64(m, pingOff), shm.U64(m, pongOff)
	pong.Store(1) // ready
	last := uint64(0)
	for {
		v := ping.Load()
		if v == last {
			continue
		}
		if v == stop {
			return nil
		}
		pong.Store(v)
		last = v
	}
}

// Ping creates the file at path, waits for a responder started with
// start, runs iters round trips after warmup ones, and returns every
// round-trip time.
func Ping(path string, iters, warmup int, start func() error) ([]time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	m, err := mapFile(path, true)
	if err != nil {
		return nil, err
	}
	defer unix.Munmap(m)
	ping, pong := shm.U64(m, pingOff), shm.U64(m, pongOff)
	ping.Store(0)
	pong.Store(0)
	if err := start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for pong.Load() != 1 {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("shmref: responder did not start")
		}
		time.Sleep(100 * time.Microsecond)
	}
	rtt := make([]time.Duration, 0, iters)
	for i := 0; i < warmup+iters; i++ {
		v := uint64(i + 2)
		t0 := time.Now()
		ping.Store(v)
		for pong.Load() != v {
		}
		if i >= warmup {
			rtt = append(rtt, time.Since(t0))
		}
	}
	ping.Store(stop)
	return rtt, nil
}
