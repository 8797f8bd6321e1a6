package roce

import (
	"fmt"
	"os"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// requester owns the send side of a QP: the send queue, the PSNs sent
// and acknowledged, retries, the congestion window and keep-alive probes.
type requester struct {
	sq         []wqe
	inlineBuf  []byte // ring of inline payloads, in send-queue order
	inlTail    uint64 // absolute position after the newest inline payload
	sqHead     uint64 // oldest incomplete
	sqNext     uint64 // next to transmit
	sqTail     uint64 // next free
	nextPkt    int    // packet index within sq[sqNext]
	npsn       wire.PSN
	txPSN      wire.PSN // PSN of the next packet to transmit
	una        wire.PSN // oldest unacknowledged PSN
	maxPSN     wire.PSN // one past the highest PSN ever sent
	maxWnd     int      // the largest window (the engine's maxWnd)
	retries    int
	rnrRetries int
	deadline   time.Time
	rnrUntil   time.Time
	rdOut      int
	gapNAKed   bool // a read response gap was already answered
	retx       [numRetxCauses]retxCount
	cwnd       int // packets the requester may have unacknowledged
	cwndAcc    int
	ssthresh   int // window above which cwnd grows by one packet a window
	// After a timeout the requester resends only the first packets, up
	// to rtoProbe, and holds back the rest of the flight, up to
	// rtoRecover, until the acknowledgements tell whether the responder
	// lost it (see rewind).
	rtoHold    bool
	rtoProbe   wire.PSN
	rtoRecover wire.PSN
	rttOn      bool     // a round trip is being timed: that of rttPSN,
	rttPSN     wire.PSN // sent at rttAt (nanotime; see delaySample)
	rttAt      int64
	sinceAck   int       // packets sent since the last one with AckReq
	probeAt    time.Time // keep-alive probe outstanding since
	probeTries int
	probeBuf   [64]byte
	probePkt   [1]link.Packet
}

// Send posts SEND work requests (with immediate data if FlagImm). It
// returns how many it queued; n < len(msgs) is a full send queue.
func (qp *QP) Send(msgs []fabric.Message) (int, error) { return qp.post(msgs, wopSend, "send", 0, 0) }

// Write posts RDMA WRITE work requests to each message's Remote (with
// immediate data if FlagImm).
func (qp *QP) Write(msgs []fabric.Message) (int, error) {
	if qp.cfg.Type != RC {
		return 0, opErr("write", fmt.Errorf("RDMA on a UD QP: %w", fabric.ErrNotSupported))
	}
	return qp.post(msgs, wopWrite, "write", 0, 0)
}

// Read posts RDMA READ work requests from each message's Remote into its
// SGEs.
func (qp *QP) Read(msgs []fabric.Message) (int, error) {
	if qp.cfg.Type != RC {
		return 0, opErr("read", fmt.Errorf("RDMA on a UD QP: %w", fabric.ErrNotSupported))
	}
	return qp.post(msgs, wopRead, "read", 0, 0)
}

// FetchAdd posts an atomic fetch-and-add of add to the 8-byte word at
// remote; the original value is stored (big-endian, as verbs does) in
// the 8 bytes that sge names.
func (qp *QP) FetchAdd(sge fabric.SGE, remote fabric.RemoteIOV, add uint64, ctx uint64, flags fabric.MsgFlags) error {
	return qp.postAtomic(wopFetchAdd, sge, remote, add, 0, ctx, flags)
}

// CompareSwap posts an atomic compare-and-swap: if the word at remote
// equals compare it becomes swap. The original value is stored in sge.
func (qp *QP) CompareSwap(sge fabric.SGE, remote fabric.RemoteIOV, compare, swap uint64, ctx uint64, flags fabric.MsgFlags) error {
	return qp.postAtomic(wopCmpSwap, sge, remote, swap, compare, ctx, flags)
}

func (qp *QP) postAtomic(op wop, sge fabric.SGE, remote fabric.RemoteIOV, swap, cmp uint64, ctx uint64, flags fabric.MsgFlags) error {
	if qp.cfg.Type != RC {
		return opErr("atomic", fabric.ErrNotSupported)
	}
	if sge.Length != 8 || remote.Addr%8 != 0 {
		return opErr("atomic", fmt.Errorf("atomics need 8 aligned bytes: %w", fabric.ErrInvalid))
	}
	msgs := []fabric.Message{{SGEs: []fabric.SGE{sge}, Remote: remote, Context: ctx, Flags: flags}}
	n, err := qp.post(msgs, op, "atomic", swap, cmp)
	if err == nil && n == 0 {
		return opErr("atomic", fmt.Errorf("send queue full"))
	}
	return err
}

// post validates and queues work requests, then transmits what the
// window allows.
func (qp *QP) post(msgs []fabric.Message, op wop, name string, swap, cmp uint64) (int, error) {
	if qp.closed.Load() {
		return 0, opErr(name, fabric.ErrClosed)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.state != StateRTS {
		if qp.state == StateErr {
			return 0, qp.stateErr(name)
		}
		return 0, opErr(name, fmt.Errorf("QP %#x is %v, not RTS: %w", qp.qpn, qp.state, fabric.ErrInvalid))
	}
	need := fabric.Access(0)
	if op == wopRead || op == wopFetchAdd || op == wopCmpSwap {
		need = fabric.AccessLocalWrite
	}
	n := 0
	var err error
	for n < len(msgs) {
		m := &msgs[n]
		if len(m.SGEs) > maxSGE {
			err = opErr(name, fmt.Errorf("%d SGEs, max %d: %w", len(m.SGEs), maxSGE, fabric.ErrMessageSize))
			break
		}
		size, cerr := fabric.CheckSGEs(m.SGEs, &qp.pd.dom, need)
		if cerr != nil {
			err = opErr(name, cerr)
			break
		}
		limit := qp.cfg.MaxMsgSize
		if qp.cfg.Type == UD {
			limit = qp.mtu
		}
		if op == wopRead || op == wopWrite {
			limit = 1 << 31
		}
		if size > limit {
			err = opErr(name, fmt.Errorf("%d bytes, max %d: %w", size, limit, fabric.ErrMessageSize))
			break
		}
		if (op == wopWrite || op == wopRead) && m.Remote.Len != 0 && uint64(size) > m.Remote.Len {
			err = opErr(name, fmt.Errorf("%d bytes for a remote buffer of %d: %w", size, m.Remote.Len, fabric.ErrInvalid))
			break
		}
		if qp.sqTail-qp.sqHead >= uint64(len(qp.sq)) && len(qp.sq) < qp.cfg.SQDepth {
			qp.growSQ()
		}
		if qp.sqTail-qp.sqHead >= uint64(len(qp.sq)) || qp.cq.q.Free() <= int(qp.sqTail-qp.sqHead) {
			break // send queue (or the CQ that must take its completions) full
		}
		inlPos := qp.inlTail
		var inline []byte
		if (op == wopSend || op == wopWrite) && size <= qp.cfg.InlineSize {
			if inline = qp.inlineSlot(size); inline == nil {
				qp.inlTail = inlPos
				break // inline ring full: backpressure
			}
		}
		slot := qp.sqTail % uint64(len(qp.sq))
		w := &qp.sq[slot]
		*w = wqe{op: op, flags: m.Flags, imm: m.Imm, ctx: m.Context, nsge: len(m.SGEs), length: size,
			remote: m.Remote, psn: qp.npsn, inlPos: inlPos}
		copy(w.sge[:], m.SGEs)
		if inline != nil {
			fabric.Gather(inline, m.SGEs)
			w.inline = inline
		}
		switch op {
		case wopSend, wopWrite, wopRead:
			w.npkts = max(1, (size+qp.mtu-1)/qp.mtu)
		case wopFetchAdd, wopCmpSwap:
			w.npkts, w.swap, w.cmp = 1, swap, cmp
		}
		if qp.cfg.Type == UD {
			w.npkts = 1
		}
		qp.npsn = qp.npsn.Add(w.npkts)
		qp.sqTail++
		qp.ctr.TxMessages.Add(1)
		qp.ctr.TxBytes.Add(uint64(size))
		n++
	}
	if n > 0 {
		qp.transmit()
	}
	return n, err
}

// timeoutDur is the retransmission timeout.
func (qp *QP) timeoutDur() time.Duration { return TimeoutDuration(qp.attr.Timeout) }

// armTimer starts the retransmission timer if packets are outstanding,
// for the timeout backed off by the consecutive timeouts of the same
// packets (see backoff).
func (qp *QP) armTimer() {
	if qp.una == qp.txPSN && !qp.rtoHold { // (a hold leaves packets unacknowledged beyond txPSN)
		qp.deadline = time.Time{}
		return
	}
	if d := qp.timeoutDur(); d > 0 {
		qp.deadline = time.Now().Add(backoff(d, int(qp.attr.RetryCnt)-qp.retries))
	}
}

// maxBackoff is the longest a timeout grows by backing off.
const maxBackoff = 2 * time.Second

// backoff is the wait after n consecutive timeouts of timeout d (the
// retransmission timer's, or the keep-alive probe's): d doubled n times,
// at most 64-fold, but never past maxBackoff, and a d longer than that
// is not doubled at all. The first retries of a short timeout come fast,
// and a peer stalled by a busy host gets about 2 s before the retry
// count runs out; a long timeout (rdma_cm's default, 19: 2.1 s) stays
// as it is, as Linux's QPs keep it, so that a peer gone without a word
// is noticed after (retries+1) timeouts (about 17 s at 19 with 7
// retries, like Linux's rxe), not after minutes of doubling.
func backoff(d time.Duration, n int) time.Duration {
	if n <= 0 {
		return d
	}
	return max(d, min(d<<min(n, 6), maxBackoff))
}

// transmit sends the packets of queued work requests that the window,
// the read/atomic limit and an RNR wait allow. Callers hold qp.mu.
func (qp *QP) transmit() {
	if qp.state != StateRTS || !qp.rnrUntil.IsZero() {
		return
	}
	qp.txN = 0
	for qp.sqNext < qp.sqTail {
		if int(qp.txPSN.Sub(qp.una)) >= qp.cwnd && qp.txPSN != qp.una {
			break
		}
		if qp.rtoHold && !qp.txPSN.Less(qp.rtoProbe) && qp.txPSN.Less(qp.rtoRecover) {
			break
		}
		w := &qp.sq[qp.sqNext%uint64(len(qp.sq))]
		if (w.op == wopRead || w.op == wopFetchAdd || w.op == wopCmpSwap) && !w.issued {
			if qp.rdOut >= qp.attr.MaxRDAtomic {
				break
			}
			qp.rdOut++
			w.issued = true
		}
		if w.flags&fabric.FlagFence != 0 && qp.rdOut > 0 && qp.nextPkt == 0 && w.op != wopRead {
			break
		}
		qp.buildPacket(w)
		if qp.txN == txBatch {
			qp.flushTx()
		}
	}
	qp.flushTx()
}

// flushTx sends the packets built so far.
func (qp *QP) flushTx() {
	if qp.txN == 0 {
		return
	}
	if qp.txPSN.Sub(qp.maxPSN) > 0 {
		qp.maxPSN = qp.txPSN
	}
	qp.ctr.TxPackets.Add(uint64(qp.txN))
	n := qp.txN
	if qp.ackDirty {
		// A queued acknowledgement rides along, behind the requests (see
		// ackDelay).
		k := qp.buildAck(qp.ackPSN, qp.ackSyn)
		qp.txPkts[n] = link.Packet{Buf: qp.ackBuf[:k], N: k, Addr: qp.dest, SrcPort: qp.sport, Shm: qp.viaShm,
			Unsealed: qp.e.unsealed(qp.viaShm)}
		n++
	}
	qp.e.send(qp.txPkts[:n])
	qp.txN = 0
	qp.lastActive = nanotime()
	if qp.deadline.IsZero() {
		qp.armTimer()
	}
}

// nextTx returns the next free transmit buffer, leaving room in front for
// nothing: the link takes the UDP payload.
//
// The buffers are allocated on first use, so a QP holds only as many as
// its largest transmit batch needed (one or two for a ping-pong, an ACK
// stream): at most txBatch allocations in its life.
func (qp *QP) nextTx() []byte {
	if qp.txBufs[qp.txN] == nil {
		qp.txBufs[qp.txN] = make([]byte, maxPacket)
	}
	return qp.txBufs[qp.txN]
}

// queueTx finishes a built packet of n bytes: ICRC, address, source port.
func (qp *QP) queueTx(n int) {
	buf := qp.txBufs[qp.txN][:n]
	u := qp.e.sealICRC(qp.icrcBuf[:], buf, qp.dest.Addr(), qp.sport, qp.viaShm)
	qp.txPkts[qp.txN] = link.Packet{Buf: buf, N: n, Addr: qp.dest, SrcPort: qp.sport, Shm: qp.viaShm, Unsealed: u}
	qp.txN++
}

// gatherAt copies the message bytes [off, off+len(dst)) of w into dst.
func gatherAt(dst []byte, w *wqe, off int) {
	if w.inline != nil {
		copy(dst, w.inline[off:])
		return
	}
	for i := 0; i < w.nsge && len(dst) > 0; i++ {
		s := &w.sge[i]
		if off >= s.Length {
			off -= s.Length
			continue
		}
		n := copy(dst, s.Region.Bytes()[s.Offset+off:s.Offset+s.Length])
		dst = dst[n:]
		off = 0
	}
}

// scatterAt copies src into the message bytes [off, off+len(src)) of w.
func scatterAt(w *wqe, off int, src []byte) {
	for i := 0; i < w.nsge && len(src) > 0; i++ {
		s := &w.sge[i]
		if off >= s.Length {
			off -= s.Length
			continue
		}
		n := copy(s.Region.Bytes()[s.Offset+off:s.Offset+s.Length], src)
		src = src[n:]
		off = 0
	}
}

// buildPacket builds the next packet of w (at qp.nextPkt) and advances.
func (qp *QP) buildPacket(w *wqe) {
	k := qp.nextPkt
	mtu := qp.mtu
	f := wire.Fields{BTH: wire.BTHFields{PKey: qp.attr.PKey, DestQP: qp.attr.DestQPN, PSN: w.psn.Add(k)}}
	buf := qp.nextTx()
	last := k == w.npkts-1
	var payload int
	switch w.op {
	case wopSend, wopWrite:
		off := k * mtu
		payload = min(mtu, w.length-off)
		imm := w.flags&fabric.FlagImm != 0
		if qp.cfg.Type == UD {
			f.BTH.OpCode = wire.OpUDSendOnly
			if imm {
				f.BTH.OpCode = wire.OpUDSendOnlyWithImmediate
			}
			f.QKey, f.SrcQP = qp.attr.QKey, qp.qpn
			break
		}
		f.BTH.OpCode = rcOpcode(w.op, w.npkts, k, imm)
		if w.op != wopSend && k == 0 {
			f.RETH = wire.RETHFields{VA: w.remote.Addr, RKey: uint32(w.remote.Key), DMALength: uint32(w.length)}
		}
		// Ask for an acknowledgement at the end of a burst, of a signaled
		// message, every 16 packets, and when half the window is out:
		// the responder acknowledges cumulatively, so one ACK per burst
		// is enough, and an ACK costs the peer a packet.
		qp.sinceAck++
		if (last && (qp.sqNext+1 == qp.sqTail || w.flags&fabric.FlagSignal != 0)) ||
			qp.sinceAck >= 16 || int(qp.txPSN.Sub(qp.una))+1 >= qp.cwnd/2 {
			f.BTH.AckReq = true
			qp.sinceAck = 0
			if !qp.rttOn && !f.BTH.PSN.Less(qp.maxPSN) {
				// Time the round trip of a first transmission.
				qp.rttOn, qp.rttPSN, qp.rttAt = true, f.BTH.PSN, nanotime()
			}
		}
		f.BTH.SolicitedEvent = last && w.op == wopSend && imm
	case wopRead:
		// One request for the rest of the read (all of it, or after a
		// retransmission, what is missing).
		done := w.rdDone
		w.rdReq = done
		k = done / mtu
		f.BTH.PSN = w.psn.Add(k)
		f.BTH.OpCode = wire.OpRCReadRequest
		f.BTH.AckReq = true
		f.RETH = wire.RETHFields{VA: w.remote.Addr + uint64(done), RKey: uint32(w.remote.Key), DMALength: uint32(w.length - done)}
		last = true
	case wopFetchAdd, wopCmpSwap:
		f.BTH.OpCode = wire.OpRCFetchAdd
		if w.op == wopCmpSwap {
			f.BTH.OpCode = wire.OpRCCompareSwap
		}
		f.BTH.AckReq = true
		f.Atomic = wire.AtomicETHFields{VA: w.remote.Addr, RKey: uint32(w.remote.Key), SwapAdd: w.swap, Compare: w.cmp}
	}
	f.Imm = w.imm
	hl, err := wire.BuildHeaders(buf, &f, payload)
	if err != nil {
		panic("roce: building a request: " + err.Error()) // a bug in this file, not input
	}
	if payload > 0 {
		gatherAt(buf[hl:hl+payload], w, k*mtu)
	}
	n := hl + payload + wire.PadLen(payload)
	clear(buf[hl+payload : n+wire.ICRCSize])
	qp.queueTx(n + wire.ICRCSize)
	if w.op == wopRead {
		qp.txPSN = w.psn.Add(w.npkts)
	} else {
		qp.txPSN = w.psn.Add(k + 1)
	}
	if last {
		qp.sqNext++
		qp.nextPkt = 0
		if qp.cfg.Type == UD {
			// Datagrams complete once sent.
			qp.una = qp.txPSN
			qp.completeHead()
		}
	} else {
		qp.nextPkt = k + 1
	}
}

func rcOpcode(op wop, npkts, k int, imm bool) wire.OpCode {
	send := op == wopSend
	switch {
	case npkts == 1 && send && imm:
		return wire.OpRCSendOnlyWithImmediate
	case npkts == 1 && send:
		return wire.OpRCSendOnly
	case npkts == 1 && imm:
		return wire.OpRCWriteOnlyWithImmediate
	case npkts == 1:
		return wire.OpRCWriteOnly
	case k == 0 && send:
		return wire.OpRCSendFirst
	case k == 0:
		return wire.OpRCWriteFirst
	case k < npkts-1 && send:
		return wire.OpRCSendMiddle
	case k < npkts-1:
		return wire.OpRCWriteMiddle
	case send && imm:
		return wire.OpRCSendLastWithImmediate
	case send:
		return wire.OpRCSendLast
	case imm:
		return wire.OpRCWriteLastWithImmediate
	}
	return wire.OpRCWriteLast
}

// completeHead completes work requests at the head of the send queue that
// are fully acknowledged.
func (qp *QP) completeHead() {
	progressed := false
	for qp.sqHead < qp.sqNext {
		w := &qp.sq[qp.sqHead%uint64(len(qp.sq))]
		lastPSN := w.psn.Add(w.npkts - 1)
		if !lastPSN.Less(qp.una) {
			break
		}
		if (w.op == wopRead || w.op == wopFetchAdd || w.op == wopCmpSwap) && !w.done {
			break
		}
		qp.complete(w, fabric.StatusOK)
		qp.sqHead++
		progressed = true
	}
	if progressed && qp.sendWaiters.Load() > 0 {
		select {
		case qp.sendCh <- struct{}{}:
		default:
		}
	}
}

// ackTo acknowledges every PSN up to and including p.
func (qp *QP) ackTo(p wire.PSN) {
	next := p.Next()
	// Ignore acknowledgements of what was never sent, and stale ones.
	if next.Sub(qp.maxPSN) > 0 || next.Sub(qp.una) < 0 {
		return
	}
	// An acknowledgement does not deliver read or atomic results: if it
	// covers a read whose responses were lost (the responder acks a later
	// duplicate), stop at the missing data and ask for it again.
	if w := qp.oldestPending(); w != nil {
		resume := w.psn
		if w.op == wopRead {
			resume = w.psn.Add(w.rdDone / qp.mtu)
		}
		if next.Sub(resume) > 0 {
			next = resume
			if !qp.gapNAKed {
				qp.gapNAKed = true
				defer qp.rewind(resume, retxGap)
			}
		}
	}
	if adv := next.Sub(qp.una); adv > 0 {
		qp.una = next
		qp.growWindow(int(adv))
		if qp.rttOn && qp.una.Sub(qp.rttPSN) > 0 {
			qp.rttOn = false
			qp.delaySample(nanotime() - qp.rttAt)
		}
		qp.retries = int(qp.attr.RetryCnt)
		qp.rnrRetries = int(qp.attr.RNRRetry)
		qp.gapNAKed = false
		if qp.rtoHold && qp.una.Sub(qp.rtoProbe) > 0 {
			// The responder acknowledged a packet after the timeout's
			// probe, one sent only once: it has the flight, the
			// timeout was spurious. Go on after the flight (a gap
			// the responder finds in it brings a sequence NAK).
			qp.rtoHold = false
			if qp.txPSN.Less(qp.rtoRecover) {
				qp.seek(qp.rtoRecover)
			}
		}
		if qp.una.Sub(qp.txPSN) > 0 {
			// Acknowledged beyond a rewind: skip what needs no resend.
			qp.seek(qp.una)
		}
	}
	qp.completeHead()
	qp.deadline = time.Time{}
	qp.armTimer()
}

// retxCause says why the requester went back to resend.
type retxCause int

const (
	retxNAK     retxCause = iota // a PSN-sequence NAK (go-back-N)
	retxTimeout                  // the retransmission timer
	retxRNR                      // an RNR NAK, once its delay is over
	retxGap                      // read responses missing before the one that came
	numRetxCauses
)

// retxCount counts the rewinds of one cause and the packets they queued
// for retransmission.
type retxCount struct{ rewinds, packets uint64 }

// growWindow opens the window for n newly acknowledged packets: by n
// below ssthresh (doubling it every window, back quickly to where the
// last loss left the threshold), by one packet per window above it, where
// the last loss happened and the next one waits.
func (req *requester) growWindow(n int) {
	if req.cwnd < req.ssthresh {
		req.cwnd = min(req.cwnd+n, req.ssthresh)
		return
	}
	req.cwndAcc += n
	if req.cwndAcc >= req.cwnd {
		req.cwndAcc = 0
		req.cwnd = min(req.cwnd+1, req.maxWnd)
	}
}

// delaySample takes a round-trip time, in nanoseconds. Above a quarter
// of the retransmission timeout, the window queues up at the responder
// or on the way to it: a slow responder (Linux rxe in an emulated guest
// serves a packet in 0.1-0.4 ms) takes the window in faster than it
// serves it, and the queue grows until its delay reaches the timeout
// (which then fires for packets that were never lost) or it overflows
// (a tap's queue of 1000 packets dropped the end of a window of 1024;
// see maxInflight).
// So the window shrinks in proportion to the excess delay, by at most
// half, and stops doubling; as only one round trip is timed at a time,
// it shrinks at most once a round trip (like the delay-based congestion
// control of RDMA NICs, such as Swift's, with the timeout setting the
// target).
func (qp *QP) delaySample(rtt int64) {
	target := int64(qp.timeoutDur() / 4)
	if target <= 0 || rtt <= target {
		return
	}
	qp.cwnd = max(minWindow, qp.cwnd-int(int64(qp.cwnd)*(rtt-target)/(2*rtt)))
	qp.ssthresh, qp.cwndAcc = qp.cwnd, 0
}

// rewind goes back to PSN p for retransmission (go-back-N), and shrinks
// the window. Every packet after a loss is sent again, so a window much
// larger than the responder keeps up with only multiplies the
// retransmissions: the threshold becomes half the window, and the window
// the threshold on a NAK (the responder is there and dropped what
// followed the loss) or minWindow on a timeout; a timeout that repeats
// before any progress leaves the threshold where the first one put it
// (the window is already small, and halving that would only slow the
// recovery after the stall). A timeout mostly
// means the responder stalled, not that it lost the window (Linux rxe in
// an emulated guest leaves everything unacknowledged for longer than
// the timeout and then acknowledges all of it): the small window resends
// only the first packets, and the acknowledgements that follow skip the
// rest (ackTo), where half the window would resend it all for nothing.
//
// Even minWindow would resend the whole flight when the responder only
// stalled: it acknowledges the flight one packet at a time afterwards,
// and every acknowledgement opens the window for a packet it already
// has. So a timeout resends the first minWindow packets only (the probe)
// and holds back the rest of the flight until an acknowledgement settles
// it (like TCP's F-RTO, RFC 5682): one beyond the probe shows the
// responder has the flight, and the requester goes on after it (ackTo);
// a timeout after the whole probe was acknowledged, with nothing beyond,
// shows the responder lost the rest, and that timeout goes back over all
// of it. A NAK ends the hold, and so does a read or atomic in flight
// (their responses, not acknowledgements, tell what arrived).
//
// The rewind and the packets it queues for resending are counted under
// cause.
func (qp *QP) rewind(p wire.PSN, cause retxCause) {
	if cause != retxTimeout || qp.retries == int(qp.attr.RetryCnt)-1 {
		qp.ssthresh = max(minWindow, qp.cwnd/2)
	}
	qp.cwnd = qp.ssthresh
	lostProbe := qp.rtoHold && !qp.una.Less(qp.rtoProbe)
	qp.rtoHold = false
	if cause == retxTimeout {
		qp.cwnd = minWindow
		if !lostProbe && qp.oldestPending() == nil && int(qp.maxPSN.Sub(p)) > minWindow {
			qp.rtoHold, qp.rtoProbe, qp.rtoRecover = true, p.Add(minWindow), qp.maxPSN
		}
	}
	qp.cwndAcc = 0
	qp.rttOn = false // an acknowledgement may now be for the original or the copy
	qp.seek(p)
	qp.retx[cause].rewinds++
	end := qp.maxPSN
	if qp.rtoHold {
		end = qp.rtoProbe
	}
	if d := end.Sub(qp.txPSN); d > 0 {
		qp.ctr.Retransmits.Add(uint64(d))
		qp.retx[cause].packets += uint64(d)
	}
}

// retransmissions returns the rewinds and retransmitted packets by cause.
func (qp *QP) retransmissions() [numRetxCauses]retxCount {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.retx
}

// seek points the transmitter at PSN p: the work request that holds it,
// and the packet within it (reads restart after what has arrived).
func (qp *QP) seek(p wire.PSN) {
	rd := 0
	for i := qp.sqHead; i < qp.sqTail; i++ {
		w := &qp.sq[i%uint64(len(qp.sq))]
		atomicOrRead := w.op == wopRead || w.op == wopFetchAdd || w.op == wopCmpSwap
		if p.Less(w.psn.Add(w.npkts)) && !w.done {
			for j := i; j < qp.sqTail; j++ {
				qp.sq[j%uint64(len(qp.sq))].issued = false
			}
			qp.sqNext = i
			qp.nextPkt = max(0, int(p.Sub(w.psn)))
			if atomicOrRead {
				qp.nextPkt = 0
			}
			qp.txPSN = w.psn.Add(qp.nextPkt)
			if w.op == wopRead {
				qp.txPSN = w.psn.Add(w.rdDone / qp.mtu)
				// Responses that arrived in order acknowledged their
				// PSNs: the window starts after them.
				if qp.txPSN.Sub(qp.una) > 0 {
					qp.una = qp.txPSN
				}
			}
			qp.rdOut = rd
			return
		}
		if atomicOrRead && w.issued && !w.done {
			rd++
		}
	}
	qp.sqNext, qp.nextPkt, qp.txPSN, qp.rdOut = qp.sqTail, 0, qp.npsn, rd
}

// onTimeout retransmits from the oldest unacknowledged PSN, or fails the
// QP when the retries are spent.
func (qp *QP) onTimeout(now time.Time) {
	if debugRoce {
		w := qp.oldestPending()
		rd := -1
		if w != nil {
			rd = w.rdDone
		}
		println("timeout qpn", qp.qpn, "retries", qp.retries, "una", qp.una, "tx", qp.txPSN, "max", qp.maxPSN, "rdOut", qp.rdOut, "rdDone", rd, "head", qp.sqHead, "next", qp.sqNext, "tail", qp.sqTail)
	}
	if qp.retries <= 0 {
		qp.failAt(qp.una, fabric.StatusRetryExceeded)
		return
	}
	qp.retries--
	qp.rewind(qp.una, retxTimeout)
	qp.deadline = time.Time{}
	qp.transmit()
	qp.armTimer()
}

// response handles an ACK, NAK, read response or atomic acknowledgement.
func (qp *QP) response(p *wire.Packet) {
	op := p.OpCode()
	psn := p.BTH.PSN()
	if debugRoce {
		var syn uint32
		if p.AETH != nil {
			syn = uint32(p.AETH.Syndrome())
		}
		qp.trace[qp.traceN%len(qp.trace)] = [3]uint32{uint32(psn), uint32(qp.una), uint32(op)<<8 | syn}
		qp.traceN++
	}
	switch op {
	case wire.OpRCAcknowledge:
		syn := p.AETH.Syndrome()
		switch syn.Type() {
		case wire.AckTypeACK:
			qp.ackTo(psn)
		case wire.AckTypeRNRNAK:
			qp.ackTo(psn.Add(-1))
			if qp.attr.RNRRetry != 7 {
				if qp.rnrRetries <= 0 {
					qp.failAt(psn, fabric.StatusRNRRetryExceeded)
					return
				}
				qp.rnrRetries--
			}
			qp.rewind(psn, retxRNR)
			qp.rnrUntil = time.Now().Add(syn.RNRTimer().Duration())
			// The peer answered: no timeout while we wait out its RNR
			// delay (transmit re-arms the timer).
			qp.deadline = time.Time{}
		case wire.AckTypeNAK:
			qp.ackTo(psn.Add(-1))
			switch syn.NAKCode() {
			case wire.NAKPSNSequenceError:
				// The peer expects psn: resend from there, unless the NAK
				// is stale or we are about to send psn anyway. Either
				// way the transmitter runs below: the ACK part of the
				// NAK may have opened the window.
				if !psn.Less(qp.una) && psn.Less(qp.txPSN) {
					qp.rewind(psn, retxNAK)
				}
			case wire.NAKRemoteAccessError:
				qp.failAt(psn, fabric.StatusRemoteAccess)
			case wire.NAKRemoteOperationalError:
				qp.failAt(psn, fabric.StatusRemoteOp)
			default:
				qp.failAt(psn, fabric.StatusRemoteInvalid)
			}
		default:
			qp.ctr.Drop(fabric.DropMalformed, 1)
		}
	case wire.OpRCReadResponseFirst, wire.OpRCReadResponseMiddle, wire.OpRCReadResponseLast, wire.OpRCReadResponseOnly:
		qp.readResponse(p, psn)
	case wire.OpRCAtomicAcknowledge:
		w := qp.oldestPending()
		if w == nil || (w.op != wopFetchAdd && w.op != wopCmpSwap) || w.psn != psn {
			qp.ctr.Drop(fabric.DropDuplicate, 1)
			break
		}
		var orig [8]byte
		v := p.AtomicAckETH.OrigData()
		for i := range orig {
			orig[i] = byte(v >> (56 - 8*i))
		}
		scatterAt(w, 0, orig[:])
		w.done = true
		if w.issued {
			qp.rdOut--
		}
		qp.ackTo(psn)
	default:
		qp.ctr.Drop(fabric.DropMalformed, 1)
	}
	qp.transmit()
}

// oldestPending returns the oldest transmitted read or atomic that has not
// completed.
func (req *requester) oldestPending() *wqe {
	for i := req.sqHead; i < req.sqNext; i++ {
		w := &req.sq[i%uint64(len(req.sq))]
		if (w.op == wopRead || w.op == wopFetchAdd || w.op == wopCmpSwap) && !w.done {
			return w
		}
	}
	return nil
}

func (qp *QP) readResponse(p *wire.Packet, psn wire.PSN) {
	w := qp.oldestPending()

	if w == nil || w.op != wopRead {
		qp.ctr.Drop(fabric.DropDuplicate, 1)
		return
	}
	want := w.psn.Add(w.rdDone / qp.mtu)
	if d := psn.Sub(want); d != 0 {
		if d < 0 {
			qp.ctr.Drop(fabric.DropDuplicate, 1)
			return
		}
		// A response packet was lost: ask again from the missing one.
		qp.ctr.Drop(fabric.DropSequence, 1)
		if !qp.gapNAKed {
			qp.gapNAKed = true
			qp.rewind(want, retxGap)
		}
		return
	}
	// Responses implicitly acknowledge everything before the read.
	qp.ackTo(w.psn.Add(-1))
	rest := w.length - w.rdDone
	op := p.OpCode()
	n := len(p.Payload)
	lastPkt := op == wire.OpRCReadResponseLast || op == wire.OpRCReadResponseOnly
	// The responses to a request (the first, or one re-issued for what is
	// missing) start with FIRST or ONLY.
	first := op == wire.OpRCReadResponseFirst || op == wire.OpRCReadResponseOnly
	if (lastPkt && n != rest) || (!lastPkt && (n != qp.mtu || n >= rest)) || first != (w.rdDone == w.rdReq) {
		qp.ctr.Drop(fabric.DropMalformed, 1)
		return
	}
	scatterAt(w, w.rdDone, p.Payload)
	w.rdDone += n
	qp.gapNAKed = false
	qp.retries = int(qp.attr.RetryCnt) // progress
	if lastPkt {
		w.done = true
		if w.issued {
			qp.rdOut--
		}
		qp.ackTo(w.psn.Add(w.npkts - 1))
	} else {
		// An in-order response acknowledges its PSN (the read itself
		// completes only with its last response).
		qp.ackTo(psn)
	}
}

// failAt completes the work request holding PSN p with st and moves the
// QP to ERR (a NAK other than a sequence error is fatal for RC).
func (qp *QP) failAt(p wire.PSN, st fabric.Status) {
	for i := qp.sqHead; i < qp.sqTail; i++ {
		w := &qp.sq[i%uint64(len(qp.sq))]
		if p.Less(w.psn.Add(w.npkts)) {
			qp.complete(w, st)
			qp.sqHead = i + 1
			break
		}
	}
	qp.errorLocked(st)
}

// debugRoce prints retransmission timeouts and QP errors to stderr
// (WEFT_ROCE_DEBUG=1), for diagnosing interop.
var debugRoce = os.Getenv("WEFT_ROCE_DEBUG") != ""
