package roce

import (
	"crypto/rand"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
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
	pkt  [1]Packet
	psn  wire.PSN
}

func (t *gsiTx) init() {
	var b [4]byte
	rand.Read(b[:])
	t.psn = wire.PSN(binary.LittleEndian.Uint32(b[:]) & wire.PSNMask)
}

// gsiInput takes a datagram addressed to QP 1. It runs on the polling
// thread.
func (e *Engine) gsiInput(p *wire.Packet, src netip.Addr) {
	m := e.gsi.Load()
	if m == nil {
		e.drop(fabric.DropOther)
		return
	}
	if p.OpCode() != wire.OpUDSendOnly || p.DETH.QKey() != cm.GSIQKey {
		m.ctr.badTransport.Add(1)
		e.drop(fabric.DropMalformed)
		return
	}
	mad, err := cm.ParseMAD(p.Payload)
	if err != nil {
		m.ctr.drops.Add(err)
		e.drop(fabric.DropMalformed)
		return
	}
	m.ctr.rx.Add(1)
	m.input(mad, src)
}

// sendMAD sends the MAD mad (cm.MADSize bytes) to the GSI of dst.
func (m *CM) sendMAD(dst netip.Addr, mad []byte) {
	t := &m.tx
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
	m.e.sealICRC(t.hbuf[:], b, dst, sport)
	t.pkt[0] = Packet{Buf: b, N: len(b), Addr: netip.AddrPortFrom(dst, Port), SrcPort: sport}
	m.e.send(t.pkt[:])
	m.ctr.tx.Add(1)
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
