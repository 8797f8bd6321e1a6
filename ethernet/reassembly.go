package ethernet

// The receiver: frames from the shared queue are checked and filed in
// the deliver queue by sequence number, and Recv reassembles the
// messages from it.

import (
	"github.com/weft-io/weft/fabric"
)

// recvQueue is the receiver part of an Endpoint (guarded by its mu): the
// frames posted to the shared queue, the deliver queue in sequence order
// and the acknowledgement state.
type recvQueue struct {
	rxPool     []uint32
	fillTarget int
	dq         []rxEnt // deliver queue, indexed by position & (dcap-1)
	dqValid    []bool  // slot holds a packet (in order, or buffered ahead)
	dqHead     uint32
	dqTail     uint32
	dqMsgs     int // complete messages in dq
	rcvNxt     uint32
	advLimit   uint32 // the last limit advertised to the peer
	ackPending int
	nakFor     uint32
	nakValid   bool
}

type rxEnt struct {
	addr  uint64 // of the payload
	len   uint32
	flags uint8
	imm   uint32
}

// credits returns how many more packets the deliver queue takes.
func (e *Endpoint) credits() uint32 { return e.dcap - (e.dqTail - e.dqHead) }

// refillLocked posts frames of the RX pool to the inbox.
func (e *Endpoint) refillLocked() {
	want := e.fillTarget - e.in.free.len()
	for ; want > 0 && len(e.rxPool) > 0; want-- {
		top := len(e.rxPool) - 1
		if !e.in.free.push(uint64(e.rxPool[top])) {
			return
		}
		e.rxPool = e.rxPool[:top]
	}
}

// pollLocked processes up to budget received frames: acknowledgements
// update the sender, data in sequence goes to the deliver queue.
func (e *Endpoint) pollLocked(budget int) int {
	e.m.poll()
	var pkts, bytes uint64
	n := 0
	for ; n < budget; n++ {
		v, ok := e.in.ready.pop()
		if !ok {
			break
		}
		f, l := uint32(v>>32), uint32(v)
		if !e.handleLocked(uint64(f)*e.fsize, l) {
			e.rxPool = append(e.rxPool, f)
		}
		pkts++
		bytes += uint64(l)
	}
	if n == 0 {
		return 0
	}
	e.refillLocked()
	e.ctr.RxPackets.Add(pkts)
	e.ctr.RxBytes.Add(bytes)
	// Acknowledge every ackEvery packets; smaller remainders ride on
	// our next data packet or go out with the next tick (1ms), well
	// within the sender's retransmission timer.
	if e.ackPending >= ackEvery && e.up {
		e.sendCtlLocked(ptAck, 0)
	}
	return n
}

// handleLocked processes one received frame and reports whether the
// frame was kept (in the deliver queue).
func (e *Endpoint) handleLocked(addr uint64, n uint32) bool {
	b := e.mem[addr : addr+uint64(n)]
	off := e.parseL2(b)
	if off < 0 {
		e.ctr.Drop(fabric.DropOther, 1)
		return false
	}
	var h hdr
	if !getHdr(b[off:], &h) {
		e.ctr.Drop(fabric.DropMalformed, 1)
		return false
	}
	if h.typ == ptHello || h.typ == ptHelloAck || h.typ == ptRefuse {
		e.helloLocked(b, off)
		return false
	}
	if e.peerSession == 0 || h.session != e.peerSession {
		e.ctr.Drop(fabric.DropOther, 1)
		return false
	}
	e.lastHeard = e.now
	e.ackLocked(h.ack, h.wnd, h.flags&pfNak != 0, h.imm)
	switch h.typ {
	case ptData:
		if e.dropEvery > 0 {
			if e.dropCount++; e.dropCount%e.dropEvery == 0 {
				return false
			}
		}
		return e.dataLocked(&h, addr, off, n)
	case ptFin:
		// A FIN with our session means the peer had the connection up.
		e.up = true
		e.failLocked(fabric.ErrPeerClosed)
	}
	return false
}

// dataLocked files a data packet in its deliver-queue slot: in order, it
// extends the in-order run (and the run of packets buffered after it);
// ahead of a gap, it waits in its slot and the gap is reported with a
// negative acknowledgement so the sender resends just the missing
// packets (selective repeat). It reports whether the frame was kept.
func (e *Endpoint) dataLocked(h *hdr, addr uint64, off int, n uint32) bool {
	d := h.psn - e.rcvNxt
	if int32(d) < 0 {
		e.ctr.Drop(fabric.DropDuplicate, 1)
		e.ackPending++
		return false
	}
	used := e.dqTail - e.dqHead
	if d >= e.dcap-used {
		e.ctr.Drop(fabric.DropNoBuffer, 1)
		e.ackPending++
		return false
	}
	mask := e.dcap - 1
	slot := (e.dqTail + d) & mask
	if e.dqValid[slot] {
		e.ctr.Drop(fabric.DropDuplicate, 1)
		return false
	}
	plen := int(n) - off - hdrLen
	e.dq[slot] = rxEnt{addr: addr + uint64(off+hdrLen), len: uint32(plen), flags: h.flags, imm: h.imm}
	e.dqValid[slot] = true
	if d != 0 {
		if !e.nakValid || e.nakFor != e.rcvNxt {
			// The gap runs from rcvNxt to the first buffered packet.
			gap := uint32(1)
			for gap < d && !e.dqValid[(e.dqTail+gap)&mask] {
				gap++
			}
			e.nakValid, e.nakFor = true, e.rcvNxt
			e.sendNakLocked(gap)
		}
		return true
	}
	for e.dqTail-e.dqHead < e.dcap && e.dqValid[e.dqTail&mask] {
		if e.dq[e.dqTail&mask].flags&pfLast != 0 {
			e.dqMsgs++
		}
		e.dqTail++
		e.rcvNxt++
		e.ackPending++
	}
	e.nakValid = false
	return true
}

// scatterAt copies src to offset off of the SGE list and returns how
// many bytes fit.
func scatterAt(sges []fabric.SGE, off int, src []byte) int {
	n := 0
	for i := range sges {
		if len(src) == 0 {
			break
		}
		s := &sges[i]
		if off >= s.Length {
			off -= s.Length
			continue
		}
		c := copy(s.Region.Bytes()[s.Offset+off:s.Offset+s.Length], src)
		src = src[c:]
		n += c
		off = 0
	}
	return n
}

// Recv implements fabric.Endpoint: it delivers complete messages in
// order, reassembling fragments into the message's SGEs.
func (e *Endpoint) Recv(msgs []fabric.Message) (int, error) {
	if e.closed.Load() {
		return 0, e.errClosed("recv")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return 0, e.errClosed("recv")
	}
	e.now = clock()
	if e.dqMsgs < len(msgs) {
		e.pollLocked(256)
	}
	n := 0
	var bytes uint64
	var err error
	for n < len(msgs) && e.dqMsgs > 0 {
		m := &msgs[n]
		capacity, cerr := fabric.CheckSGEs(m.SGEs, &e.dom, fabric.AccessLocalWrite)
		if cerr != nil {
			err = e.opErr("recv", cerr)
			break
		}
		first := &e.dq[e.dqHead&(e.dcap-1)]
		m.Flags, m.Imm = 0, 0
		if first.flags&pfImm != 0 {
			m.Flags, m.Imm = fabric.FlagImm, first.imm
		}
		total := 0
		for {
			ent := &e.dq[e.dqHead&(e.dcap-1)]
			e.dqValid[e.dqHead&(e.dcap-1)] = false
			if total < capacity {
				scatterAt(m.SGEs, total, e.mem[ent.addr:ent.addr+uint64(ent.len)])
			}
			total += int(ent.len)
			e.rxPool = append(e.rxPool, uint32(ent.addr/e.fsize))
			e.dqHead++
			if ent.flags&pfLast != 0 {
				break
			}
		}
		m.Len = min(total, capacity)
		if total > capacity {
			m.Flags |= fabric.FlagTruncated
			e.ctr.Drop(fabric.DropTruncated, 1)
		}
		e.dqMsgs--
		bytes += uint64(total)
		n++
	}
	if n > 0 {
		e.refillLocked()
		e.ctr.RxMessages.Add(uint64(n))
		// Window update when the advertised window ran low.
		if e.up && e.advLimit-e.rcvNxt < e.dcap/2 && e.credits() >= e.dcap/2 {
			e.sendCtlLocked(ptAck, 0)
		}
	} else if err == nil && e.gone != nil && e.dqMsgs == 0 {
		err = e.opErr("recv", e.gone)
	}
	_ = bytes
	return n, err
}
