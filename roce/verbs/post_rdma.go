//go:build linux && cgo && rdma

package verbs

// The post path: sends, RMA and atomics become chains of work requests,
// one doorbell (ibv_post_send) per burst; reap turns send completions
// into fabric completions.

/*
#include "weft_cm.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
)

// opcodes of ibv_wr_opcode, and internal marks of a send slot.
const (
	wrWrite    = C.IBV_WR_RDMA_WRITE
	wrWriteImm = C.IBV_WR_RDMA_WRITE_WITH_IMM
	wrSend     = C.IBV_WR_SEND
	wrSendImm  = C.IBV_WR_SEND_WITH_IMM
	wrRead     = C.IBV_WR_RDMA_READ
	wrCmpSwap  = C.IBV_WR_ATOMIC_CMP_AND_SWP
	wrFetchAdd = C.IBV_WR_ATOMIC_FETCH_AND_ADD
)

// sendSlot is what the endpoint remembers of a posted work request, at
// index seq % depth.
type sendSlot struct {
	ctx      uint64
	op       fabric.Op
	len      int
	user     bool // the caller asked for a completion
	internal bool // keep-alive or linger marker: never reported
}

// sender owns the send queue: the C work request and SGE arrays, the
// slots of what is posted, the bounce buffers and the send completion
// channel. sendMu guards all of it (and failErr).
type sender struct {
	sendMu   sync.Mutex
	swr      []C.struct_weft_swr
	sge      []C.struct_ibv_sge
	sout     []C.struct_weft_wc
	slots    []sendSlot
	head     uint64 // sequence number of the next work request
	tail     uint64 // every work request before tail has completed
	signal   int    // signal every signal-th work request at least
	sinceSig int
	bounce   []byte
	bounceMR *C.struct_ibv_mr
	swait    waiter
}

// Send implements fabric.Endpoint.
func (ep *Endpoint) Send(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.post(msgs, fabric.OpSend, 0, 0)
}

// Write implements fabric.Endpoint.
func (ep *Endpoint) Write(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.post(msgs, fabric.OpWrite, 0, 0)
}

// Read implements fabric.Endpoint.
func (ep *Endpoint) Read(msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	return ep.post(msgs, fabric.OpRead, 0, 0)
}

// FetchAdd posts an atomic fetch-and-add of add to the 8 bytes at remote;
// the old value lands in sge (8 bytes, local write). ctx and flags work as
// in fabric.Message.
func (ep *Endpoint) FetchAdd(sge fabric.SGE, remote fabric.RemoteIOV, add uint64, ctx uint64, flags fabric.MsgFlags) error {
	return ep.atomic(fabric.OpFetchAdd, sge, remote, add, 0, ctx, flags)
}

// CompareSwap posts an atomic compare-and-swap of the 8 bytes at remote:
// if they equal compare they become swap; the old value lands in sge.
func (ep *Endpoint) CompareSwap(sge fabric.SGE, remote fabric.RemoteIOV, compare, swap uint64, ctx uint64, flags fabric.MsgFlags) error {
	return ep.atomic(fabric.OpCompareSwap, sge, remote, compare, swap, ctx, flags)
}

func (ep *Endpoint) atomic(op fabric.Op, sge fabric.SGE, remote fabric.RemoteIOV, a, b uint64, ctx uint64, flags fabric.MsgFlags) error {
	if !ep.caps.Atomics {
		return opErr(op.String(), fabric.ErrNotSupported)
	}
	if sge.Length != 8 || remote.Addr%8 != 0 {
		return opErr(op.String(), fabric.ErrInvalid)
	}
	ep.life.RLock()
	defer ep.life.RUnlock()
	var m [1]fabric.Message
	var s [1]fabric.SGE
	s[0] = sge
	m[0] = fabric.Message{SGEs: s[:], Remote: remote, Context: ctx, Flags: flags}
	n, err := ep.post(m[:], op, a, b)
	if err == nil && n == 0 {
		err = opErr(op.String(), syscall.EAGAIN)
	}
	return err
}

// SendWait implements fabric.Endpoint.
func (ep *Endpoint) SendWait(ctx context.Context, msgs []fabric.Message) (int, error) {
	ep.life.RLock()
	defer ep.life.RUnlock()
	if len(msgs) == 0 {
		return 0, nil
	}
	return ep.block(ctx, &ep.swait, func() (int, error) { return ep.post(msgs, fabric.OpSend, 0, 0) })
}

// post posts a burst of operations of one kind as one chain. Callers hold
// life shared.
func (ep *Endpoint) post(msgs []fabric.Message, op fabric.Op, a, b uint64) (int, error) {
	if ep.closed.Load() {
		return 0, opErr(op.String(), fabric.ErrClosed)
	}
	if err := ep.failure(op.String()); err != nil {
		return 0, err
	}
	if op != fabric.OpSend && ep.ud {
		return 0, opErr(op.String(), fabric.ErrNotSupported)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	ep.sendMu.Lock()
	defer ep.sendMu.Unlock()
	free := ep.depth - int(ep.head-ep.tail)
	if free < len(msgs) {
		ep.reap()
		free = ep.depth - int(ep.head-ep.tail)
	}
	need := fabric.Access(0)
	if op == fabric.OpRead || op == fabric.OpFetchAdd || op == fabric.OpCompareSwap {
		need = fabric.AccessLocalWrite
	}
	var err error
	n, nsge, bytes := 0, 0, 0
	for n < len(msgs) && n < free {
		m := &msgs[n]
		var total int
		if total, err = ep.check(m, op, need); err != nil {
			break
		}
		nsge = ep.prepare(n, nsge, m, op, a, b, total)
		bytes += total
		n++
	}
	if n == 0 {
		return 0, err
	}
	return ep.ring(n, op, bytes, err)
}

// check validates a message of a burst of op: its SGEs (at most maxSGE,
// in the endpoint's regions, with access need) and its size. It returns
// the payload's length.
func (ep *Endpoint) check(m *fabric.Message, op fabric.Op, need fabric.Access) (int, error) {
	if len(m.SGEs) > ep.maxSGE {
		return 0, opErr(op.String(), fabric.ErrMessageSize)
	}
	total, cerr := fabric.CheckSGEs(m.SGEs, ep.dom, need)
	if cerr != nil {
		return 0, opErr(op.String(), cerr)
	}
	switch op {
	case fabric.OpSend:
		if total > ep.caps.MaxMsgSize {
			return 0, opErr("send", fabric.ErrMessageSize)
		}
	case fabric.OpWrite, fabric.OpRead:
		if total > ep.caps.MaxRMASize {
			return 0, opErr(op.String(), fabric.ErrMessageSize)
		} else if m.Remote.Len != 0 && uint64(total) > m.Remote.Len {
			// The same sentinel as the other backends: the message
			// contradicts itself, nothing is out of a region yet.
			return 0, opErr(op.String(), fmt.Errorf("%d bytes for a remote buffer of %d: %w", total, m.Remote.Len, fabric.ErrInvalid))
		}
	}
	return total, nil
}

// prepare fills work request n of the chain with m (op, total bytes,
// atomic operands a and b), its SGEs from index nsge of the C array on,
// and remembers it in its slot. It returns the next free SGE index.
func (ep *Endpoint) prepare(n, nsge int, m *fabric.Message, op fabric.Op, a, b uint64, total int) int {
	seq := ep.head + uint64(n)
	slot := int(seq % uint64(ep.depth))
	w := &ep.swr[n]
	w.wr_id = C.uint64_t(seq)
	w.raddr, w.rkey = C.uint64_t(m.Remote.Addr), C.uint32_t(m.Remote.Key)
	w.compare_add, w.swap = C.uint64_t(a), C.uint64_t(b)
	w.imm = C.uint32_t(m.Imm)
	w.opcode = wrOpcode(op, m.Flags)
	var flags C.uint32_t
	if m.Flags&fabric.FlagFence != 0 {
		flags |= C.IBV_SEND_FENCE
	}
	user := m.Flags&fabric.FlagSignal != 0
	ep.sinceSig++
	if user || ep.sinceSig >= ep.signal {
		flags |= C.IBV_SEND_SIGNALED
		ep.sinceSig = 0
	}
	w.sge = C.uint32_t(nsge)
	nsge, inline := ep.payload(w, slot, nsge, m, op, total)
	w.flags = flags | inline
	ep.slots[slot] = sendSlot{ctx: m.Context, op: op, len: total, user: user}
	return nsge
}

// wrOpcode is the ibv_wr_opcode of op, with immediate data if flags ask.
func wrOpcode(op fabric.Op, flags fabric.MsgFlags) C.uint32_t {
	switch op {
	case fabric.OpSend:
		if flags&fabric.FlagImm != 0 {
			return wrSendImm
		}
		return wrSend
	case fabric.OpWrite:
		if flags&fabric.FlagImm != 0 {
			return wrWriteImm
		}
		return wrWrite
	case fabric.OpRead:
		return wrRead
	case fabric.OpFetchAdd:
		return wrFetchAdd
	case fabric.OpCompareSwap:
		return wrCmpSwap
	}
	return 0
}

// payload points work request w (in slot) at m's total bytes: inline by
// the device, copied into this slot's bounce buffer, or gathered from
// the caller's regions, with SGEs from index nsge on. It returns the next
// free SGE index and IBV_SEND_INLINE if the device copies the payload.
func (ep *Endpoint) payload(w *C.struct_weft_swr, slot, nsge int, m *fabric.Message, op fabric.Op, total int) (int, C.uint32_t) {
	var flags C.uint32_t
	gather := op == fabric.OpSend || op == fabric.OpWrite
	switch {
	case total == 0:
		w.nsge = 0
	case gather && total <= ep.inlineHW:
		flags |= C.IBV_SEND_INLINE
		nsge += ep.fillSGEs(nsge, m.SGEs)
		w.nsge = C.uint32_t(len(m.SGEs))
	case gather && total <= ep.caps.InlineSize:
		off := slot * ep.caps.InlineSize
		fabric.Gather(ep.bounce[off:off+total], m.SGEs)
		s := &ep.sge[nsge]
		s.addr = C.uint64_t(uintptr(unsafe.Pointer(&ep.bounce[off])))
		s.length = C.uint32_t(total)
		s.lkey = ep.bounceMR.lkey
		nsge++
		w.nsge = 1
	default:
		nsge += ep.fillSGEs(nsge, m.SGEs)
		w.nsge = C.uint32_t(len(m.SGEs))
	}
	return nsge, flags
}

// ring posts the chain of the first n work requests (bytes in all) with
// one doorbell and counts what was posted; err is the error that ended
// the burst early, if one did.
func (ep *Endpoint) ring(n int, op fabric.Op, bytes int, err error) (int, error) {
	rc := C.weft_post_send(ep.q, C.int(n))
	posted := int(ep.q.bad)
	if debug {
		fmt.Fprintf(os.Stderr, "verbs %p post %v n=%d rc=%d posted=%d head=%d tail=%d op0=%d flags0=%#x nsge0=%d\n", ep, op, n, rc, posted, ep.head, ep.tail, ep.swr[0].opcode, ep.swr[0].flags, ep.swr[0].nsge)
	}
	ep.head += uint64(posted)
	ep.stats.Doorbells.Add(1)
	ep.stats.TxMessages.Add(uint64(posted))
	ep.stats.TxPackets.Add(uint64(posted))
	ep.stats.TxBytes.Add(uint64(bytes))
	if rc != 0 {
		return posted, errnoErr("ibv_post_send", nil, rc)
	}
	return n, err
}

// fillSGEs copies an SGE list into the C array at index at.
func (ep *Endpoint) fillSGEs(at int, sges []fabric.SGE) int {
	for i := range sges {
		s := &sges[i]
		c := &ep.sge[at+i]
		c.addr = C.uint64_t(s.Region.Addr() + uint64(s.Offset))
		c.length = C.uint32_t(s.Length)
		c.lkey = C.uint32_t(s.Region.LocalKey())
	}
	return len(sges)
}

// reap polls the send completion queue and turns what the caller asked
// for (and every failure) into fabric completions. Callers hold sendMu.
func (ep *Endpoint) reap() int {
	total := 0
	for {
		k := int(C.weft_poll_send(ep.q, 64))
		if k <= 0 {
			return total
		}
		total += k
		for i := 0; i < k; i++ {
			wc := &ep.sout[i]
			seq := uint64(wc.wr_id)
			s := &ep.slots[seq%uint64(ep.depth)]
			if seq+1 > ep.tail {
				ep.tail = seq + 1
			}
			st := mapStatus(uint32(wc.status))
			if debug {
				fmt.Fprintf(os.Stderr, "verbs %p reaped seq=%d status=%d %v\n", ep, seq, wc.status, st)
			}
			if st != fabric.StatusOK && !ep.failed.Load() && st != fabric.StatusFlushed {
				ep.failLocked(st)
			}
			if s.internal || (!s.user && st == fabric.StatusOK) {
				continue
			}
			ep.comp.Push(fabric.Completion{Context: s.ctx, Op: s.op, Status: st, Len: s.len})
		}
		if k < 64 {
			return total
		}
	}
}

// mapStatus is the fabric.Status of an ibv_wc_status.
func mapStatus(s uint32) fabric.Status {
	switch s {
	case C.IBV_WC_SUCCESS:
		return fabric.StatusOK
	case C.IBV_WC_LOC_LEN_ERR:
		return fabric.StatusLocalLength
	case C.IBV_WC_LOC_PROT_ERR, C.IBV_WC_LOC_ACCESS_ERR, C.IBV_WC_MW_BIND_ERR:
		return fabric.StatusLocalAccess
	case C.IBV_WC_WR_FLUSH_ERR:
		return fabric.StatusFlushed
	case C.IBV_WC_REM_ACCESS_ERR:
		return fabric.StatusRemoteAccess
	case C.IBV_WC_REM_INV_REQ_ERR:
		return fabric.StatusRemoteInvalid
	case C.IBV_WC_RETRY_EXC_ERR:
		return fabric.StatusRetryExceeded
	case C.IBV_WC_RNR_RETRY_EXC_ERR:
		return fabric.StatusRNRRetryExceeded
	case C.IBV_WC_REM_ABORT_ERR:
		return fabric.StatusPeerGone
	}
	return fabric.StatusRemoteOp
}

// keepAlive posts a zero-length RDMA WRITE whenever nothing was posted for
// a period, so that a vanished peer is noticed (retries run out) even by
// an endpoint that only receives.
func (ep *Endpoint) keepAlive(every time.Duration) {
	defer ep.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var last uint64
	probe, probing := uint64(0), false
	for {
		select {
		case <-ep.stop:
			return
		case <-t.C:
		}
		ep.life.RLock()
		if ep.closed.Load() {
			ep.life.RUnlock()
			return
		}
		ep.sendMu.Lock()
		ep.reap()
		if probing && ep.tail > probe {
			probing = false
		}
		// One probe at a time: a second one would only reset the
		// retransmission timer of the first.
		if !probing && !ep.failed.Load() && ep.head == last && int(ep.head-ep.tail) < ep.depth {
			probe, probing = ep.postInternal(), true
			if debug {
				fmt.Fprintf(os.Stderr, "verbs %p keepalive head=%d tail=%d\n", ep, ep.head, ep.tail)
			}
		}
		last = ep.head
		ep.sendMu.Unlock()
		ep.life.RUnlock()
	}
}

// postInternal posts a signaled zero-length RDMA WRITE that is never
// reported. Callers hold sendMu and have checked there is room.
func (ep *Endpoint) postInternal() uint64 {
	seq := ep.head
	w := &ep.swr[0]
	*w = C.struct_weft_swr{wr_id: C.uint64_t(seq), opcode: wrWrite, flags: C.IBV_SEND_SIGNALED}
	ep.slots[seq%uint64(ep.depth)] = sendSlot{internal: true}
	ep.sinceSig = 0
	if C.weft_post_send(ep.q, 1) == 0 {
		ep.head++
		ep.stats.Doorbells.Add(1)
	}
	return seq
}
