//go:build linux && cgo && rdma

package verbs

// The receive side: the ring of receive slots, messages copied out of
// it or lent as views, and the wait for completions shared with the send
// side (block, compQueue).

/*
#include "weft_cm.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/weft-io/weft/fabric"
)

// receiver owns the receive queue: the ring of receive slots (one
// registered mapping), which of them are given back and reposted, the
// queue of slots lent as views and the receive completion channel.
// recvMu guards all of it.
type receiver struct {
	recvMu  sync.Mutex
	rout    []C.struct_weft_wc
	rbuf    []byte
	rmr     *C.struct_ibv_mr
	rslot   int
	rposted uint32 // receive work requests posted so far; the next repost starts at slot rposted%depth
	rfree   []bool // slot completed and given back, waiting to be reposted in order
	vq      []int  // slots of views not yet released, a queue
	vHead   int    // oldest outstanding view (index into vq, mod depth)
	vTail   int
	rwait   waiter
}

// Recv implements fabric.Endpoint.
func (ep *Endpoint) Recv(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.recv(msgs)
}

// RecvWait implements fabric.Endpoint.
func (ep *Endpoint) RecvWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(msgs) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.rwait, func() (int, error) { return ep.recv(msgs) })
}

func (ep *Endpoint) recv(msgs []fabric.Message) (int, error) {
	if ep.closed.Load() {
		return 0, opErr("recv", fabric.ErrClosed)
	}
	limit := len(msgs)
	var verr error
	for i := range msgs {
		if _, err := fabric.CheckSGEs(msgs[i].SGEs, ep.dom, fabric.AccessLocalWrite); err != nil {
			limit, verr = i, opErr("recv", err)
			break
		}
	}
	if limit == 0 {
		return 0, verr
	}
	ep.recvMu.Lock()
	out, bytes, flushed := ep.pollRecvLocked(limit, func(i, slot int, data []byte, flags fabric.MsgFlags, imm uint32) {
		m := &msgs[i]
		m.Flags, m.Imm = flags, imm
		if flags&fabric.FlagRemoteWrite != 0 {
			m.Len = len(data)
		} else {
			m.Len = fabric.Scatter(m.SGEs, data)
			if m.Len < len(data) {
				m.Flags |= fabric.FlagTruncated
				ep.stats.Drops[fabric.DropTruncated].Add(1)
			}
		}
		ep.rfree[slot] = true
	})
	ep.recvMu.Unlock()
	return ep.endRecv(out, bytes, flushed, verr)
}

// RecvViews implements fabric.ViewReceiver: each view is a receive slot,
// held (not reposted) until it is released. Held slots are missing from
// the receive queue, so a peer that outruns the releases meets RNR.
func (ep *Endpoint) RecvViews(views []fabric.View) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.recvViews(views)
}

// RecvViewsWait implements fabric.ViewReceiver.
func (ep *Endpoint) RecvViewsWait(ctx context.Context, views []fabric.View) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(views) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.rwait, func() (int, error) { return ep.recvViews(views) })
}

func (ep *Endpoint) recvViews(views []fabric.View) (int, error) {
	if ep.closed.Load() {
		return 0, opErr("recv", fabric.ErrClosed)
	}
	ep.recvMu.Lock()
	want := min(len(views), ep.depth-(ep.vTail-ep.vHead))
	if want == 0 && len(views) > 0 {
		ep.recvMu.Unlock()
		return 0, opErr("recv", fmt.Errorf("all %d receive slots are held by views, release some first: %w", ep.depth, fabric.ErrInvalid))
	}
	out, bytes, flushed := ep.pollRecvLocked(want, func(i, slot int, data []byte, flags fabric.MsgFlags, imm uint32) {
		views[i] = fabric.View{Data: data, Len: len(data), Flags: flags, Imm: imm}
		if flags&fabric.FlagRemoteWrite != 0 {
			views[i].Data = nil
		}
		ep.vq[ep.vTail%ep.depth] = slot
		ep.vTail++
	})
	ep.recvMu.Unlock()
	return ep.endRecv(out, bytes, flushed, nil)
}

// ReleaseViews implements fabric.ViewReceiver: the slots go back to the
// receive queue, in order.
func (ep *Endpoint) ReleaseViews(n int) error {
	if ep.closed.Load() {
		return opErr("release", fabric.ErrClosed)
	}
	ep.recvMu.Lock()
	defer ep.recvMu.Unlock()
	if held := ep.vTail - ep.vHead; n < 0 || n > held {
		return opErr("release", fmt.Errorf("%d views, %d outstanding: %w", n, held, fabric.ErrInvalid))
	}
	for ; n > 0; n-- {
		ep.rfree[ep.vq[ep.vHead%ep.depth]] = true
		ep.vHead++
	}
	ep.repostLocked()
	return nil
}

// OutstandingViews implements fabric.ViewReceiver.
func (ep *Endpoint) OutstandingViews() int {
	ep.recvMu.Lock()
	defer ep.recvMu.Unlock()
	return ep.vTail - ep.vHead
}

// pollRecvLocked polls up to max receive completions and hands each
// successful one to deliver (with its index among the delivered, its
// slot, payload and flags); deliver marks the slot free or holds it.
// Slots given back so far are then reposted.
func (ep *Endpoint) pollRecvLocked(max int, deliver func(i, slot int, data []byte, flags fabric.MsgFlags, imm uint32)) (out, bytes int, flushed bool) {
	k := int(C.weft_poll_recv(ep.q, C.int(min(max, 64))))
	if debug && k != 0 {
		fmt.Fprintf(os.Stderr, "verbs %p recv k=%d status0=%d len0=%d\n", ep, k, ep.rout[0].status, ep.rout[0].byte_len)
	}
	for i := 0; i < k; i++ {
		wc := &ep.rout[i]
		slot := int(wc.wr_id)
		if wc.status != C.IBV_WC_SUCCESS {
			flushed = true
			if st := mapStatus(uint32(wc.status)); st != fabric.StatusFlushed {
				ep.fail(st)
			}
			if slot < ep.depth {
				ep.rfree[slot] = true
			}
			continue
		}
		n := int(wc.byte_len)
		off := 0
		if ep.ud {
			off = udGRH
		}
		if slot >= ep.depth || n > ep.rslot || n < off {
			ep.stats.Drops[fabric.DropMalformed].Add(1)
			if slot < ep.depth {
				ep.rfree[slot] = true
			}
			continue
		}
		end := slot*ep.rslot + n
		data := ep.rbuf[slot*ep.rslot+off : end : end]
		var flags fabric.MsgFlags
		if wc.opcode == C.IBV_WC_RECV_RDMA_WITH_IMM {
			flags = fabric.FlagRemoteWrite
		}
		if wc.wc_flags&C.IBV_WC_WITH_IMM != 0 {
			flags |= fabric.FlagImm
		}
		deliver(out, slot, data, flags, uint32(wc.imm))
		bytes += len(data)
		out++
	}
	if k > 0 && !flushed {
		ep.repostLocked()
	}
	return out, bytes, flushed
}

// repostLocked reposts, as one chain, the run of given-back slots that
// starts at the oldest consumed one: the receive queue completes in
// order, so that is where the next post must start.
func (ep *Endpoint) repostLocked() {
	if ep.failed.Load() {
		return
	}
	d := uint32(ep.depth)
	first := ep.rposted % d
	n := 0
	for n < ep.depth && ep.rfree[(first+uint32(n))%d] {
		n++
	}
	if n == 0 {
		return
	}
	if rc := C.weft_post_recv(ep.q, C.uint32_t(first), C.int(n)); rc == 0 {
		for i := 0; i < n; i++ {
			ep.rfree[(first+uint32(i))%d] = false
		}
		ep.rposted += uint32(n)
	}
}

// endRecv counts a receive burst and turns a flushed queue into the
// endpoint's failure.
func (ep *Endpoint) endRecv(out, bytes int, flushed bool, verr error) (int, error) {
	if out > 0 {
		ep.stats.RxMessages.Add(uint64(out))
		ep.stats.RxPackets.Add(uint64(out))
		ep.stats.RxBytes.Add(uint64(bytes))
		return out, nil
	}
	if flushed && !ep.failed.Load() {
		// Receives are flushed when the queue pair is in the error
		// state: find out why from the send side.
		ep.sendMu.Lock()
		ep.reap()
		if !ep.failed.Load() {
			if ep.cmid != nil {
				// Only a disconnection moves an rdma_cm queue pair to
				// the error state without a failed work request: the
				// peer's DREQ (librdmacm flushes on it), seen here
				// before watchCM reports it.
				ep.failLocked(fabric.StatusPeerClosed)
			} else {
				ep.failLocked(fabric.StatusFlushed)
			}
		}
		ep.sendMu.Unlock()
	}
	if err := ep.failure("recv"); err != nil {
		return 0, err
	}
	return 0, verr
}

// block runs try until it makes progress: busy-polling for the spin
// budget, then sleeping on w's completion channel. Callers hold life
// shared.
func (ep *Endpoint) block(ctx context.Context, w *waiter, try func() (int, error)) (int, error) {
	if ep.spin > 0 {
		deadline := time.Now().Add(ep.spin)
		for i := 0; ; i++ {
			if n, err := try(); n > 0 || err != nil {
				return n, err
			}
			if i&63 == 63 {
				if ctx.Err() != nil || time.Now().After(deadline) {
					break
				}
			}
		}
	}
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		if ep.closed.Load() {
			return 0, opErr("wait", fabric.ErrClosed)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		C.weft_req_notify(w.cq)
		if n, err := try(); n > 0 || err != nil {
			return n, err
		}
		if stop == nil {
			stop = context.AfterFunc(ctx, func() { w.file.SetReadDeadline(time.Unix(1, 0)) })
		}
		w.file.SetReadDeadline(time.Now().Add(waitSlice))
		err := w.rc.Read(func(uintptr) bool { return C.weft_get_event(w.ch) != 0 })
		ep.stats.Wakeups.Add(1)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			if ep.closed.Load() || errors.Is(err, os.ErrClosed) {
				return 0, opErr("wait", fabric.ErrClosed)
			}
			return 0, opErr("wait", err)
		}
	}
}

// ---- completions ----

// compQueue is the endpoint's fabric.CompletionQueue.
type compQueue struct{ ep *Endpoint }

// Poll implements fabric.CompletionQueue.
func (c compQueue) Poll(out []fabric.Completion) int {
	ep := c.ep
	ep.life.RLock()
	defer ep.life.RUnlock()
	if !ep.closed.Load() {
		ep.sendMu.Lock()
		ep.reap()
		ep.sendMu.Unlock()
	}
	return ep.comp.Poll(out)
}

// Wait implements fabric.CompletionQueue.
func (c compQueue) Wait(ctx context.Context, out []fabric.Completion) (int, error) {
	ep := c.ep
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(out) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.swait, func() (int, error) {
		if ep.closed.Load() {
			return 0, opErr("wait", fabric.ErrClosed)
		}
		if ep.comp.Len() == 0 {
			ep.sendMu.Lock()
			ep.reap()
			ep.sendMu.Unlock()
		}
		return ep.comp.Poll(out), nil
	})
}

// Len implements fabric.CompletionQueue.
func (c compQueue) Len() int { return c.ep.comp.Len() }
