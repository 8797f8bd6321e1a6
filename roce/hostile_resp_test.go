package roce

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// The responder's rules, broken by a hostile peer (issue 29): remote
// access (keys, permissions, bounds), payload sizes at and beside the MTU
// and the largest message, message sequences, UD Q_Keys and sizes.

// remoteCase is one RDMA WRITE from the peer against a region of the
// engine: the request is taken, or NAKed with code and the QP fails.
type remoteCase struct {
	name string
	// write returns the RETH the peer sends for the region r (the
	// region's PD is the QP's; other is a region of another PD, dead one
	// deregistered).
	reth func(r, other, dead, ro *fabric.Region) wire.RETHFields
	n    int  // payload bytes
	ok   bool // taken; else NAKed with a remote access error
}

// TestRemoteAccessBounds: a WRITE's key, permission and bounds, each at
// the edge of what is allowed and one byte past it.
func TestRemoteAccessBounds(t *testing.T) {
	const size = 64
	key := func(r *fabric.Region) uint32 { return uint32(r.RemoteKey()) }
	at := func(r *fabric.Region, off int64, n int) wire.RETHFields {
		return wire.RETHFields{VA: uint64(int64(r.Addr()) + off), RKey: key(r), DMALength: uint32(n)}
	}
	for _, c := range []remoteCase{
		{"whole region", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(r, 0, size) }, size, true},
		{"the last byte", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(r, size-1, 1) }, 1, true},
		{"one byte past the end", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(r, size-1, 2) }, 2, false},
		{"starting at the end", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(r, size, 1) }, 1, false},
		{"one byte before the start", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(r, -1, 2) }, 2, false},
		{"far past the end", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(r, 1<<40, 1) }, 1, false},
		{"unknown key", func(r, o, d, ro *fabric.Region) wire.RETHFields {
			f := at(r, 0, 8)
			f.RKey ^= 0x5a5a5a5a
			return f
		}, 8, false},
		{"the local key", func(r, o, d, ro *fabric.Region) wire.RETHFields {
			f := at(r, 0, 8)
			f.RKey = uint32(r.LocalKey())
			return f
		}, 8, false},
		{"another PD's region", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(o, 0, 8) }, 8, false},
		{"a deregistered region", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(d, 0, 8) }, 8, false},
		{"a read-only region", func(r, o, d, ro *fabric.Region) wire.RETHFields { return at(ro, 0, 8) }, 8, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPeer(t)
			qp, pd := p.rcQP(QPConfig{}, QPAttr{})
			buf := make([]byte, size)
			r, _ := pd.RegMR(buf, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			other, _ := p.e.AllocPD().RegMR(make([]byte, size), fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			dead, _ := pd.RegMR(make([]byte, size), fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			ro, _ := pd.RegMR(make([]byte, size), fabric.AccessRemoteRead)
			reth := c.reth(r, other, dead, ro)
			dead.Close()
			access := drops(qp, fabric.DropAccess)
			p.request(qp, wire.OpRCWriteOnly, qpRQPSN, wire.Fields{RETH: reth}, bytes.Repeat([]byte{0xee}, c.n))
			if c.ok {
				ack := p.expect("the WRITE's ACK", isOp(wire.OpRCAcknowledge))
				if !ack.AETH.Syndrome().IsACK() || qp.State() != StateRTS {
					t.Fatalf("WRITE answered %v, QP %v; want an ACK", ack.AETH.Syndrome(), qp.State())
				}
				off := int(reth.VA - r.Addr())
				if !bytes.Equal(buf[off:off+c.n], bytes.Repeat([]byte{0xee}, c.n)) {
					t.Fatal("the WRITE's data is not in the region")
				}
				return
			}
			p.expect("a remote access NAK", isAck(wire.AckTypeNAK, wire.NAKRemoteAccessError))
			if qp.State() != StateErr || drops(qp, fabric.DropAccess)-access != 1 {
				t.Fatalf("QP %v, %d access drops; want ERR and 1", qp.State(), drops(qp, fabric.DropAccess)-access)
			}
			if !bytes.Equal(buf, make([]byte, size)) {
				t.Fatal("a refused WRITE changed the region")
			}
		})
	}
}

// TestDuplicateReadNotRechecked: a duplicate READ (PSN before the
// expected one) whose key fails is dropped without a NAK: a responder
// answers duplicates again or not at all, and does not fail.
func TestDuplicateReadNotRechecked(t *testing.T) {
	p := newPeer(t)
	qp, pd := p.rcQP(QPConfig{}, QPAttr{})
	r, _ := pd.RegMR(make([]byte, 64), fabric.AccessRemoteRead)
	read := wire.Fields{RETH: wire.RETHFields{VA: r.Addr(), RKey: uint32(r.RemoteKey()), DMALength: 8}}
	p.request(qp, wire.OpRCReadRequest, qpRQPSN, read, nil)
	p.expect("the read response", isOpPSN(wire.OpRCReadResponseOnly, qpRQPSN))
	read.RETH.RKey ^= 1
	p.request(qp, wire.OpRCReadRequest, qpRQPSN, read, nil) // the duplicate, its key now wrong
	if n := p.count(isAck(wire.AckTypeNAK, wire.NAKRemoteAccessError)); n != 0 || qp.State() != StateRTS {
		t.Fatalf("a duplicate READ with a bad key: %d NAKs, QP %v; want none and RTS", n, qp.State())
	}
	if d := drops(qp, fabric.DropDuplicate); d != 1 {
		t.Errorf("%d duplicates counted, want 1", d)
	}
	// The next READ, in sequence, is answered.
	read.RETH.RKey ^= 1
	p.request(qp, wire.OpRCReadRequest, qpRQPSN+1, read, nil)
	p.expect("the second read's response", isOpPSN(wire.OpRCReadResponseOnly, qpRQPSN+1))
}

// sizeCase is a sequence of SEND packets from the peer; the last is taken
// or NAKed as an invalid request.
type sizeCase struct {
	name string
	ops  []wire.OpCode
	lens []int
	ok   bool
}

// TestSendSizeBounds: FIRST and MIDDLE carry exactly one MTU, LAST and
// ONLY at most one, a message at most MaxMsgSize; MIDDLE and LAST only
// continue a message.
func TestSendSizeBounds(t *testing.T) {
	const mtu, maxMsg = 256, 600
	F, M, L, O := wire.OpRCSendFirst, wire.OpRCSendMiddle, wire.OpRCSendLast, wire.OpRCSendOnly
	for _, c := range []sizeCase{
		{"ONLY of MTU", []wire.OpCode{O}, []int{mtu}, true},
		{"ONLY of MTU+1", []wire.OpCode{O}, []int{mtu + 1}, false},
		{"ONLY of 0", []wire.OpCode{O}, []int{0}, true},
		{"FIRST of MTU-1", []wire.OpCode{F}, []int{mtu - 1}, false},
		{"FIRST of MTU+1", []wire.OpCode{F}, []int{mtu + 1}, false},
		{"MIDDLE of MTU-1", []wire.OpCode{F, M}, []int{mtu, mtu - 1}, false},
		{"LAST of MTU", []wire.OpCode{F, L}, []int{mtu, mtu}, true},
		{"LAST of MTU+1", []wire.OpCode{F, L}, []int{mtu, mtu + 1}, false},
		{"max message", []wire.OpCode{F, M, L}, []int{mtu, mtu, maxMsg - 2*mtu}, true},
		{"max message + 1", []wire.OpCode{F, M, L}, []int{mtu, mtu, maxMsg - 2*mtu + 1}, false},
		{"MIDDLE first", []wire.OpCode{M}, []int{mtu}, false},
		{"LAST first", []wire.OpCode{L}, []int{1}, false},
		{"FIRST in a message", []wire.OpCode{F, F}, []int{mtu, mtu}, false},
		{"ONLY in a message", []wire.OpCode{F, O}, []int{mtu, 1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPeer(t)
			qp, _ := p.rcQP(QPConfig{MaxMsgSize: maxMsg}, QPAttr{PathMTU: mtu})
			mal := drops(qp, fabric.DropMalformed)
			total := 0
			for i, op := range c.ops {
				p.request(qp, op, qpRQPSN.Add(i), wire.Fields{}, bytes.Repeat([]byte{byte('a' + i)}, c.lens[i]))
				total += c.lens[i]
			}
			last := qpRQPSN.Add(len(c.ops) - 1)
			if c.ok {
				// (The ACKs are coalesced: one of an earlier packet may
				// come first.)
				p.expect("the ACK of PSN "+last.String(), func(pk *wire.Packet) bool {
					return pk.OpCode() == wire.OpRCAcknowledge && pk.BTH.PSN() == last
				})
				if n := p.count(isAck(wire.AckTypeNAK, wire.NAKInvalidRequest)); n != 0 || qp.State() != StateRTS {
					t.Fatalf("%d NAKs, QP %v; want none and RTS", n, qp.State())
				}
				if got := received(t, qp); len(got) != 1 || len(got[0]) != total {
					t.Fatalf("received %d messages (%v), want one of %d bytes", len(got), lens(got), total)
				}
				return
			}
			nak := p.expect("an invalid request NAK", isAck(wire.AckTypeNAK, wire.NAKInvalidRequest))
			if nak.BTH.PSN() != last || qp.State() != StateErr || drops(qp, fabric.DropMalformed)-mal != 1 {
				t.Fatalf("NAK of PSN %v, QP %v, %d malformed drops; want PSN %v, ERR, 1", nak.BTH.PSN(), qp.State(),
					drops(qp, fabric.DropMalformed)-mal, last)
			}
		})
	}
}

func lens(ms []string) []int {
	out := make([]int, len(ms))
	for i, m := range ms {
		out[i] = len(m)
	}
	return out
}

// TestWriteSizeBounds: a WRITE's packets add up to exactly its DMA
// length.
func TestWriteSizeBounds(t *testing.T) {
	const mtu = 256
	F, M, L, O := wire.OpRCWriteFirst, wire.OpRCWriteMiddle, wire.OpRCWriteLast, wire.OpRCWriteOnly
	for _, c := range []struct {
		name string
		dlen int
		ops  []wire.OpCode
		lens []int
		ok   bool
	}{
		{"ONLY of its length", 10, []wire.OpCode{O}, []int{10}, true},
		{"ONLY one short", 10, []wire.OpCode{O}, []int{9}, false},
		{"ONLY one long", 10, []wire.OpCode{O}, []int{11}, false},
		{"ONLY of no length", 0, []wire.OpCode{O}, []int{0}, true},
		{"three packets", 600, []wire.OpCode{F, M, L}, []int{mtu, mtu, 88}, true},
		{"LAST one short", 600, []wire.OpCode{F, M, L}, []int{mtu, mtu, 87}, false},
		{"LAST one long", 600, []wire.OpCode{F, M, L}, []int{mtu, mtu, 89}, false},
		{"MIDDLE past the length", 300, []wire.OpCode{F, M}, []int{mtu, mtu}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPeer(t)
			qp, pd := p.rcQP(QPConfig{}, QPAttr{PathMTU: mtu})
			r, _ := pd.RegMR(make([]byte, 1024), fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
			for i, op := range c.ops {
				var f wire.Fields
				if i == 0 {
					f.RETH = wire.RETHFields{VA: r.Addr(), RKey: uint32(r.RemoteKey()), DMALength: uint32(c.dlen)}
				}
				p.request(qp, op, qpRQPSN.Add(i), f, bytes.Repeat([]byte{1}, c.lens[i]))
			}
			if c.ok {
				ack := p.expect("the ACK", isOp(wire.OpRCAcknowledge))
				if !ack.AETH.Syndrome().IsACK() || qp.State() != StateRTS {
					t.Fatalf("answered %v, QP %v; want an ACK", ack.AETH.Syndrome(), qp.State())
				}
				return
			}
			p.expect("an invalid request NAK", isAck(wire.AckTypeNAK, wire.NAKInvalidRequest))
			if qp.State() != StateErr {
				t.Fatalf("QP %v, want ERR", qp.State())
			}
		})
	}
}

// TestUDInputRules: a UD QP takes datagrams with its Q_Key of at most the
// MTU and MaxMsgSize; others are dropped and counted, and so is an RC
// opcode.
func TestUDInputRules(t *testing.T) {
	const mtu, qkey = 512, 0x1234
	p := newPeer(t)
	pd := p.e.AllocPD()
	ud, err := pd.CreateQP(QPConfig{Type: UD, MaxMsgSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer ud.Destroy()
	if err := ud.Connect(&QPAttr{PathMTU: mtu, Dest: p.addr, DestQPN: peerQPN, QKey: qkey}); err != nil {
		t.Fatal(err)
	}
	dgram := func(key uint32, n int) {
		p.inject(&wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: ud.QPN()},
			QKey: key, SrcQP: peerQPN}, bytes.Repeat([]byte{'u'}, n))
	}
	dgram(qkey^1, 8)
	dgram(qkey<<1, 8)
	if d := drops(ud, fabric.DropAccess); d != 2 {
		t.Errorf("two datagrams with the wrong Q_Key: %d access drops, want 2", d)
	}
	dgram(qkey, 300) // MaxMsgSize
	dgram(qkey, 301)
	dgram(qkey, 0)
	if d := drops(ud, fabric.DropMalformed); d != 1 {
		t.Errorf("a datagram of MaxMsgSize+1: %d malformed drops, want 1", d)
	}
	p.inject(&wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCSendOnly, PKey: 0xffff, DestQP: ud.QPN()}}, []byte("rc"))
	if d := drops(ud, fabric.DropMalformed); d != 2 {
		t.Errorf("an RC SEND to a UD QP: %d malformed drops, want 2", d)
	}
	if got := received(t, ud); len(got) != 2 || len(got[0]) != 300 || len(got[1]) != 0 {
		t.Fatalf("received %v bytes, want [300 0]", lens(got))
	}
	if ud.Stats().RxPackets != 5 {
		t.Errorf("%d datagrams counted received, want 5", ud.Stats().RxPackets)
	}

	// The MTU bounds a datagram below MaxMsgSize.
	big, err := pd.CreateQP(QPConfig{Type: UD, MaxMsgSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Destroy()
	if err := big.Connect(&QPAttr{PathMTU: mtu, Dest: p.addr, DestQPN: peerQPN, QKey: qkey}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{mtu, mtu + 1} {
		p.inject(&wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnlyWithImmediate, PKey: 0xffff, DestQP: big.QPN()},
			QKey: qkey, SrcQP: peerQPN, Imm: 9}, make([]byte, n))
	}
	if got := received(t, big); len(got) != 1 || len(got[0]) != mtu || drops(big, fabric.DropMalformed) != 1 {
		t.Fatalf("datagrams of MTU and MTU+1: received %v bytes, %d malformed; want [%d] and 1", lens(got), drops(big, fabric.DropMalformed), mtu)
	}
}

// TestInputStates: a QP takes packets only in RTR and RTS.
func TestInputStates(t *testing.T) {
	p := newPeer(t)
	pd := p.e.AllocPD()
	qp, err := pd.CreateQP(QPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	send := func() {
		p.request(qp, wire.OpRCSendOnly, qpRQPSN, wire.Fields{}, []byte("early"))
	}
	send() // RESET
	if err := qp.Modify(StateInit, nil); err != nil {
		t.Fatal(err)
	}
	send() // INIT
	if d := drops(qp, fabric.DropOther); d != 2 {
		t.Fatalf("requests in RESET and INIT: %d drops, want 2", d)
	}
	if err := qp.Modify(StateRTR, &QPAttr{PathMTU: 256, Dest: p.addr, DestQPN: peerQPN, RQPSN: qpRQPSN}); err != nil {
		t.Fatal(err)
	}
	send() // RTR: taken
	if got := received(t, qp); len(got) != 1 || got[0] != "early" {
		t.Fatalf("received %q in RTR, want \"early\"", got)
	}
	// An acknowledgement in RTR is not a response to anything.
	p.ack(qp, qpSQPSN, wire.ACKSyndrome(wire.CreditsInvalid))
	if qp.State() != StateRTR {
		t.Fatalf("QP %v after an ACK in RTR", qp.State())
	}
}

// TestICRCChecked: a packet with a bad ICRC is dropped and counted, unless
// the engine is told not to check (NoICRC).
func TestICRCChecked(t *testing.T) {
	for _, noICRC := range []bool{false, true} {
		l := newCapLink(netip.AddrPortFrom(engineAddr, link.Port))
		e, err := NewEngine(EngineConfig{Link: l, NoICRC: noICRC})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if e.QPNBlock() != 0 {
			t.Errorf("an engine on a link of its own has QPN block %d", e.QPNBlock())
		}
		p := &peer{t: t, e: e, link: l, addr: peerAddr}
		qp, _ := p.rcQP(QPConfig{}, QPAttr{})
		b := make([]byte, wire.PacketLen(wire.OpRCSendOnly, 4))
		f := wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCSendOnly, PKey: 0xffff, DestQP: qp.QPN(), PSN: qpRQPSN}}
		n, _ := wire.Build(b, &f, []byte("icrc"))
		e.sealICRCFrom(b[:n], p.addr, 0xc001)
		b[n-1] ^= 0xff
		func() {
			e.pollMu.Lock()
			defer e.pollMu.Unlock() // a panic must not leave it to Engine.Close
			e.input(&link.Packet{Buf: b, N: n, Addr: netip.AddrPortFrom(p.addr, 55410), SrcPort: 0xc001})
		}()
		got := received(t, qp)
		bad := e.stats.Drops[fabric.DropChecksum].Load()
		if noICRC && (len(got) != 1 || bad != 0) || !noICRC && (len(got) != 0 || bad != 1) {
			t.Errorf("NoICRC %v: a bad ICRC: received %q, %d checksum drops", noICRC, got, bad)
		}
	}
}
