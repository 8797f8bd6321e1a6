package ethernet

// The sender: Send cuts messages into packets, the go-back-N window
// with selective resends transmits them within the peer's credit, and
// acknowledgements (cumulative, negative) move it on.

import (
	"time"

	"github.com/weft-io/weft/fabric"
)

// sendWindow is the sender part of an Endpoint (guarded by its mu): the
// frames for packets, the window of unacknowledged packets and the
// retransmission timer.
type sendWindow struct {
	txPool       []uint32
	unacked      []txEnt // indexed by psn & (window-1)
	sndUna       uint32  // oldest unacknowledged psn
	sndNxt       uint32  // next psn to assign
	sndNext      uint32  // next psn to transmit
	sndMax       uint32  // highest psn transmitted + 1
	peerLimit    uint32  // the peer takes psns below this
	rto          time.Duration
	rtt          rttEst
	rtoAt        int64
	lastProgress int64
	goBackFor    uint32
	goBackValid  bool
}

// sendNakLocked sends a negative acknowledgement: the packets from
// rcvNxt on, gap of them, are missing.
func (e *Endpoint) sendNakLocked(gap uint32) bool {
	return e.sendCtlImmLocked(ptAck, pfNak, gap)
}

// sendCtlLocked sends a control packet (ack, hello, hello-ack, fin) with
// the current acknowledgement state.
func (e *Endpoint) sendCtlLocked(typ, flags uint8) bool {
	return e.sendCtlImmLocked(typ, flags, 0)
}

func (e *Endpoint) sendCtlImmLocked(typ, flags uint8, imm uint32) bool {
	return e.sendCtlBodyLocked(typ, flags, imm, 0)
}

func (e *Endpoint) sendCtlBodyLocked(typ, flags uint8, imm uint32, body int) bool {
	if len(e.txPool) == 0 {
		return false
	}
	f := e.txPool[len(e.txPool)-1]
	b := e.frame(f)
	cr := e.credits()
	putHdr(b[e.hdrOff:], &hdr{typ: typ, flags: flags, session: e.session, ack: e.rcvNxt, wnd: cr, imm: imm, dst: e.peerSession})
	if body > 0 {
		putHello(b[e.hdrOff+hdrLen:], e.nonce, e.peerNonce)
	}
	e.ctl[0] = txEnt{frame: f, len: uint32(e.writeL2(b, hdrLen+body))}
	if e.m.transmit(e.mem, e.fsize, e.ctl[:]) == 0 {
		return false
	}
	e.advLimit = e.rcvNxt + cr
	e.ackPending = 0
	e.lastSent = e.now
	return true
}

// ackLocked applies a cumulative acknowledgement and window; a negative
// acknowledgement also resends the gap packets it names.
func (e *Endpoint) ackLocked(ack, wnd uint32, nak bool, gap uint32) {
	if seqLT(e.sndUna, ack) && !seqLT(e.sndNxt, ack) {
		for p := e.sndUna; p != ack; p++ {
			e.txPool = append(e.txPool, e.unacked[p&(e.window-1)].frame)
		}
		e.sndUna = ack
		if seqLT(e.sndNext, ack) {
			e.sndNext = ack
		}
		e.lastProgress = e.now
		e.rtt.acked(ack, e.now)
		e.rto = e.rtt.rto()
		e.rtoAt = 0
		if e.sndUna != e.sndNxt {
			e.rtoAt = e.now + int64(e.rto)
		}
	}
	if lim := ack + wnd; !seqLT(lim, e.peerLimit) || seqLT(e.sndNxt, e.peerLimit) {
		e.peerLimit = lim
	}
	if nak && ack == e.sndUna && seqLT(ack, e.sndNext) && (!e.goBackValid || e.goBackFor != ack) {
		e.goBackValid, e.goBackFor = true, ack
		e.resendLocked(ack, min(max(gap, 1), e.sndNext-ack))
	}
}

// transmitLocked hands packets psn..psn+n-1 to the shared queue and
// returns how many it took.
func (e *Endpoint) transmitLocked(psn, n uint32) uint32 {
	var sent uint32
	for sent < n {
		i := (psn + sent) & (e.window - 1)
		k := min(n-sent, e.window-i)
		got := uint32(e.m.transmit(e.mem, e.fsize, e.unacked[i:i+k]))
		sent += got
		if got < k {
			break
		}
	}
	return sent
}

// resendLocked retransmits n packets from psn, as the TX ring allows.
func (e *Endpoint) resendLocked(psn, n uint32) {
	e.rtt.retransmitted()
	if got := e.transmitLocked(psn, n); got > 0 {
		e.ctr.Retransmits.Add(uint64(got))
		e.ctr.TxPackets.Add(uint64(got))
		e.lastSent = e.now
	}
}

// pumpLocked transmits packets from sndNext within the peer's window
// (one past it with probe) as the TX ring allows.
func (e *Endpoint) pumpLocked(probe bool) {
	if e.sndNext == e.sndNxt {
		return
	}
	lim := e.peerLimit
	if probe && !seqLT(e.sndNext, lim) {
		lim = e.sndNext + 1
	}
	if !seqLT(e.sndNext, lim) {
		return
	}
	k := min(e.sndNxt-e.sndNext, lim-e.sndNext)
	got := e.transmitLocked(e.sndNext, k)
	if got == 0 {
		return
	}
	var retx uint64
	if seqLT(e.sndNext, e.sndMax) {
		retx = uint64(min(got, e.sndMax-e.sndNext))
	}
	e.sndNext += got
	if seqLT(e.sndMax, e.sndNext) {
		e.sndMax = e.sndNext
		e.rtt.sent(e.sndMax-1, e.now)
	}
	if e.rtoAt == 0 {
		e.rtoAt = e.now + int64(e.rto)
	}
	e.lastSent = e.now
	if retx > 0 {
		e.ctr.Retransmits.Add(retx)
	}
	e.ctr.TxPackets.Add(uint64(got))
}

// Send implements fabric.Endpoint. Each message is copied into UMEM
// frames (one per MTU-sized fragment) before Send returns; it is then
// the transport's to deliver. n < len(msgs) is backpressure: the window
// of unacknowledged packets or the frame pool is full.
func (e *Endpoint) Send(msgs []fabric.Message) (int, error) {
	if e.closed.Load() {
		return 0, e.errClosed("send")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return 0, e.errClosed("send")
	}
	if e.gone != nil {
		return 0, e.opErr("send", e.gone)
	}
	e.now = clock()
	n := 0
	var bytes uint64
	var err error
	polled := false
	for n < len(msgs) {
		m := &msgs[n]
		if len(m.SGEs) > maxSGEs {
			err = e.opErr("send", fabric.ErrMessageSize)
			break
		}
		size, cerr := fabric.CheckSGEs(m.SGEs, &e.dom, 0)
		if cerr != nil {
			err = e.opErr("send", cerr)
			break
		}
		if size > e.maxMsg {
			err = e.opErr("send", fabric.ErrMessageSize)
			break
		}
		frags := 1
		if size > e.maxPayload {
			frags = (size + e.maxPayload - 1) / e.maxPayload
		}
		if int(e.sndNxt-e.sndUna)+frags > int(e.window) || len(e.txPool) < frags+ctlReserve {
			if polled {
				break
			}
			// Take in acknowledgements and completions, then retry once.
			polled = true
			e.pollLocked(256)
			continue
		}
		if m.Flags&fabric.FlagSignal != 0 && e.cq.Free() == 0 {
			break
		}
		if e.sndUna == e.sndNxt {
			// Nothing was outstanding: the acknowledgement clock starts
			// now, not when the connection last made progress.
			e.lastProgress = e.now
		}
		off := 0
		for i := 0; i < frags; i++ {
			f := e.txPool[len(e.txPool)-1]
			e.txPool = e.txPool[:len(e.txPool)-1]
			b := e.frame(f)
			plen := min(e.maxPayload, size-off)
			h := hdr{typ: ptData, session: e.session, psn: e.sndNxt, ack: e.rcvNxt, wnd: e.credits(), dst: e.peerSession}
			if i == 0 {
				h.flags |= pfFirst
				if m.Flags&fabric.FlagImm != 0 {
					h.flags |= pfImm
					h.imm = m.Imm
				}
			}
			if i == frags-1 {
				h.flags |= pfLast
			}
			putHdr(b[e.hdrOff:], &h)
			gatherAt(b[e.hdrOff+hdrLen:e.hdrOff+hdrLen+plen], m.SGEs, off)
			fl := e.writeL2(b, hdrLen+plen)
			e.unacked[e.sndNxt&(e.window-1)] = txEnt{frame: f, len: uint32(fl)}
			e.sndNxt++
			off += plen
		}
		if m.Flags&fabric.FlagSignal != 0 {
			e.cq.Push(fabric.Completion{Context: m.Context, Op: fabric.OpSend, Len: size})
		}
		bytes += uint64(size)
		n++
	}
	e.pumpLocked(false)
	if n > 0 {
		if e.sndNext == e.sndNxt {
			// What we just sent carried the current acknowledgement.
			e.ackPending = 0
			e.advLimit = e.rcvNxt + e.credits()
		}
		e.ctr.TxMessages.Add(uint64(n))
		e.ctr.TxBytes.Add(bytes)
	}
	return n, err
}

// gatherAt copies len(dst) bytes from offset off of the SGE list.
func gatherAt(dst []byte, sges []fabric.SGE, off int) {
	for i := range sges {
		if len(dst) == 0 {
			return
		}
		s := &sges[i]
		if off >= s.Length {
			off -= s.Length
			continue
		}
		src := s.Region.Bytes()[s.Offset+off : s.Offset+s.Length]
		c := copy(dst, src)
		dst = dst[c:]
		off = 0
	}
}
