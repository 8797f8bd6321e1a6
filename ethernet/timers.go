package ethernet

// Timers: the background goroutine's tick (handshake retries, the
// retransmission timeout, acknowledgements, keepalives, peer silence)
// and the wait for the shared queue.

import (
	"fmt"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/liveness"
)

// tickIdle is the period of the background goroutine's tick while no
// work is outstanding (1ms while there is).
const tickIdle = 20 * time.Millisecond

// sleep waits up to d for the shared queue to hand this endpoint a
// frame, or until done (nil: never) is closed. The goroutine parks in the
// runtime (a channel and a timer); no OS thread waits for it.
func (e *Endpoint) sleep(done <-chan struct{}, d time.Duration) { e.in.sleep(done, d) }

// run is the background goroutine: timers, acknowledgements, keepalives,
// and for a connection a listener accepts, the end of its handshake.
func (e *Endpoint) run() {
	defer close(e.done)
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		busy := e.tick()
		if e.lis != nil && !e.settled {
			e.settle()
		}
		d := tickIdle
		if busy {
			d = time.Millisecond
		}
		t.Reset(d)
	}
}

// tick runs the timers once and reports whether work is outstanding.
func (e *Endpoint) tick() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return false
	}
	e.now = clock()
	// Time this goroutine was not running (the process stopped, the host
	// paused or overloaded) is not the peer's silence (package liveness).
	if stall := e.stalls.Check(e.now); stall > 0 {
		liveness.Forward(&e.lastHeard, stall, e.now)
		liveness.Forward(&e.lastProgress, stall, e.now)
		if e.lis != nil {
			e.hsDeadline += int64(stall) // a listener's handshake in progress
		}
	}
	// The peer's frames are all read when the inbox emptied within the
	// budget and the shared ring was drained since: only then does a
	// quiet peer count as silent (see mux.drained). The drain's time is
	// read before the inbox: a drain that ends after it may have
	// delivered frames this poll did not see.
	drained := e.m.drained.Load()
	read := e.pollLocked(256) < 256
	if e.gone != nil {
		return false
	}
	if !e.up {
		if e.now >= e.nextHello {
			e.sendHelloLocked(ptHello)
			e.nextHello = e.now + int64(helloEvery)
		}
		return true
	}
	if e.sndUna != e.sndNxt {
		if e.now-e.lastProgress > int64(e.cfg.PeerTimeout) && read && drained > e.lastProgress+int64(e.cfg.PeerTimeout) {
			e.failLocked(fmt.Errorf("no acknowledgement for %v: %w", e.cfg.PeerTimeout, fabric.ErrRetryExceeded))
			return false
		}
		if e.rtoAt != 0 && e.now >= e.rtoAt {
			// Go back to the oldest unacknowledged packet; resend it even
			// into a closed window, as a probe for a lost window update.
			e.sndNext = e.sndUna
			e.goBackValid = false
			e.rtt.retransmitted()
			e.rto = min(2*e.rto, rtoMax)
			e.rtoAt = e.now + int64(e.rto)
			e.pumpLocked(true)
		}
	}
	e.pumpLocked(false)
	if e.ackPending > 0 {
		e.sendCtlLocked(ptAck, 0)
	}
	if e.now-e.lastSent > int64(min(keepalive, e.cfg.PeerTimeout/4)) {
		e.sendCtlLocked(ptAck, 0)
	}
	if e.now-e.lastHeard > int64(e.cfg.PeerTimeout) && read && drained > e.lastHeard+int64(e.cfg.PeerTimeout) {
		e.failLocked(fmt.Errorf("peer silent for %v: %w", e.cfg.PeerTimeout, fabric.ErrPeerGone))
		return false
	}
	return e.sndUna != e.sndNxt || e.ackPending > 0
}

// linger waits up to d for the peer to acknowledge every packet sent.
func (e *Endpoint) linger(d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		e.mu.Lock()
		done := !e.up || e.gone != nil || e.sndUna == e.sndNxt
		if !done {
			e.now = clock()
			e.pollLocked(256)
			e.pumpLocked(false)
			done = e.sndUna == e.sndNxt
		}
		e.mu.Unlock()
		if done || time.Now().After(deadline) {
			return
		}
		e.sleep(nil, time.Millisecond)
	}
}
