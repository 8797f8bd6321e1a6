package roce

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// responder owns the receive side of a QP: the expected PSN, the
// message being received, acknowledgements, atomic results for
// duplicates, and the receive ring.
type responder struct {
	epsn      wire.PSN
	msn       uint32
	nakSent   bool
	inSend    bool
	inWrite   bool
	inWriteOp wire.OpCode
	wbuf      []byte
	woff      int
	ackDirty  bool
	ackPSN    wire.PSN
	ackSyn    wire.Syndrome
	ackPkts   int   // request packets taken since the last acknowledgement sent
	ackAt     int64 // when (Unix ns) the queued acknowledgement was first due
	ackUrgent bool  // the queued acknowledgement answers a duplicate: no delay
	ackWait   int64 // ns an acknowledgement may wait (ackDelay, at most an eighth of the timeout)
	ackListed bool  // in the engine's dirty list (guarded by the engine's pollMu)
	atomics   [16]atomicResult
	atomicIdx int
	ackBuf    [64]byte
	ackPkt    [1]link.Packet
	srcQPN    uint32 // UD: source QP of the last datagram

	// receive buffer: a ring of records {len, imm, flags, 0} + payload
	rq       []byte
	rqHead   uint64   // oldest undelivered record
	rqRel    uint64   // end of what the application gave back: room starts here
	rqTail   uint64   // end of committed records
	vq       []uint64 // ring positions of views not yet released, a queue
	vHead    uint64   // oldest outstanding view in vq
	vTail    uint64   // next free slot in vq
	rqCur    uint64   // start of the record being filled (RC multi-packet SEND)
	rqCurLen int
}

// request handles an incoming RC request packet (responder side).
func (qp *QP) request(p *wire.Packet) {
	psn := p.BTH.PSN()
	d := psn.Sub(qp.epsn)
	if debugRoce {
		qp.trace[qp.traceN%len(qp.trace)] = [3]uint32{uint32(psn), uint32(qp.epsn), uint32(p.OpCode())}
		qp.traceN++
	}
	switch {
	case d > 0:
		// A packet is missing: NAK once per gap, from the expected PSN.
		qp.ctr.Drop(fabric.DropSequence, 1)
		if !qp.nakSent {
			qp.nakSent = true
			qp.sendAck(qp.epsn, wire.NAKSyndrome(wire.NAKPSNSequenceError))
		}
		return
	case d < 0:
		qp.duplicate(p, psn)
		return
	}
	qp.nakSent = false
	op := p.OpCode()
	if !qp.sequenceOK(op) {
		qp.respError(psn, wire.NAKInvalidRequest, fabric.StatusRemoteInvalid)
		return
	}
	switch op {
	case wire.OpRCSendFirst, wire.OpRCSendMiddle, wire.OpRCSendLast, wire.OpRCSendLastWithImmediate,
		wire.OpRCSendOnly, wire.OpRCSendOnlyWithImmediate:
		if !qp.recvSend(p, op, psn) {
			return
		}
	case wire.OpRCWriteFirst, wire.OpRCWriteMiddle, wire.OpRCWriteLast, wire.OpRCWriteLastWithImmediate,
		wire.OpRCWriteOnly, wire.OpRCWriteOnlyWithImmediate:
		if !qp.recvWrite(p, op, psn) {
			return
		}
	case wire.OpRCReadRequest:
		qp.readRequest(p, psn, false)
		return
	case wire.OpRCCompareSwap, wire.OpRCFetchAdd:
		qp.atomicRequest(p, psn)
		return
	default:
		qp.respError(psn, wire.NAKInvalidRequest, fabric.StatusRemoteInvalid)
		return
	}
	qp.epsn = psn.Next()
	if op.IsLast() {
		qp.msn = (qp.msn + 1) & 0xffffff
	}
	qp.ackPkts++
	if p.BTH.AckReq() {
		qp.queueAck(psn, wire.ACKSyndrome(wire.CreditsInvalid), false)
	}
}

// sequenceOK checks that op may follow what came before: FIRST, ONLY and
// single-packet requests start messages; MIDDLE and LAST continue one of
// the same kind.
func (rsp *responder) sequenceOK(op wire.OpCode) bool {
	switch op {
	case wire.OpRCSendMiddle, wire.OpRCSendLast, wire.OpRCSendLastWithImmediate:
		return rsp.inSend
	case wire.OpRCWriteMiddle, wire.OpRCWriteLast, wire.OpRCWriteLastWithImmediate:
		return rsp.inWrite
	}
	return !rsp.inSend && !rsp.inWrite
}

// payloadOK checks the payload size of a packet of a multi-packet
// message: FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most.
func (qp *QP) payloadOK(op wire.OpCode, n int) bool {
	if op.IsLast() {
		return n <= qp.mtu
	}
	return n == qp.mtu
}

func (qp *QP) recvSend(p *wire.Packet, op wire.OpCode, psn wire.PSN) bool {
	n := len(p.Payload)
	if !qp.payloadOK(op, n) {
		qp.respError(psn, wire.NAKInvalidRequest, fabric.StatusRemoteInvalid)
		return false
	}
	first := op == wire.OpRCSendFirst || op == wire.OpRCSendOnly || op == wire.OpRCSendOnlyWithImmediate
	if first {
		want := qp.cfg.MaxMsgSize
		if op != wire.OpRCSendFirst {
			want = n
		}
		if !qp.recvRoom(want) {
			// No room: receiver not ready, try again later.
			qp.ctr.Drop(fabric.DropNoBuffer, 1)
			qp.sendAck(psn, wire.RNRNAKSyndrome(qp.attr.MinRNRTimer))
			return false
		}
		qp.beginRecord(want)
		qp.inSend = true
	}
	if qp.rqCurLen+n > qp.cfg.MaxMsgSize {
		qp.respError(psn, wire.NAKInvalidRequest, fabric.StatusRemoteInvalid)
		return false
	}
	qp.appendRecord(p.Payload)
	if op.IsLast() {
		qp.inSend = false
		var imm, fl uint32
		if p.ImmDt != nil {
			imm, fl = p.ImmDt.Imm(), recFlagImm
		}
		qp.commitRecord(imm, fl, qp.rqCurLen)
	}
	return true
}

func (qp *QP) recvWrite(p *wire.Packet, op wire.OpCode, psn wire.PSN) bool {
	n := len(p.Payload)
	if !qp.payloadOK(op, n) {
		qp.respError(psn, wire.NAKInvalidRequest, fabric.StatusRemoteInvalid)
		return false
	}
	if p.RETH != nil { // FIRST or ONLY
		dlen := p.RETH.DMALength()
		if dlen == 0 {
			// A zero-length write names no memory and needs no key.
			qp.wbuf = nil
		} else {
			b, ok := qp.e.lookupRemote(qp.pd, p.RETH.RKey(), p.RETH.VA(), dlen, fabric.AccessRemoteWrite)
			if !ok {
				qp.respError(psn, wire.NAKRemoteAccessError, fabric.StatusRemoteAccess)
				return false
			}
			qp.wbuf = b
		}
		qp.woff = 0
		qp.inWrite = true
		if (op == wire.OpRCWriteOnly || op == wire.OpRCWriteOnlyWithImmediate) && uint32(n) != dlen {
			qp.respError(psn, wire.NAKInvalidRequest, fabric.StatusRemoteInvalid)
			return false
		}
	}
	if qp.woff+n > len(qp.wbuf) || (op.IsLast() && qp.woff+n != len(qp.wbuf)) {
		qp.respError(psn, wire.NAKInvalidRequest, fabric.StatusRemoteInvalid)
		return false
	}
	if p.ImmDt != nil && !qp.recvRoom(0) {
		// The immediate needs a receive slot: not ready, retry this packet.
		qp.ctr.Drop(fabric.DropNoBuffer, 1)
		qp.sendAck(psn, wire.RNRNAKSyndrome(qp.attr.MinRNRTimer))
		return false
	}
	copy(qp.wbuf[qp.woff:], p.Payload)
	qp.woff += n
	if op.IsLast() {
		qp.inWrite = false
		if p.ImmDt != nil {
			qp.beginRecord(0)
			qp.commitRecord(p.ImmDt.Imm(), recFlagWrite|recFlagImm, qp.woff)
		}
		qp.wbuf = nil
	}
	return true
}

// readRequest answers an RDMA READ: validate, then send the response
// packets. A duplicate request is executed again from its PSN.
func (qp *QP) readRequest(p *wire.Packet, psn wire.PSN, dup bool) {
	va, rkey, dlen := p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALength()
	var data []byte
	if dlen > 0 {
		b, ok := qp.e.lookupRemote(qp.pd, rkey, va, dlen, fabric.AccessRemoteRead)
		if !ok {
			if dup {
				return
			}
			qp.respError(psn, wire.NAKRemoteAccessError, fabric.StatusRemoteAccess)
			return
		}
		data = b
	}
	npkts := max(1, (len(data)+qp.mtu-1)/qp.mtu)
	if !dup {
		qp.epsn = psn.Add(npkts)
		qp.msn = (qp.msn + 1) & 0xffffff
	}
	// Acknowledgements queued before must go first: flush them.
	qp.sendAckLocked()
	qp.txN = 0
	for k := 0; k < npkts; k++ {
		chunk := data[min(k*qp.mtu, len(data)):min((k+1)*qp.mtu, len(data))]
		var op wire.OpCode
		switch {
		case npkts == 1:
			op = wire.OpRCReadResponseOnly
		case k == 0:
			op = wire.OpRCReadResponseFirst
		case k == npkts-1:
			op = wire.OpRCReadResponseLast
		default:
			op = wire.OpRCReadResponseMiddle
		}
		f := wire.Fields{BTH: wire.BTHFields{OpCode: op, PKey: qp.attr.PKey, DestQP: qp.attr.DestQPN, PSN: psn.Add(k)},
			Syndrome: wire.ACKSyndrome(wire.CreditsInvalid), MSN: qp.msn}
		buf := qp.nextTx()
		n, err := wire.Build(buf, &f, chunk)
		if err != nil {
			panic("roce: building a read response: " + err.Error())
		}
		qp.queueTx(n)
		if qp.txN == txBatch {
			qp.e.send(qp.txPkts[:qp.txN])
			qp.txN = 0
		}
	}
	if qp.txN > 0 {
		qp.e.send(qp.txPkts[:qp.txN])
		qp.txN = 0
	}
	qp.ctr.TxBytes.Add(uint64(len(data)))
}

// atomicRequest executes FETCH_ADD or COMPARE_SWAP once per PSN; a
// duplicate gets the saved result again.
func (qp *QP) atomicRequest(p *wire.Packet, psn wire.PSN) {
	a := p.AtomicETH
	b, ok := qp.e.lookupRemote(qp.pd, a.RKey(), a.VA(), 8, fabric.AccessRemoteAtomic)
	if !ok || a.VA()%8 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		qp.respError(psn, wire.NAKRemoteAccessError, fabric.StatusRemoteAccess)
		return
	}
	// The word is in the host's byte order in memory; verbs atomics
	// operate on the 64-bit value as the CPU sees it.
	word := (*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(b)))
	var orig uint64
	if p.OpCode() == wire.OpRCFetchAdd {
		orig = word.Add(a.SwapAdd()) - a.SwapAdd()
	} else {
		for {
			orig = word.Load()
			if orig != a.Compare() || word.CompareAndSwap(orig, a.SwapAdd()) {
				break
			}
		}
	}
	qp.atomics[qp.atomicIdx] = atomicResult{psn: psn, orig: orig, valid: true}
	qp.atomicIdx = (qp.atomicIdx + 1) % len(qp.atomics)
	qp.epsn = psn.Next()
	qp.msn = (qp.msn + 1) & 0xffffff
	qp.sendAtomicAck(psn, orig)
}

func (qp *QP) sendAtomicAck(psn wire.PSN, orig uint64) {
	qp.sendAckLocked()
	f := wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCAtomicAcknowledge, PKey: qp.attr.PKey,
		DestQP: qp.attr.DestQPN, PSN: psn}, Syndrome: wire.ACKSyndrome(wire.CreditsInvalid), MSN: qp.msn, AtomicOrig: orig}
	qp.txN = 0
	n, _ := wire.Build(qp.nextTx(), &f, nil)
	qp.queueTx(n)
	qp.e.send(qp.txPkts[:1])
	qp.txN = 0
}

// duplicate answers a request the responder has already executed: SENDs
// and WRITEs are acknowledged again, READs executed again, atomics
// answered from the saved result.
func (qp *QP) duplicate(p *wire.Packet, psn wire.PSN) {
	qp.ctr.Drop(fabric.DropDuplicate, 1)
	switch p.OpCode() {
	case wire.OpRCReadRequest:
		qp.readRequest(p, psn, true)
	case wire.OpRCCompareSwap, wire.OpRCFetchAdd:
		for _, r := range qp.atomics {
			if r.valid && r.psn == psn {
				qp.sendAtomicAck(psn, r.orig)
				return
			}
		}
	default:
		// Acknowledge the newest PSN the responder has taken.
		qp.queueAck(qp.epsn.Add(-1), wire.ACKSyndrome(wire.CreditsInvalid), true)
	}
}

// respError answers a request the responder refuses: a NAK, and the QP
// goes to the error state (an RC responder does not recover from an
// access or invalid-request error).
func (qp *QP) respError(psn wire.PSN, code wire.NAKCode, st fabric.Status) {
	if code == wire.NAKRemoteAccessError {
		qp.ctr.Drop(fabric.DropAccess, 1)
	} else {
		qp.ctr.Drop(fabric.DropMalformed, 1)
	}
	qp.sendAck(psn, wire.NAKSyndrome(code))
	qp.errorLocked(st)
}

// Acknowledgement coalescing. An RC responder may acknowledge several
// requests with one ACK (IBA 9.7.5.1.2), and every ACK costs both ends a
// packet: on loopback the whole kernel path of the receiver as well, in
// the sender's system call. So an acknowledgement the requester asked for
// (AckReq) is queued, and goes out
//   - with the QP's next transmission, in the same sendmmsg (flushTx):
//     a request-reply peer gets the ACK of its request behind the reply,
//     at no system call of its own and off the round trip's critical
//     path (it used to be sent before the request was even handed to the
//     application);
//   - once ackEvery request packets are unacknowledged (streams);
//   - at once if it answers a duplicate (the requester is retrying);
//   - otherwise after ackDelay, at most an eighth of the QP's own local
//     ACK timeout (the peer's is not on the wire; Weft's two ends use the
//     same), by a thread that spins on the engine (not by Recv's own
//     poll, which delivers next); the background poller sends what is
//     queued before it goes to sleep.
//
// NAKs and RNR NAKs are never delayed (sendAck), and a queued ACK goes
// before read responses and atomic acknowledgements (sendAckLocked).
//
// Measured (64 B ping-pong, two engines on loopback, 2-vCPU host shared
// with other load, medians of 6 alternating runs): main 293 µs at 4.0
// packets per message; riding along always 274 µs at 4.0. Rejected:
// riding along only once the ACK is due, which leaves the ACK out of
// some round trips: 3.9 packets a message with ackDelay 20 µs (308 µs),
// 3.2 with 50 µs (341 µs), 2.9 with 100 µs (221 µs), all within the
// noise; and a requester that waits for its send's completion before it
// goes on (perftest's latency loops poll the send CQ) would wait out
// ackDelay in every round trip.
const (
	ackEvery = 16
	ackDelay = 20 * time.Microsecond
)

// queueAck records an acknowledgement to send later (see ackDelay); a
// later one supersedes it, the acknowledgements being cumulative.
func (qp *QP) queueAck(psn wire.PSN, syn wire.Syndrome, urgent bool) {
	qp.ackPSN, qp.ackSyn = psn, syn
	if !qp.ackDirty {
		qp.ackDirty = true
		qp.ackAt = nanotime()
	}
	qp.ackUrgent = qp.ackUrgent || urgent
	if !qp.ackListed {
		qp.ackListed = true
		qp.e.dirty = append(qp.e.dirty, qp)
	}
	if d := qp.ackAt + qp.ackWait; d < qp.e.ackDue.Load() {
		qp.e.ackDue.Store(d)
	}
}

// ackDueBy reports whether the queued acknowledgement must go by now
// (qp.mu held).
func (rsp *responder) ackDueBy(now int64) bool {
	return rsp.ackUrgent || rsp.ackPkts >= ackEvery || now-rsp.ackAt >= rsp.ackWait
}

// sendAckLocked sends a queued acknowledgement (qp.mu held).
func (qp *QP) sendAckLocked() {
	if !qp.ackDirty {
		return
	}
	n := qp.buildAck(qp.ackPSN, qp.ackSyn)
	qp.ackPkt[0] = link.Packet{Buf: qp.ackBuf[:n], N: n, Addr: qp.dest, SrcPort: qp.sport, Shm: qp.viaShm,
		Unsealed: qp.e.unsealed(qp.viaShm)}
	qp.e.send(qp.ackPkt[:])
}

// buildAck builds an ACK or NAK in qp.ackBuf and returns its length; the
// queued acknowledgement, if any, is then sent (or superseded).
func (qp *QP) buildAck(psn wire.PSN, syn wire.Syndrome) int {
	qp.ackDirty, qp.ackUrgent, qp.ackPkts = false, false, 0
	f := wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCAcknowledge, PKey: qp.attr.PKey, DestQP: qp.attr.DestQPN, PSN: psn},
		Syndrome: syn, MSN: qp.msn}
	buf := qp.ackBuf[:]
	n, _ := wire.Build(buf, &f, nil)
	qp.e.sealICRC(qp.icrcBuf[:], buf[:n], qp.dest.Addr(), qp.sport, qp.viaShm) // the packet's Unsealed: qp.e.unsealed(qp.viaShm)
	return n
}

// sendAck sends an ACK, RNR NAK or NAK at once. It supersedes a queued
// acknowledgement: a NAK or RNR NAK acknowledges every PSN before its
// own, and an ACK sent at once is at least as new.
func (qp *QP) sendAck(psn wire.PSN, syn wire.Syndrome) {
	n := qp.buildAck(psn, syn)
	qp.ackPkt[0] = link.Packet{Buf: qp.ackBuf[:n], N: n, Addr: qp.dest, SrcPort: qp.sport, Shm: qp.viaShm,
		Unsealed: qp.e.unsealed(qp.viaShm)}
	qp.e.send(qp.ackPkt[:])
}

// udInput takes a UD datagram: check the Q_Key, store the message.
func (qp *QP) udInput(p *wire.Packet) {
	qp.ctr.RxPackets.Add(1)
	if p.DETH.QKey() != qp.attr.QKey {
		qp.ctr.Drop(fabric.DropAccess, 1)
		return
	}
	n := len(p.Payload)
	if n > qp.mtu || n > qp.cfg.MaxMsgSize {
		qp.ctr.Drop(fabric.DropMalformed, 1)
		return
	}
	if !qp.recvRoom(n) {
		qp.ctr.Drop(fabric.DropNoBuffer, 1)
		return
	}
	qp.beginRecord(n)
	qp.appendRecord(p.Payload)
	var imm, fl uint32
	if p.ImmDt != nil {
		imm, fl = p.ImmDt.Imm(), recFlagImm
	}
	qp.srcQPN = p.DETH.SrcQP()
	qp.commitRecord(imm, fl, n)
}
