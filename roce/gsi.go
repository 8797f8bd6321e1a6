package roce

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// The General Services Interface: queue pair 1, which carries the
// management datagrams of the communication manager as UD SENDs with Q_Key
// cm.GSIQKey on the default partition. The engine hands every packet for
// QP 1 to its CM (the one hook in Engine.input); the CM sends through
// sendMAD.

const gsiQPN = cm.GSIQPN

// gsiPacketSize is a GSI datagram: BTH, DETH, the MAD and the ICRC.
const gsiPacketSize = wire.BTHSize + wire.DETHSize + cm.MADSize + wire.ICRCSize

// CMStats counts the communication manager's datagrams.
type CMStats struct {
	RxMADs, TxMADs uint64 // MADs received (valid) and sent
	Retransmits    uint64 // MADs sent again after a response timeout
	// Malformed counts datagrams to QP 1 dropped by cm.ParseMAD, by
	// reason (index cm.Reason), plus those with a wrong opcode or Q_Key
	// (index 0).
	Malformed [16]uint64
	// Unmatched counts valid MADs dropped because they match no
	// connection in a state that takes them: unknown or forged
	// communication ids, REPs for connections that never existed,
	// messages from the wrong address.
	Unmatched uint64
}

type gsiCounters struct {
	rx, tx, retx, unmatched, badTransport atomic.Uint64
	drops                                 cm.Drops
}

// gsiTx is the transmit side of the GSI: one buffer under a lock (MADs
// are rare and small), with the GSI's own PSN.
type gsiTx struct {
	mu   sync.Mutex
	buf  [gsiPacketSize]byte
	hbuf [48 + wire.BTHSize]byte
	pkt  [1]link.Packet
	psn  wire.PSN
}

func (t *gsiTx) init() {
	var b [4]byte
	rand.Read(b[:])
	t.psn = wire.PSN(binary.LittleEndian.Uint32(b[:]) & wire.PSNMask)
}

// gsiInput takes a datagram addressed to QP 1. It runs on the polling
// thread. A goodbye (see sendGoodbye) is the engine's own; every other
// MAD goes to the CM, if it runs.
func (e *Engine) gsiInput(p *wire.Packet, src netip.Addr) {
	m := e.gsi.Load()
	if p.OpCode() != wire.OpUDSendOnly || p.DETH.QKey() != cm.GSIQKey {
		if m != nil {
			m.ctr.badTransport.Add(1)
		}
		e.drop(fabric.DropMalformed)
		return
	}
	mad, err := cm.ParseMAD(p.Payload)
	if err != nil {
		if m != nil {
			m.ctr.drops.Add(err)
		}
		e.drop(fabric.DropMalformed)
		return
	}
	if isGoodbye(mad) {
		e.goodbyeInput(cm.DREQ(mad.Data()), src)
		return
	}
	if m == nil {
		e.drop(fabric.DropOther)
		return
	}
	m.ctr.rx.Add(1)
	m.input(mad, src)
}

// sendMAD sends the MAD mad (cm.MADSize bytes) to the GSI of dst,
// through dst's shared-memory ring if shm (see sendGSI).
func (m *CM) sendMAD(dst netip.Addr, mad []byte, shm bool) {
	m.e.sendGSI(dst, mad, shm)
	m.ctr.tx.Add(1)
}

// sendGSI sends the MAD mad (cm.MADSize bytes) from QP 1 to the GSI of
// dst: through dst's shared-memory ring if shm (link.Packet.Shm), the
// carrier of the queue pair the MAD is about, so that it arrives after
// that QP's packets sent before it.
func (e *Engine) sendGSI(dst netip.Addr, mad []byte, shm bool) {
	t := &e.gsiTx
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf[:]
	var f wire.BTHFields
	f.OpCode = wire.OpUDSendOnly
	f.PKey = wire.DefaultPKey
	f.DestQP = gsiQPN
	f.PSN = t.psn
	t.psn = t.psn.Add(1)
	wire.BTH(b).Encode(&f)
	wire.DETH(b[wire.BTHSize:]).Encode(cm.GSIQKey, gsiQPN)
	copy(b[wire.BTHSize+wire.DETHSize:], mad[:cm.MADSize])
	sport := udSrcPort(gsiQPN)
	u := e.sealICRC(t.hbuf[:], b, dst, sport, shm)
	t.pkt[0] = link.Packet{Buf: b, N: len(b), Addr: netip.AddrPortFrom(dst, link.Port), SrcPort: sport, Shm: shm, Unsealed: u}
	e.send(t.pkt[:])
}

// A goodbye tells the peer of an RC queue pair connected without the CM
// (the pingpong exchange of Connect and the Listener) that this side
// closed it, so that the peer fails the QP at once with
// fabric.StatusPeerClosed instead of finding out when its retries run
// out. It is a DREQ, as rdma_disconnect sends, for a connection the CM
// did not make: its remote communication id is 0 (no CM assigns 0), its
// local id the closing QP's number and its remote QPN the peer's. A peer
// engine fails its QP of that number only if the QP is connected to the
// sender's address and QP; a Linux CM finds no connection of id 0 and
// answers with a DREP, which the engine drops. It is sent once: a
// goodbye that is lost leaves the peer to its keep-alive.

// isGoodbye reports whether mad is a goodbye.
func isGoodbye(mad cm.MAD) bool {
	if mad.AttrID() != cm.AttrDREQ {
		return false
	}
	d := cm.DREQ(mad.Data())
	return d.RemoteCommID() == 0 && d.LocalCommID() != 0
}

// sendGoodbye tells the peer of qp, an RC queue pair connected without
// the CM, that qp is closing.
func (qp *QP) sendGoodbye() {
	qp.mu.Lock()
	up := qp.state == StateRTS || qp.state == StateRTR
	dst, peer := qp.attr.Dest, qp.attr.DestQPN
	if up {
		// What arrived is acknowledged first, on the same link: the
		// peer must not fail a send that this side took in.
		qp.sendAckLocked()
	}
	qp.mu.Unlock()
	if !up || qp.cfg.Type != RC {
		return
	}
	var b [cm.MADSize]byte
	mad := cm.MAD(b[:])
	var tid [8]byte
	rand.Read(tid[:])
	mad.Init(cm.AttrDREQ, binary.BigEndian.Uint64(tid[:]))
	d := cm.DREQ(mad.Data())
	d.SetLocalCommID(qp.qpn)
	d.SetRemoteCommID(0)
	d.SetRemoteQPN(peer)
	qp.e.sendGSI(dst, b[:], qp.viaShm) // after the acknowledgement, on its link
	qp.e.goodbyes.sent.Add(1)
}

// goodbyeInput fails the QP a goodbye names, if it is connected to the
// sender; anything else is counted and dropped.
func (e *Engine) goodbyeInput(d cm.DREQ, src netip.Addr) {
	if b := e.QPNBlock(); b != 0 && d.RemoteQPN()>>link.QPNBlockBits != b {
		// Another engine's on a shared port: every raw socket of the
		// port sees QP 1 (see UDPLink), and the owner takes it.
		e.goodbyes.foreign.Add(1)
		return
	}
	e.objMu.RLock()
	qp := e.qps[d.RemoteQPN()]
	e.objMu.RUnlock()
	if qp == nil || qp.cfg.Type != RC {
		e.goodbyes.unmatched.Add(1)
		e.drop(fabric.DropOther)
		return
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.attr.Dest != src || qp.attr.DestQPN != d.LocalCommID() || (qp.state != StateRTS && qp.state != StateRTR) {
		e.goodbyes.unmatched.Add(1)
		e.drop(fabric.DropOther)
		return
	}
	e.goodbyes.received.Add(1)
	qp.errorLocked(fabric.StatusPeerClosed)
}

// goodbyeCounters count goodbyes (gsi.go).
type goodbyeCounters struct {
	sent, received, unmatched atomic.Uint64
	foreign                   atomic.Uint64 // for another engine's QPN block
}

// Stats returns the CM's counters.
func (m *CM) Stats() CMStats {
	s := CMStats{RxMADs: m.ctr.rx.Load(), TxMADs: m.ctr.tx.Load(), Retransmits: m.ctr.retx.Load(),
		Unmatched: m.ctr.unmatched.Load()}
	s.Malformed[0] = m.ctr.badTransport.Load()
	for r := cm.ReasonSize; r <= cm.ReasonCMAHeader; r++ {
		s.Malformed[r] = m.ctr.drops.Count(r)
	}
	return s
}
