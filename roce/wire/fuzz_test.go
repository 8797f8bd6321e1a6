package wire

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// seedPackets returns the IP packets and the UDP payloads (BTH onwards) of
// the test vectors, and a few built packets.
func seedPackets(tb testing.TB) (ip, udp [][]byte) {
	for _, v := range vectors {
		pkt := unhex(tb, v.frame)[ethHeader:]
		if v.v1 {
			udp = append(udp, pkt[ipv6Header:])
			continue
		}
		ip = append(ip, pkt)
		n, _, _ := ipHeaderLen(pkt)
		udp = append(udp, pkt[n+udpHeader:])
	}
	for _, op := range []OpCode{OpRCWriteOnlyWithImmediate, OpRCAtomicAcknowledge, OpRCCompareSwap, OpUDSendOnlyWithImmediate, OpRCSendOnlyWithInvalidate} {
		b := make([]byte, 64)
		f := Fields{BTH: BTHFields{OpCode: op, PKey: DefaultPKey, PSN: 77}, QKey: 5, Imm: 6}
		var payload []byte
		if op.HasPayload() {
			payload = []byte("abcde")
		}
		n, err := Build(b, &f, payload)
		if err != nil {
			tb.Fatal(err)
		}
		udp = append(udp, b[:n])
	}
	return ip, udp
}

// fieldsOf returns the Fields that Build needs to reproduce p.
func fieldsOf(p *Packet) Fields {
	f := Fields{BTH: p.BTH.Fields()}
	if p.RETH != nil {
		f.RETH = RETHFields{VA: p.RETH.VA(), RKey: p.RETH.RKey(), DMALength: p.RETH.DMALength()}
	}
	if p.AETH != nil {
		f.Syndrome, f.MSN = p.AETH.Syndrome(), p.AETH.MSN()
	}
	if p.ImmDt != nil {
		f.Imm = p.ImmDt.Imm()
	}
	if p.IETH != nil {
		f.InvRKey = p.IETH.RKey()
	}
	if p.DETH != nil {
		f.QKey, f.SrcQP = p.DETH.QKey(), p.DETH.SrcQP()
	}
	if p.AtomicETH != nil {
		f.Atomic = AtomicETHFields{VA: p.AtomicETH.VA(), RKey: p.AtomicETH.RKey(), SwapAdd: p.AtomicETH.SwapAdd(), Compare: p.AtomicETH.Compare()}
	}
	if p.AtomicAckETH != nil {
		f.AtomicOrig = p.AtomicAckETH.OrigData()
	}
	return f
}

// FuzzParse checks that Parse never panics, that what it accepts is
// consistent, and that Build reproduces an accepted packet.
func FuzzParse(f *testing.F) {
	_, udp := seedPackets(f)
	for _, b := range udp {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		var hdr [MaxHeaderLen]byte
		s, serr := ParseShared(b, &hdr)
		if (err == nil) != (serr == nil) || err == nil && (!bytes.Equal(s.BTH, p.BTH) || !bytes.Equal(s.RETH, p.RETH) ||
			!bytes.Equal(s.AETH, p.AETH) || !bytes.Equal(s.ImmDt, p.ImmDt) || !bytes.Equal(s.IETH, p.IETH) ||
			!bytes.Equal(s.DETH, p.DETH) || !bytes.Equal(s.AtomicETH, p.AtomicETH) ||
			!bytes.Equal(s.AtomicAckETH, p.AtomicAckETH) || len(s.Payload) != len(p.Payload) || s.ICRC != p.ICRC) {
			t.Fatalf("ParseShared: %v, Parse: %v, or their packets differ", serr, err)
		}
		if err != nil {
			if p.BTH != nil || p.Payload != nil {
				t.Fatal("failed Parse returned views")
			}
			return
		}
		op := p.OpCode()
		if !op.Valid() || len(b)%4 != 0 || p.BTH.TVer() != 0 {
			t.Fatalf("accepted %v len %d", op, len(b))
		}
		if got := op.HeaderLen() + len(p.Payload) + p.BTH.PadCount() + ICRCSize; got != len(b) {
			t.Fatalf("lengths add up to %d, packet is %d", got, len(b))
		}
		if p.ICRC != binary.LittleEndian.Uint32(b[len(b)-4:]) {
			t.Fatal("ICRC")
		}
		// Build the packet again from its fields.
		fields := fieldsOf(&p)
		buf := make([]byte, len(b)+8)
		n, err := Build(buf, &fields, p.Payload)
		if err != nil || n != len(b) {
			t.Fatalf("Build: %d, %v", n, err)
		}
		q, err := Parse(buf[:n])
		if err != nil {
			t.Fatalf("Parse of rebuilt packet: %v", err)
		}
		if fieldsOf(&q) != fields || !bytes.Equal(q.Payload, p.Payload) {
			t.Fatal("rebuilt packet differs")
		}
		// The extended headers are byte-identical, reserved bytes aside.
		hl := op.HeaderLen()
		want := append([]byte(nil), b[:hl]...)
		want[bthResv8a] &= 0xc0
		want[bthAPSN] &= 0x80
		if off := op.ExtOffset(ExtDETH); off >= 0 {
			want[off+4] = 0
		}
		if op == OpCNP {
			clear(want[BTHSize:])
		}
		if !bytes.Equal(buf[:hl], want) {
			t.Fatalf("headers %x, want %x", buf[:hl], want)
		}
	})
}

// FuzzBTH checks the BTH view: Fields and Encode round-trip, and each
// setter writes back what its getter read.
func FuzzBTH(f *testing.F) {
	_, udp := seedPackets(f)
	for _, b := range udp {
		f.Add(b[:BTHSize])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h := BTH(b)
		if !h.IsValid() {
			return
		}
		h = h[:BTHSize]
		orig := append(BTH(nil), h...)
		fl := h.Fields()
		h.SetOpCode(h.OpCode())
		h.SetSolicitedEvent(h.SolicitedEvent())
		h.SetMigReq(h.MigReq())
		h.SetPadCount(h.PadCount())
		h.SetTVer(h.TVer())
		h.SetPKey(h.PKey())
		h.SetFECN(h.FECN())
		h.SetBECN(h.BECN())
		h.SetDestQP(h.DestQP())
		h.SetAckReq(h.AckReq())
		h.SetPSN(h.PSN())
		if !bytes.Equal(h, orig) {
			t.Fatalf("setters changed %x to %x", []byte(orig), []byte(h))
		}
		out := make(BTH, BTHSize)
		out.Encode(&fl)
		want := append([]byte(nil), orig...)
		want[bthResv8a] &= 0xc0
		want[bthAPSN] &= 0x80
		if !bytes.Equal(out, want) || out.Fields() != fl {
			t.Fatalf("Encode %x, want %x", []byte(out), want)
		}
	})
}

// FuzzExtHeaders checks every extended header view: getters, setters and
// Encode round-trip over arbitrary bytes.
func FuzzExtHeaders(f *testing.F) {
	_, udp := seedPackets(f)
	for _, b := range udp {
		f.Add(b[BTHSize:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		same := func(name string, got, want []byte) {
			t.Helper()
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: %x, want %x", name, got, want)
			}
		}
		if h := RETH(b); h.IsValid() {
			h = h[:RETHSize]
			o := make(RETH, RETHSize)
			o.Encode(&RETHFields{VA: h.VA(), RKey: h.RKey(), DMALength: h.DMALength()})
			same("RETH", o, h)
			o.SetVA(h.VA())
			o.SetRKey(h.RKey())
			o.SetDMALength(h.DMALength())
			same("RETH setters", o, h)
		}
		if h := AETH(b); h.IsValid() {
			h = h[:AETHSize]
			o := make(AETH, AETHSize)
			o.Encode(h.Syndrome(), h.MSN())
			same("AETH", o, h)
			o.SetSyndrome(h.Syndrome())
			o.SetMSN(h.MSN())
			same("AETH setters", o, h)
			s := h.Syndrome()
			_ = s.String()
			var back Syndrome
			switch s.Type() {
			case AckTypeACK:
				back = ACKSyndrome(s.CreditCode())
			case AckTypeRNRNAK:
				back = RNRNAKSyndrome(s.RNRTimer())
			case AckTypeNAK:
				back = NAKSyndrome(s.NAKCode())
			default:
				back = s & 0x7f
			}
			if back != s&0x7f {
				t.Fatalf("syndrome %#x rebuilt as %#x", uint8(s), uint8(back))
			}
		}
		if h := ImmDt(b); h.IsValid() {
			h = h[:ImmDtSize]
			o := make(ImmDt, ImmDtSize)
			o.SetImm(h.Imm())
			same("ImmDt", o, h)
		}
		if h := IETH(b); h.IsValid() {
			h = h[:IETHSize]
			o := make(IETH, IETHSize)
			o.SetRKey(h.RKey())
			same("IETH", o, h)
		}
		if h := DETH(b); h.IsValid() {
			h = h[:DETHSize]
			o := make(DETH, DETHSize)
			o.Encode(h.QKey(), h.SrcQP())
			want := append([]byte(nil), h...)
			want[4] = 0
			same("DETH", o, want)
			o.SetQKey(h.QKey())
			o.SetSrcQP(h.SrcQP())
			same("DETH setters", o, want)
		}
		if h := AtomicETH(b); h.IsValid() {
			h = h[:AtomicETHSize]
			o := make(AtomicETH, AtomicETHSize)
			o.Encode(&AtomicETHFields{VA: h.VA(), RKey: h.RKey(), SwapAdd: h.SwapAdd(), Compare: h.Compare()})
			same("AtomicETH", o, h)
		}
		if h := AtomicAckETH(b); h.IsValid() {
			h = h[:AtomicAckETHSize]
			o := make(AtomicAckETH, AtomicAckETHSize)
			o.SetOrigData(h.OrigData())
			same("AtomicAckETH", o, h)
		}
	})
}

// FuzzICRC checks that the ICRC functions never panic, that PutICRC and
// VerifyICRC agree, and that ICRCParts does not depend on the split.
func FuzzICRC(f *testing.F) {
	ip, _ := seedPackets(f)
	for _, b := range ip {
		f.Add(b, uint16(30))
	}
	f.Fuzz(func(t *testing.T, b []byte, split uint16) {
		crc, err := ICRC(b)
		if err != nil {
			if VerifyICRC(b) == nil || PutICRC(b) == nil {
				t.Fatal("ICRC failed but Verify or Put succeeded")
			}
			return
		}
		body := b[:len(b)-ICRCSize]
		k := int(split) % (len(body) + 1)
		if n, _, _ := ipHeaderLen(b); k < n+udpHeader+BTHSize {
			k = n + udpHeader + BTHSize
		}
		if c, err := ICRCParts(body[:k], body[k:]); err != nil || c != crc {
			t.Fatalf("split at %d: %#x, %v; whole: %#x", k, c, err, crc)
		}
		c := append([]byte(nil), b...)
		if err := PutICRC(c); err != nil {
			t.Fatal(err)
		}
		if err := VerifyICRC(c); err != nil {
			t.Fatal(err)
		}
		if binary.LittleEndian.Uint32(c[len(c)-4:]) != crc {
			t.Fatal("PutICRC stored another value")
		}
	})
}

// FuzzPSN checks that PSN addition and subtraction are inverse and that
// comparison is antisymmetric.
func FuzzPSN(f *testing.F) {
	f.Add(uint32(0), uint32(PSNMask), int32(5))
	f.Add(uint32(1<<23), uint32(0), int32(-(1 << 23)))
	f.Fuzz(func(t *testing.T, a, b uint32, n int32) {
		p, q := PSN(a&PSNMask), PSN(b&PSNMask)
		d := p.Sub(q)
		if d < -(1<<23) || d >= 1<<23 {
			t.Fatalf("%d - %d = %d out of range", p, q, d)
		}
		if q.Add(int(d)) != p {
			t.Fatalf("%d + (%d - %d) != %d", q, p, q, p)
		}
		if d != -(1<<23) && (p.Less(q) == q.Less(p)) && p != q {
			t.Fatalf("Less(%d, %d) not antisymmetric", p, q)
		}
		if p.Compare(q) != -q.Compare(p) && d != -(1<<23) {
			t.Fatalf("Compare(%d, %d)", p, q)
		}
		m := int(n) % (1 << 23)
		if r := p.Add(m); !r.Valid() || r.Sub(p) != int32(m) {
			t.Fatalf("(%d + %d) - %d = %d", p, m, p, r.Sub(p))
		}
	})
}

// FuzzGID checks that ParseGID never panics and that String round-trips.
func FuzzGID(f *testing.F) {
	f.Add("10.0.17.1")
	f.Add("fe80:0000:0000:0000:0202:c9ff:fe00:0001")
	f.Add("::ffff:1.2.3.4")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGID(s)
		if err != nil {
			return
		}
		h, err := ParseGID(g.String())
		if err != nil || h != g {
			t.Fatalf("%q -> %v -> %v, %v", s, g, h, err)
		}
		if GIDFromAddr(g.Addr()) != g {
			t.Fatalf("%v: Addr round trip", g)
		}
	})
}

// FuzzSplitIP checks that SplitIP never panics and returns sub-slices
// that are consistent with each other.
func FuzzSplitIP(f *testing.F) {
	ip, _ := seedPackets(f)
	for _, b := range ip {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ip, udp, err := SplitIP(b)
		if err != nil {
			return
		}
		if len(ip) > len(b) || &ip[0] != &b[0] || len(udp) > len(ip) || (len(udp) > 0 && &udp[len(udp)-1] != &ip[len(ip)-1]) {
			t.Fatal("views inconsistent")
		}
		n, _, _ := ipHeaderLen(ip)
		if len(udp) != len(ip)-n-udpHeader {
			t.Fatalf("UDP payload %d bytes in IP packet of %d", len(udp), len(ip))
		}
		if _, err := Parse(udp); err == nil {
			if _, err := ICRC(ip); err != nil {
				t.Fatalf("parsed packet without ICRC: %v", err)
			}
		}
	})
}
