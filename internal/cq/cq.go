// Package cq is the completion queue shared by the backends: a bounded
// ring of fabric.Completion with a lock-free empty check for busy-polling
// and a channel-based sleep for blocking waits.
package cq

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/spin"
)

// Queue is a completion queue. Producers call Push; consumers Poll or
// Wait. All methods are safe for concurrent use.
type Queue struct {
	mu      sync.Mutex
	ring    []fabric.Completion // grows by doubling, up to size
	size    int
	head    uint64 // next to poll, under mu
	tail    uint64 // next to push, under mu
	count   atomic.Int64
	waiters atomic.Int32
	wake    chan struct{}
	done    chan struct{}
	closed  atomic.Bool
	once    sync.Once
	spin    spin.Budget
	// Overruns counts completions lost because the queue was full.
	Overruns atomic.Uint64
}

// New returns a queue of the given capacity (0: 4096) whose Wait busy-polls
// for spin before sleeping.
//
// The ring starts at initRing entries and doubles when a Push finds it
// full, up to the capacity: a connection that never has more than a few
// completions waiting holds 2 KB for them, not the 128 KB of a full
// default queue (which was half of what a RoCE queue pair allocated, and
// so of the memory per peer of a multi-peer endpoint).
func New(size int, spin time.Duration) *Queue {
	if size <= 0 {
		size = 4096
	}
	q := &Queue{ring: make([]fabric.Completion, min(size, initRing)), size: size, wake: make(chan struct{}, 1),
		done: make(chan struct{})}
	q.spin.Init(spin)
	return q
}

// initRing is the ring's starting length.
const initRing = 64

// Cap returns the capacity.
func (q *Queue) Cap() int { return q.size }

// Free returns the room left; a producer that must not lose a completion
// checks it before it starts the operation.
func (q *Queue) Free() int { return q.size - int(q.count.Load()) }

// grow doubles the ring (up to size), each waiting completion moving to
// its absolute position modulo the new length. The caller holds mu.
func (q *Queue) grow() {
	nr := make([]fabric.Completion, min(2*len(q.ring), q.size))
	for i := q.head; i != q.tail; i++ {
		nr[i%uint64(len(nr))] = q.ring[i%uint64(len(q.ring))]
	}
	q.ring = nr
}

// Len returns the number of completions waiting.
func (q *Queue) Len() int { return int(q.count.Load()) }

// Push appends a completion. It returns false, and counts an overrun, if
// the queue is full.
func (q *Queue) Push(c fabric.Completion) bool {
	q.mu.Lock()
	if q.tail-q.head == uint64(len(q.ring)) {
		if len(q.ring) == q.size {
			q.mu.Unlock()
			q.Overruns.Add(1)
			return false
		}
		q.grow()
	}
	q.ring[q.tail%uint64(len(q.ring))] = c
	q.tail++
	q.count.Add(1)
	q.mu.Unlock()
	if q.waiters.Load() > 0 {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// Poll moves up to len(out) completions into out.
func (q *Queue) Poll(out []fabric.Completion) int {
	if len(out) == 0 || q.count.Load() == 0 {
		return 0
	}
	q.mu.Lock()
	n := 0
	for n < len(out) && q.head != q.tail {
		out[n] = q.ring[q.head%uint64(len(q.ring))]
		q.head++
		n++
	}
	q.count.Add(-int64(n))
	q.mu.Unlock()
	return n
}

// Wait polls until it returns at least one completion, ctx is done or the
// queue is closed.
func (q *Queue) Wait(ctx context.Context, out []fabric.Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	if n := q.Poll(out); n > 0 {
		return n, nil
	}
	s := q.spin.Start()
	for s.Next(ctx) {
		if n := q.Poll(out); n > 0 {
			q.spin.Arrived(&s)
			return n, nil
		}
		if q.closed.Load() {
			return 0, errClosed
		}
	}
	q.spin.Slept(&s)
	for {
		q.waiters.Add(1)
		if n := q.Poll(out); n > 0 {
			q.waiters.Add(-1)
			return n, nil
		}
		if q.closed.Load() {
			q.waiters.Add(-1)
			return 0, errClosed
		}
		select {
		case <-q.wake:
		case <-q.done:
		case <-ctx.Done():
			q.waiters.Add(-1)
			return 0, ctx.Err()
		}
		q.waiters.Add(-1)
	}
}

var errClosed = fmt.Errorf("completion queue: %w", os.ErrClosed)

// Close wakes every waiter with os.ErrClosed. Completions still queued
// can be polled. It is idempotent.
func (q *Queue) Close() {
	q.once.Do(func() {
		q.closed.Store(true)
		close(q.done)
	})
}
