package roce

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// The rule of the ICRC on a ring (Engine.unsealed): an engine leaves the
// ICRC out of exactly the packets its link writes into a peer's ring:
// every packet of a ShmLink, the packets marked Shm of an automatic link
// with a ring; never a UDP packet, and never through a link it does not
// know (a LossyLink over a ring corrupts what it carries). sealICRC
// follows it: an unsealed packet's ICRC bytes are left as they were, a
// sealed one's are the wire's.
func TestUnsealedRule(t *testing.T) {
	newEngine := func(cfg EngineConfig) *Engine {
		t.Helper()
		if !cfg.Addr.IsValid() && cfg.Link == nil {
			cfg.Addr = netip.AddrPortFrom(shmAddr(), link.Port)
		}
		e, err := NewEngine(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	ring, err := link.ListenShm(netip.AddrPortFrom(shmAddr(), link.Port), link.ShmConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ring.Close() })
	auto := newEngine(EngineConfig{Auto: true, NoRaw: true})
	if auto.auto == nil || !auto.auto.Shm() {
		t.Skip("no ring for the automatic engine on this host")
	}
	for _, c := range []struct {
		name          string
		e             *Engine
		plain, viaShm bool // unsealed(false), unsealed(true)
	}{
		{"udp", newEngine(EngineConfig{NoRaw: true}), false, false},
		{"auto", auto, false, true},
		{"shm", newEngine(EngineConfig{Shm: true}), true, true},
		{"lossy over a ring", newEngine(EngineConfig{Link: link.NewLossyLink(ring, link.LossConfig{Seed: 1})}), false, false},
	} {
		for _, shm := range []bool{false, true} {
			want := c.plain
			if shm {
				want = c.viaShm
			}
			if got := c.e.unsealed(shm); got != want {
				t.Errorf("%s: unsealed(Shm %v) = %v, want %v", c.name, shm, got, want)
			}
			b := make([]byte, wire.BTHSize+32+wire.ICRCSize)
			wire.BTH(b).Encode(&wire.BTHFields{OpCode: wire.OpRCSendOnly, PKey: wire.DefaultPKey, DestQP: 0x42})
			sealed := bytes.Clone(b)
			var h [48 + wire.BTHSize]byte
			dst := netip.MustParseAddr("127.0.0.7")
			wire.SealICRC(h[:], sealed, c.e.LocalAddr(), dst, 0xc002)
			u := c.e.sealICRC(h[:], b, dst, 0xc002, shm)
			switch {
			case u != want:
				t.Errorf("%s: sealICRC(Shm %v) reports unsealed %v, want %v", c.name, shm, u, want)
			case u && binary.LittleEndian.Uint32(b[len(b)-4:]) != 0:
				t.Errorf("%s: sealICRC(Shm %v) computed the ICRC of a packet for a ring", c.name, shm)
			case !u && !bytes.Equal(b, sealed):
				t.Errorf("%s: sealICRC(Shm %v) left ICRC %#x, want the wire's %#x", c.name, shm,
					binary.LittleEndian.Uint32(b[len(b)-4:]), binary.LittleEndian.Uint32(sealed[len(sealed)-4:]))
			}
		}
	}
}

// A datagram a ring says came unsealed is not checked: a wrong ICRC
// passes (here to the QP lookup, which drops it as for no queue pair);
// the same datagram from anywhere else is refused for its ICRC.
func TestUnsealedInput(t *testing.T) {
	p := newPeer(t)
	e := p.e
	b := make([]byte, wire.BTHSize+16+wire.ICRCSize)
	wire.BTH(b).Encode(&wire.BTHFields{OpCode: wire.OpRCSendOnly, PKey: wire.DefaultPKey, DestQP: 0x999})
	binary.LittleEndian.PutUint32(b[len(b)-4:], 0xdeadbeef) // no ICRC of this packet
	in := func(unsealed bool) {
		e.pollMu.Lock()
		defer e.pollMu.Unlock()
		e.input(&link.Packet{Buf: b, N: len(b), Addr: netip.AddrPortFrom(peerAddr, link.Port), SrcPort: 0xc001, Unsealed: unsealed})
	}
	s0 := e.Stats()
	in(true)
	s1 := e.Stats()
	if d := s1.Drops[fabric.DropChecksum] - s0.Drops[fabric.DropChecksum]; d != 0 {
		t.Fatalf("a ring's unsealed datagram was checked: %d ICRC drops", d)
	}
	if d := s1.Drops[fabric.DropOther] - s0.Drops[fabric.DropOther]; d != 1 {
		t.Fatalf("a ring's unsealed datagram for no QP: %d drops for no QP, want 1 (it passed the ICRC)", d)
	}
	in(false)
	if d := e.Stats().Drops[fabric.DropChecksum] - s1.Drops[fabric.DropChecksum]; d != 1 {
		t.Fatalf("a datagram with a wrong ICRC not marked unsealed: %d ICRC drops, want 1", d)
	}
}

// The QP list runTimers walks (Engine.qpList) holds exactly the engine's
// live QPs, each at its index, whatever order they are destroyed in: a
// QP missing from it would never time out or retransmit.
func TestQPList(t *testing.T) {
	e := newPeer(t).e
	pd := e.AllocPD()
	var qps []*QP
	for range 12 {
		qp, err := pd.CreateQP(QPConfig{})
		if err != nil {
			t.Fatal(err)
		}
		qps = append(qps, qp)
	}
	check := func() {
		t.Helper()
		e.objMu.RLock()
		defer e.objMu.RUnlock()
		if len(e.qpList) != len(e.qps) {
			t.Fatalf("%d QPs listed, %d in the engine", len(e.qpList), len(e.qps))
		}
		for i, qp := range e.qpList {
			if qp.listed != i || e.qps[qp.qpn] != qp {
				t.Fatalf("list entry %d: QP %#x at index %d, in the engine %v", i, qp.qpn, qp.listed, e.qps[qp.qpn] == qp)
			}
		}
	}
	check()
	for _, i := range []int{3, 0, 11, 5, 6, 1, 10, 2, 4, 9, 8, 7} {
		qps[i].Destroy()
		check()
	}
}

// TestEngineBusyTimers: while another thread holds the poll lock (a
// caller's poll), the background poller still runs the QPs' timers, as
// often as busyTimers allows: here the RNR delay's retransmission, due
// 20 ms after the RNR NAK, goes out while the test holds the lock.
func TestEngineBusyTimers(t *testing.T) {
	p := newPeer(t)
	qp, pd := p.rcQP(QPConfig{}, QPAttr{RNRRetry: 7}) // Timeout 0: no retransmission timer
	postSend(t, qp, pd, 8, 'b', 1)
	p.expect("the send", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
	p.ack(qp, qpSQPSN, wire.RNRNAKSyndrome(wire.RNRTimerFor(20*time.Millisecond)))
	p.e.pollMu.Lock()
	defer p.e.pollMu.Unlock()
	p.expect("the send again after the RNR delay, the poll lock held elsewhere", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
}

// A datagram lent from a ring (link.Packet.Unsealed) lies in memory that
// another process maps: a faulty or hostile writer may change it while
// the engine reads it. The engine reads its headers once, from its own
// copy: here the opcode of a SEND_ONLY turns into a READ request's (which
// has a RETH the parsed packet lacks) after the parse, and the engine
// neither panics nor sees the change: the SEND arrives.
func TestLentDatagramChangesUnderInput(t *testing.T) {
	p := newPeer(t)
	qp, _ := p.rcQP(QPConfig{}, QPAttr{})
	f := wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCSendOnly, PKey: 0xffff, DestQP: qp.QPN(), PSN: qpRQPSN}}
	b := make([]byte, wire.PacketLen(wire.OpRCSendOnly, 8))
	n, err := wire.Build(b, &f, []byte("lentdata"))
	if err != nil {
		t.Fatal(err)
	}
	lentHook = func(data []byte) {
		wire.BTH(data).SetOpCode(wire.OpRCReadRequest) // the writer, after the parse
	}
	t.Cleanup(func() { lentHook = nil })
	func() {
		p.e.pollMu.Lock()
		defer p.e.pollMu.Unlock()
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("a lent datagram changed under the engine panicked it: %v", r)
			}
		}()
		p.e.input(&link.Packet{Buf: b[:n], N: n, Addr: netip.AddrPortFrom(peerAddr, link.Port), SrcPort: 0xc001, Unsealed: true})
	}()
	if got := received(t, qp); len(got) != 1 || got[0] != "lentdata" {
		t.Fatalf("received %q; want the SEND as parsed, [lentdata]", got)
	}
}

// A lent MAD (for QP 1) is copied whole before the CM reads it, field by
// field: here the ring's bytes are wiped after the parse, and the CM gets
// the MAD as it arrived (an RTU no connection matches).
func TestLentMADCopied(t *testing.T) {
	p := newPeer(t)
	m := p.e.CM()
	mad := cmMAD(cm.AttrRTU, 1, nil)
	f := wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: gsiQPN}, QKey: cm.GSIQKey, SrcQP: gsiQPN}
	b := make([]byte, wire.PacketLen(wire.OpUDSendOnly, len(mad)))
	n, err := wire.Build(b, &f, mad)
	if err != nil {
		t.Fatal(err)
	}
	lentHook = func(data []byte) { clear(data[wire.BTHSize+wire.DETHSize:]) }
	t.Cleanup(func() { lentHook = nil })
	before, malformed := m.Stats().Unmatched, p.e.Stats().Drops[fabric.DropMalformed]
	func() {
		p.e.pollMu.Lock()
		defer p.e.pollMu.Unlock()
		p.e.input(&link.Packet{Buf: b[:n], N: n, Addr: netip.AddrPortFrom(peerAddr, link.Port), SrcPort: 0xc001, Unsealed: true})
	}()
	if got, drop := m.Stats().Unmatched-before, p.e.Stats().Drops[fabric.DropMalformed]-malformed; got != 1 || drop != 0 {
		t.Fatalf("a lent MAD wiped after its parse: %d unmatched, %d malformed; want the CM to read it as it came (1, 0)", got, drop)
	}
}
