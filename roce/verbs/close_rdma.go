//go:build linux && cgo && rdma

package verbs

// Teardown and failure: Close lingers until what was sent is
// acknowledged, then destroys the device objects; a failed work request
// (or a disconnection) fails the endpoint once, with an event.

/*
#include "weft_cm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-io/weft/fabric"
)

// lifecycle owns the endpoint's life and failure: the lock held shared
// by every call that touches the device and exclusively by Close, which
// destroys it; the goroutines Close stops; the failure and the events
// that report it.
type lifecycle struct {
	life   sync.RWMutex
	closed atomic.Bool
	once   sync.Once
	stop   chan struct{}
	wg     sync.WaitGroup

	failed  atomic.Bool
	failErr error // set once, before failed
	evs     chan fabric.Event
}

// Close implements fabric.Endpoint. An RC endpoint first waits (at most
// two seconds) until what it sent is acknowledged, as a TCP close
// delivers what was written; then it destroys the queue pair and releases
// every region still registered.
func (ep *Endpoint) Close() error {
	ep.once.Do(func() {
		ep.closed.Store(true)
		close(ep.stop)
		for _, w := range []*waiter{&ep.swait, &ep.rwait} {
			if w.file != nil {
				w.file.Close() // wakes sleepers
			}
		}
		if ep.comp != nil {
			ep.comp.Close()
		}
		ep.wg.Wait()
		ep.life.Lock()
		defer ep.life.Unlock()
		ep.linger()
		ep.disconnectCM()
		ep.destroy()
	})
	return nil
}

// linger waits until the work requests posted so far have completed, by
// posting a signaled marker behind them (the send queue completes in
// order).
func (ep *Endpoint) linger() {
	if ep.ud || ep.qp == nil || ep.q == nil || ep.failed.Load() || ep.peer.QPN == 0 {
		return
	}
	ep.sendMu.Lock()
	defer ep.sendMu.Unlock()
	if ep.head == ep.tail {
		return
	}
	deadline := time.Now().Add(lingerTime)
	for int(ep.head-ep.tail) >= ep.depth {
		ep.reap()
		if ep.failed.Load() || time.Now().After(deadline) {
			return
		}
	}
	marker := ep.postInternal()
	for ep.tail <= marker && !ep.failed.Load() && time.Now().Before(deadline) {
		if ep.reap() == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// destroy releases every device object that exists, in dependency order.
func (ep *Endpoint) destroy() {
	ep.destroyQP()
	ep.releaseRegions()
	ep.releaseRings()
	ep.destroyQueues()
	ep.destroyCM()
}

// destroyQP destroys the queue pair (through the rdma_cm id that owns
// it, if one does) and the address handle.
func (ep *Endpoint) destroyQP() {
	if ep.qp != nil {
		if ep.cmid != nil {
			C.rdma_destroy_qp(ep.cmid)
		} else {
			C.weft_qp_err(ep.qp)
			C.ibv_destroy_qp(ep.qp)
		}
		ep.qp = nil
	}
	if ep.ah != nil {
		C.ibv_destroy_ah(ep.ah)
		ep.ah = nil
	}
}

// destroyQueues closes the completion channels' descriptors and
// destroys the completion queues and channels, the protection domain,
// the device context (unless librdmacm owns it) and the C queue.
func (ep *Endpoint) destroyQueues() {
	for _, w := range []*waiter{&ep.swait, &ep.rwait} {
		if w.file != nil {
			w.file.Close()
		}
	}
	if ep.scq != nil {
		C.ibv_destroy_cq(ep.scq)
		ep.scq = nil
	}
	if ep.rcq != nil {
		C.ibv_destroy_cq(ep.rcq)
		ep.rcq = nil
	}
	if ep.sch != nil {
		C.ibv_destroy_comp_channel(ep.sch)
		ep.sch = nil
	}
	if ep.rch != nil {
		C.ibv_destroy_comp_channel(ep.rch)
		ep.rch = nil
	}
	if ep.pd != nil {
		C.ibv_dealloc_pd(ep.pd)
		ep.pd = nil
	}
	if ep.ctx != nil && ep.cmid == nil { // an rdma_cm id's context is librdmacm's
		C.ibv_close_device(ep.ctx)
	}
	ep.ctx = nil
	if ep.q != nil {
		C.weft_q_free(ep.q)
		ep.q = nil
	}
}

// fail makes s the endpoint's failure, unless it has one already.
func (ep *Endpoint) fail(s fabric.Status) {
	if ep.failed.Load() {
		return
	}
	ep.sendMu.Lock() // failErr is written under sendMu
	if !ep.failed.Load() {
		ep.failLocked(s)
	}
	ep.sendMu.Unlock()
}

// failure is the error of a call op on a failed endpoint; nil if it has
// not failed.
func (ep *Endpoint) failure(op string) error {
	if ep.failed.Load() {
		return opErr(op, ep.failErr)
	}
	return nil
}

// failLocked is fail for callers that hold sendMu.
func (ep *Endpoint) failLocked(s fabric.Status) {
	if debug {
		fmt.Fprintf(os.Stderr, "verbs %p fail %v\n", ep, s)
	}
	ep.failErr = s.Err()
	kind := fabric.EventError
	if errors.Is(ep.failErr, fabric.ErrPeerGone) {
		kind = fabric.EventPeerGone
	}
	// The event is queued before failed is set: a call that sees the
	// endpoint failed finds the event already there.
	select {
	case ep.evs <- fabric.Event{Kind: kind, Time: time.Now(), Err: ep.failErr}:
	default:
		ep.stats.Drops[fabric.DropEvent].Add(1)
	}
	ep.failed.Store(true)
}
