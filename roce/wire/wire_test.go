package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

func TestOpCodeTable(t *testing.T) {
	type row struct {
		op      OpCode
		name    string
		hdrLen  int
		ext     ExtHeaders
		payload bool
		req     bool
		first   bool
		last    bool
	}
	rows := []row{
		{OpRCSendFirst, "RC_SEND_FIRST", 12, ExtHeaders{}, true, true, true, false},
		{OpRCSendMiddle, "RC_SEND_MIDDLE", 12, ExtHeaders{}, true, true, false, false},
		{OpRCSendLast, "RC_SEND_LAST", 12, ExtHeaders{}, true, true, false, true},
		{OpRCSendLastWithImmediate, "RC_SEND_LAST_WITH_IMMEDIATE", 16, ExtHeaders{ExtImmDt}, true, true, false, true},
		{OpRCSendOnly, "RC_SEND_ONLY", 12, ExtHeaders{}, true, true, true, true},
		{OpRCSendOnlyWithImmediate, "RC_SEND_ONLY_WITH_IMMEDIATE", 16, ExtHeaders{ExtImmDt}, true, true, true, true},
		{OpRCWriteFirst, "RC_RDMA_WRITE_FIRST", 28, ExtHeaders{ExtRETH}, true, true, true, false},
		{OpRCWriteMiddle, "RC_RDMA_WRITE_MIDDLE", 12, ExtHeaders{}, true, true, false, false},
		{OpRCWriteLast, "RC_RDMA_WRITE_LAST", 12, ExtHeaders{}, true, true, false, true},
		{OpRCWriteLastWithImmediate, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, ExtHeaders{ExtImmDt}, true, true, false, true},
		{OpRCWriteOnly, "RC_RDMA_WRITE_ONLY", 28, ExtHeaders{ExtRETH}, true, true, true, true},
		{OpRCWriteOnlyWithImmediate, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, ExtHeaders{ExtRETH, ExtImmDt}, true, true, true, true},
		{OpRCReadRequest, "RC_RDMA_READ_REQUEST", 28, ExtHeaders{ExtRETH}, false, true, true, true},
		{OpRCReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", 16, ExtHeaders{ExtAETH}, true, false, true, false},
		{OpRCReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", 12, ExtHeaders{}, true, false, false, false},
		{OpRCReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", 16, ExtHeaders{ExtAETH}, true, false, false, true},
		{OpRCReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", 16, ExtHeaders{ExtAETH}, true, false, true, true},
		{OpRCAcknowledge, "RC_ACKNOWLEDGE", 16, ExtHeaders{ExtAETH}, false, false, true, true},
		{OpRCAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", 24, ExtHeaders{ExtAETH, ExtAtomicAckETH}, false, false, true, true},
		{OpRCCompareSwap, "RC_COMPARE_SWAP", 40, ExtHeaders{ExtAtomicETH}, false, true, true, true},
		{OpRCFetchAdd, "RC_FETCH_ADD", 40, ExtHeaders{ExtAtomicETH}, false, true, true, true},
		{OpRCSendLastWithInvalidate, "RC_SEND_LAST_WITH_INVALIDATE", 16, ExtHeaders{ExtIETH}, true, true, false, true},
		{OpRCSendOnlyWithInvalidate, "RC_SEND_ONLY_WITH_INVALIDATE", 16, ExtHeaders{ExtIETH}, true, true, true, true},
		{OpUCSendFirst, "UC_SEND_FIRST", 12, ExtHeaders{}, true, true, true, false},
		{OpUCSendMiddle, "UC_SEND_MIDDLE", 12, ExtHeaders{}, true, true, false, false},
		{OpUCSendLast, "UC_SEND_LAST", 12, ExtHeaders{}, true, true, false, true},
		{OpUCSendLastWithImmediate, "UC_SEND_LAST_WITH_IMMEDIATE", 16, ExtHeaders{ExtImmDt}, true, true, false, true},
		{OpUCSendOnly, "UC_SEND_ONLY", 12, ExtHeaders{}, true, true, true, true},
		{OpUCSendOnlyWithImmediate, "UC_SEND_ONLY_WITH_IMMEDIATE", 16, ExtHeaders{ExtImmDt}, true, true, true, true},
		{OpUCWriteFirst, "UC_RDMA_WRITE_FIRST", 28, ExtHeaders{ExtRETH}, true, true, true, false},
		{OpUCWriteMiddle, "UC_RDMA_WRITE_MIDDLE", 12, ExtHeaders{}, true, true, false, false},
		{OpUCWriteLast, "UC_RDMA_WRITE_LAST", 12, ExtHeaders{}, true, true, false, true},
		{OpUCWriteLastWithImmediate, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, ExtHeaders{ExtImmDt}, true, true, false, true},
		{OpUCWriteOnly, "UC_RDMA_WRITE_ONLY", 28, ExtHeaders{ExtRETH}, true, true, true, true},
		{OpUCWriteOnlyWithImmediate, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, ExtHeaders{ExtRETH, ExtImmDt}, true, true, true, true},
		{OpUDSendOnly, "UD_SEND_ONLY", 20, ExtHeaders{ExtDETH}, true, true, true, true},
		{OpUDSendOnlyWithImmediate, "UD_SEND_ONLY_WITH_IMMEDIATE", 24, ExtHeaders{ExtDETH, ExtImmDt}, true, true, true, true},
		{OpCNP, "CNP", 28, ExtHeaders{}, false, false, true, true},
	}
	seen := map[OpCode]bool{}
	for _, r := range rows {
		seen[r.op] = true
		op := r.op
		if !op.Valid() || op.String() != r.name || op.HeaderLen() != r.hdrLen || op.ExtHeaders() != r.ext ||
			op.HasPayload() != r.payload || op.IsRequest() != r.req || op.IsFirst() != r.first || op.IsLast() != r.last {
			t.Errorf("%#x: valid %v name %q hdr %d ext %v payload %v req %v first %v last %v",
				uint8(op), op.Valid(), op.String(), op.HeaderLen(), op.ExtHeaders(), op.HasPayload(),
				op.IsRequest(), op.IsFirst(), op.IsLast())
		}
		if op != OpCNP && op.IsRequest() == op.IsResponse() {
			t.Errorf("%v: request %v response %v", op, op.IsRequest(), op.IsResponse())
		}
		// Offsets follow the order of the list.
		off := BTHSize
		for _, e := range r.ext {
			if e == ExtNone {
				break
			}
			if got := op.ExtOffset(e); got != off {
				t.Errorf("%v: %v at %d, want %d", op, e, got, off)
			}
			off += e.Size()
		}
		for e := ExtRETH; e < numExt; e++ {
			in := e == r.ext[0] || e == r.ext[1]
			if (op.ExtOffset(e) >= 0) != in {
				t.Errorf("%v: ExtOffset(%v) = %d", op, e, op.ExtOffset(e))
			}
		}
		if op.ExtOffset(ExtNone) != -1 || op.ExtOffset(numExt) != -1 {
			t.Errorf("%v: ExtOffset of none", op)
		}
	}
	for i := range 256 {
		op := OpCode(i)
		if seen[op] {
			continue
		}
		if op.Valid() || op.HeaderLen() != 0 || op.ExtHeaders().Len() != 0 || op.HasPayload() || op.IsFirst() {
			t.Errorf("%#x should be unsupported", i)
		}
		if op.String() == "" {
			t.Errorf("%#x: empty name", i)
		}
	}
	if OpRCSendOnly.Transport() != TransportRC || OpUCSendOnly.Transport() != TransportUC ||
		OpUDSendOnly.Transport() != TransportUD || OpCNP.Transport() != TransportCNP {
		t.Error("Transport")
	}
	if OpCode(0x15).String() != "OpCode(0x15)" || Transport(0xe0).String() != "Transport(0xe0)" ||
		TransportRD.String() != "RD" || TransportXRC.String() != "XRC" {
		t.Error("String of unsupported values")
	}
	if ExtAtomicETH.String() != "AtomicETH" || ExtHeader(99).String() != "ExtHeader(99)" || ExtHeader(99).Size() != 0 {
		t.Error("ExtHeader String/Size")
	}
}

func TestBTH(t *testing.T) {
	b := make(BTH, BTHSize)
	if !b.IsValid() || BTH(b[:BTHSize-1]).IsValid() {
		t.Fatal("IsValid")
	}
	f := BTHFields{
		OpCode: OpRCWriteOnlyWithImmediate, SolicitedEvent: true, MigReq: true, PadCount: 3, TVer: 0,
		PKey: 0x8001, FECN: true, BECN: true, DestQP: 0xabcdef, AckReq: true, PSN: 0xfedcba,
	}
	b.Encode(&f)
	if want := unhex(t, "0b f0 8001 c0 abcdef 80 fedcba"); !bytes.Equal(b, want) {
		t.Fatalf("Encode %x, want %x", []byte(b), want)
	}
	if got := b.Fields(); got != f {
		t.Fatalf("Fields %+v", got)
	}
	// Each setter changes only its field.
	set := []func(){
		func() { b.SetOpCode(OpUDSendOnly); f.OpCode = OpUDSendOnly },
		func() { b.SetSolicitedEvent(false); f.SolicitedEvent = false },
		func() { b.SetMigReq(false); f.MigReq = false },
		func() { b.SetPadCount(1); f.PadCount = 1 },
		func() { b.SetTVer(0xf); f.TVer = 0xf },
		func() { b.SetPKey(DefaultPKey); f.PKey = DefaultPKey },
		func() { b.SetFECN(false); f.FECN = false },
		func() { b.SetBECN(false); f.BECN = false },
		func() { b.SetDestQP(0x1000001); f.DestQP = 1 },
		func() { b.SetAckReq(false); f.AckReq = false },
		func() { b.SetPSN(0x1ffffff); f.PSN = PSNMask },
	}
	for i, s := range set {
		s()
		if got := b.Fields(); got != f {
			t.Fatalf("setter %d: %+v, want %+v", i, got, f)
		}
	}
	// Reserved bits are kept by setters and cleared by Encode.
	b[bthResv8a] |= 0x3f
	b[bthAPSN] |= 0x7f
	b.SetBECN(true)
	b.SetAckReq(true)
	b.SetDestQP(7)
	b.SetPSN(9)
	if b[bthResv8a] != 0x7f || b[bthAPSN] != 0xff {
		t.Fatalf("setters clobbered reserved bits: %x", []byte(b))
	}
	f = b.Fields()
	b.Encode(&f)
	if b[bthResv8a] != 0x40 || b[bthAPSN] != 0x80 {
		t.Fatalf("Encode kept reserved bits: %x", []byte(b))
	}
}

func TestExtHeaders(t *testing.T) {
	reth := make(RETH, RETHSize)
	reth.Encode(&RETHFields{VA: 0x0102030405060708, RKey: 0x090a0b0c, DMALength: 0x0d0e0f10})
	if want := unhex(t, "0102030405060708 090a0b0c 0d0e0f10"); !bytes.Equal(reth, want) {
		t.Fatalf("RETH %x", []byte(reth))
	}
	if reth.VA() != 0x0102030405060708 || reth.RKey() != 0x090a0b0c || reth.DMALength() != 0x0d0e0f10 || !reth.IsValid() {
		t.Fatal("RETH getters")
	}

	aeth := make(AETH, AETHSize)
	aeth.Encode(NAKSyndrome(NAKRemoteAccessError), 0x123456)
	if want := unhex(t, "62 123456"); !bytes.Equal(aeth, want) {
		t.Fatalf("AETH %x", []byte(aeth))
	}
	aeth.SetMSN(0xabcdef01)
	aeth.SetSyndrome(ACKSyndrome(CreditsInvalid))
	if aeth.MSN() != 0xcdef01 || aeth.Syndrome() != 0x1f || !aeth.IsValid() {
		t.Fatalf("AETH %x", []byte(aeth))
	}

	imm := make(ImmDt, ImmDtSize)
	imm.SetImm(0xdeadbeef)
	if imm.Imm() != 0xdeadbeef || imm[0] != 0xde || !imm.IsValid() {
		t.Fatal("ImmDt")
	}
	ieth := make(IETH, IETHSize)
	ieth.SetRKey(0x11223344)
	if ieth.RKey() != 0x11223344 || ieth[0] != 0x11 || !ieth.IsValid() {
		t.Fatal("IETH")
	}

	deth := DETH(bytes.Repeat([]byte{0xff}, DETHSize))
	deth.Encode(0x80010000, 0x1abcdef)
	if want := unhex(t, "80010000 00 abcdef"); !bytes.Equal(deth, want) {
		t.Fatalf("DETH %x", []byte(deth))
	}
	if deth.QKey() != 0x80010000 || deth.SrcQP() != 0xabcdef || !deth.IsValid() {
		t.Fatal("DETH getters")
	}
	deth.SetQKey(1)
	deth.SetSrcQP(2)
	if deth.QKey() != 1 || deth.SrcQP() != 2 {
		t.Fatal("DETH setters")
	}

	at := make(AtomicETH, AtomicETHSize)
	at.Encode(&AtomicETHFields{VA: 0x1000, RKey: 0x2000, SwapAdd: 0x3000000000000003, Compare: 0x4000000000000004})
	if want := unhex(t, "0000000000001000 00002000 3000000000000003 4000000000000004"); !bytes.Equal(at, want) {
		t.Fatalf("AtomicETH %x", []byte(at))
	}
	if at.VA() != 0x1000 || at.RKey() != 0x2000 || at.SwapAdd() != 0x3000000000000003 || at.Compare() != 0x4000000000000004 || !at.IsValid() {
		t.Fatal("AtomicETH getters")
	}

	ack := make(AtomicAckETH, AtomicAckETHSize)
	ack.SetOrigData(0x0123456789abcdef)
	if ack.OrigData() != 0x0123456789abcdef || ack[0] != 0x01 || !ack.IsValid() {
		t.Fatal("AtomicAckETH")
	}
	for _, short := range []bool{RETH(nil).IsValid(), AETH(nil).IsValid(), ImmDt(nil).IsValid(), IETH(nil).IsValid(),
		DETH(nil).IsValid(), AtomicETH(nil).IsValid(), AtomicAckETH(nil).IsValid()} {
		if short {
			t.Fatal("IsValid on nil")
		}
	}
}

func TestSyndrome(t *testing.T) {
	cases := []struct {
		s    Syndrome
		typ  AckType
		str  string
		byte uint8
	}{
		{ACKSyndrome(0), AckTypeACK, "ACK(credits=0)", 0x00},
		{ACKSyndrome(CreditsInvalid), AckTypeACK, "ACK(credits=31)", 0x1f},
		{RNRNAKSyndrome(12), AckTypeRNRNAK, "RNR_NAK(640µs)", 0x2c},
		{RNRNAKSyndrome(0), AckTypeRNRNAK, "RNR_NAK(655.36ms)", 0x20},
		{NAKSyndrome(NAKPSNSequenceError), AckTypeNAK, "NAK(PSN_SEQUENCE_ERROR)", 0x60},
		{NAKSyndrome(NAKInvalidRequest), AckTypeNAK, "NAK(INVALID_REQUEST)", 0x61},
		{NAKSyndrome(NAKRemoteAccessError), AckTypeNAK, "NAK(REMOTE_ACCESS_ERROR)", 0x62},
		{NAKSyndrome(NAKRemoteOperationalError), AckTypeNAK, "NAK(REMOTE_OPERATIONAL_ERROR)", 0x63},
		{NAKSyndrome(NAKInvalidRDRequest), AckTypeNAK, "NAK(INVALID_RD_REQUEST)", 0x64},
		{NAKSyndrome(9), AckTypeNAK, "NAK(NAKCode(9))", 0x69},
		{Syndrome(0x45), AckTypeReserved, "Syndrome(0x45)", 0x45},
	}
	for _, c := range cases {
		if uint8(c.s) != c.byte || c.s.Type() != c.typ || c.s.String() != c.str {
			t.Errorf("%#x: type %v string %q", uint8(c.s), c.s.Type(), c.s.String())
		}
	}
	if RNRNAKSyndrome(7).RNRTimer() != 7 || NAKSyndrome(3).NAKCode() != NAKRemoteOperationalError || ACKSyndrome(5).CreditCode() != 5 {
		t.Error("arguments")
	}
	if n, ok := ACKSyndrome(5).Credits(); !ok || n != 6 {
		t.Errorf("credits %d %v", n, ok)
	}
	if n, ok := ACKSyndrome(30).Credits(); !ok || n != 32768 {
		t.Errorf("credits %d %v", n, ok)
	}
	if _, ok := ACKSyndrome(CreditsInvalid).Credits(); ok {
		t.Error("invalid credits")
	}
	for _, c := range []struct{ n, code int }{{-1, 31}, {0, 0}, {4, 4}, {5, 4}, {6, 5}, {100, 13}, {1 << 20, 30}} {
		if got := ACKSyndromeForCredits(c.n); int(got) != c.code {
			t.Errorf("ACKSyndromeForCredits(%d) = %d, want %d", c.n, got, c.code)
		}
	}
	for code := range 31 {
		n, _ := ACKSyndrome(uint8(code)).Credits()
		if got := ACKSyndromeForCredits(n); int(got) != code {
			t.Errorf("credit code %d (%d credits) round-trips to %d", code, n, got)
		}
	}
	if AckTypeReserved.String() != "reserved" || AckTypeRNRNAK.String() != "RNR_NAK" {
		t.Error("AckType String")
	}
}

func TestRNRTimer(t *testing.T) {
	if RNRTimer(0).Duration() != 655360*time.Microsecond || RNRTimer(1).Duration() != 10*time.Microsecond ||
		RNRTimer(25).Duration() != 61440*time.Microsecond || RNRTimer(31).Duration() != 491520*time.Microsecond {
		t.Fatal("Duration")
	}
	prev := time.Duration(0)
	for c := RNRTimer(1); c < 32; c++ {
		d := c.Duration()
		if d <= prev {
			t.Fatalf("code %d: %v after %v", c, d, prev)
		}
		prev = d
		if RNRTimerFor(d) != c || RNRTimerFor(d-1) != c {
			t.Fatalf("RNRTimerFor(%v) = %d, want %d", d, RNRTimerFor(d), c)
		}
	}
	if RNRTimerFor(0) != 1 || RNRTimerFor(time.Second) != 0 || RNRTimerFor(600*time.Millisecond) != 0 {
		t.Fatal("RNRTimerFor bounds")
	}
}

func TestPSN(t *testing.T) {
	const max = PSN(PSNMask)
	cases := []struct {
		p, q PSN
		d    int32
	}{
		{5, 3, 2},
		{3, 5, -2},
		{0, max, 1},
		{max, 0, -1},
		{1 << 23, 0, -(1 << 23)},
		{1<<23 - 1, 0, 1<<23 - 1},
		{0, 1 << 23, -(1 << 23)},
		{7, 7, 0},
	}
	for _, c := range cases {
		if got := c.p.Sub(c.q); got != c.d {
			t.Errorf("%d - %d = %d, want %d", c.p, c.q, got, c.d)
		}
		if c.p.Less(c.q) != (c.d < 0) {
			t.Errorf("%d < %d", c.p, c.q)
		}
		want := 0
		if c.d < 0 {
			want = -1
		} else if c.d > 0 {
			want = 1
		}
		if c.p.Compare(c.q) != want {
			t.Errorf("Compare(%d, %d)", c.p, c.q)
		}
	}
	if max.Next() != 0 || max.Add(2) != 1 || PSN(1).Add(-2) != max || PSN(0).Add(1<<24) != 0 || PSN(10).Add(-3) != 7 {
		t.Error("Add/Next")
	}
	if !max.Valid() || (max + 1).Valid() {
		t.Error("Valid")
	}
	if !PSN(1).InWindow(max, 3) || PSN(2).InWindow(max, 3) || PSN(5).InWindow(5, 0) || !PSN(5).InWindow(5, 1) {
		t.Error("InWindow")
	}
	if PSN(42).String() != "42" {
		t.Error("String")
	}
	// Add and Sub are inverse over the window.
	for _, base := range []PSN{0, 1, max, 1 << 23, 0x123456} {
		for _, n := range []int{0, 1, -1, 1000, -1000, 1<<23 - 1, -(1 << 23)} {
			if got := base.Add(n).Sub(base); int(got) != n {
				t.Errorf("(%d + %d) - %d = %d", base, n, base, got)
			}
		}
	}
}

func TestGID(t *testing.T) {
	g4 := GIDFromAddr(netip.MustParseAddr("10.0.17.1"))
	if !g4.IsIPv4Mapped() || g4.String() != "::ffff:10.0.17.1" || g4.Addr() != netip.MustParseAddr("10.0.17.1") {
		t.Fatalf("IPv4 GID %v %v", g4, g4.Addr())
	}
	if want := unhex(t, "00000000000000000000ffff0a001101"); !bytes.Equal(g4[:], want) {
		t.Fatalf("IPv4 GID bytes %x", g4[:])
	}
	g6, err := ParseGID("fe80:0000:0000:0000:0202:c9ff:fe00:0001")
	if err != nil || g6.IsIPv4Mapped() || g6.String() != "fe80::202:c9ff:fe00:1" || !g6.Addr().Is6() {
		t.Fatalf("IPv6 GID %v %v", g6, err)
	}
	if g, err := ParseGID("::ffff:192.168.0.7"); err != nil || g.Addr() != netip.MustParseAddr("192.168.0.7") {
		t.Fatalf("mapped GID %v %v", g, err)
	}
	if _, err := ParseGID("fe80::1%eth0"); err == nil {
		t.Fatal("zone accepted")
	}
	if _, err := ParseGID("nonsense"); err == nil {
		t.Fatal("nonsense accepted")
	}
	if !GIDFromAddr(netip.Addr{}).IsZero() || g4.IsZero() {
		t.Fatal("IsZero")
	}
	txt, _ := g6.MarshalText()
	var back GID
	if err := back.UnmarshalText(txt); err != nil || back != g6 {
		t.Fatalf("text round trip %v %v", back, err)
	}
	if err := back.UnmarshalText([]byte("x")); err == nil {
		t.Fatal("UnmarshalText accepted garbage")
	}
}

func TestUDPSrcPort(t *testing.T) {
	cases := []struct {
		fl   uint32
		port uint16
	}{
		{0, 0xc000}, {0x1face, 0xfac9}, {0xfffff, 0xffc0}, {0x3fff, 0xffff}, {0x4000, 0xc001},
	}
	for _, c := range cases {
		if got := FlowLabelToUDPSrcPort(c.fl); got != c.port {
			t.Errorf("FlowLabelToUDPSrcPort(%#x) = %#x, want %#x", c.fl, got, c.port)
		}
	}
	fls := []struct{ l, r, fl uint32 }{
		{0x11, 0x22, 0x242}, {0xabcdef, 0x123456, 0xac3e3}, {0xffffff, 0xffffff, 0xfff1e},
	}
	for _, c := range fls {
		if got := CalcFlowLabel(c.l, c.r); got != c.fl || CalcFlowLabel(c.r, c.l) != c.fl {
			t.Errorf("CalcFlowLabel(%#x, %#x) = %#x, want %#x", c.l, c.r, got, c.fl)
		}
	}
	if UDPSrcPort(0, 0xabcdef, 0x123456) != 0xc3c8 || UDPSrcPort(0x1face, 1, 2) != 0xfac9 {
		t.Error("UDPSrcPort")
	}
	for fl := uint32(0); fl <= FlowLabelMask; fl += 0x1357 {
		if p := FlowLabelToUDPSrcPort(fl); p < UDPSrcPortMin {
			t.Fatalf("port %#x below range", p)
		}
	}
}

func TestParseErrors(t *testing.T) {
	good := func(op OpCode, payload int) []byte {
		b := make([]byte, PacketLen(op, payload))
		f := Fields{BTH: BTHFields{OpCode: op, PKey: DefaultPKey}}
		if _, err := Build(b, &f, make([]byte, payload)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name   string
		b      []byte
		reason Reason
	}{
		{"empty", nil, ReasonShort},
		{"short", make([]byte, 12), ReasonShort},
		{"unaligned", append(good(OpRCSendOnly, 4), 0), ReasonUnaligned},
		{"rd opcode", func() []byte { b := good(OpRCSendOnly, 0); b[0] = 0x44; return b }(), ReasonOpCode},
		{"reserved opcode", func() []byte { b := good(OpRCSendOnly, 0); b[0] = 0x15; return b }(), ReasonOpCode},
		{"tver", func() []byte { b := good(OpRCSendOnly, 0); BTH(b).SetTVer(1); return b }(), ReasonTVer},
		{"truncated reth", good(OpRCWriteOnly, 0)[:24], ReasonHeaders},
		{"truncated atomic", good(OpRCCompareSwap, 0)[:40], ReasonHeaders},
		{"truncated cnp", good(OpCNP, 0)[:28], ReasonHeaders},
		{"ack with payload", append(good(OpRCAcknowledge, 0), 0, 0, 0, 0), ReasonPayload},
		{"ack with pad", func() []byte { b := good(OpRCAcknowledge, 0); BTH(b).SetPadCount(1); return b }(), ReasonPad},
		{"pad beyond payload", func() []byte { b := good(OpRCSendOnly, 0); BTH(b).SetPadCount(3); return b }(), ReasonPad},
	}
	for _, c := range cases {
		_, err := Parse(c.b)
		var pe *fabric.MalformedError
		if !errors.Is(err, fabric.ErrMalformed) || !errors.As(err, &pe) || Reason(pe.Code) != c.reason {
			t.Errorf("%s: %v, want reason %v", c.name, err, c.reason)
		}
	}
	for r := Reason(0); r <= numReasons; r++ {
		if r.String() == "" {
			t.Errorf("reason %d has no text", r)
		}
	}
	if malformed(ReasonICRC).Error() != "malformed roce/wire packet: ICRC mismatch" {
		t.Error("Error text")
	}
	// Short IP headers.
	for _, b := range [][]byte{nil, {0x45}, {0x40, 0, 0, 0}, {0x50, 0, 0, 0}, make([]byte, 40)} {
		if _, err := ICRC(b); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("ICRC(% x): %v", b, err)
		}
		if err := VerifyICRC(b); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("VerifyICRC(% x): %v", b, err)
		}
		if err := PutICRC(b); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("PutICRC(% x): %v", b, err)
		}
	}
}

// TestBuildParse builds a packet of every opcode and payload length 0-9
// and parses it back.
func TestBuildParse(t *testing.T) {
	buf := make([]byte, 128)
	payload := []byte("0123456789")
	for i := range 256 {
		op := OpCode(i)
		if !op.Valid() {
			f := Fields{BTH: BTHFields{OpCode: op}}
			if _, err := Build(buf, &f, nil); !errors.Is(err, fabric.ErrInvalid) {
				t.Errorf("%v: %v", op, err)
			}
			if _, err := BuildHeaders(buf, &f, 0); !errors.Is(err, fabric.ErrInvalid) {
				t.Errorf("%v: %v", op, err)
			}
			continue
		}
		for n := range len(payload) {
			f := Fields{
				BTH:        BTHFields{OpCode: op, SolicitedEvent: true, PKey: 0x7fff, DestQP: 0x123456, AckReq: true, PSN: 0xabcdef, BECN: op == OpCNP, PadCount: 3},
				RETH:       RETHFields{VA: 0x1122334455667788, RKey: 0x99aabbcc, DMALength: 4096},
				Syndrome:   NAKSyndrome(NAKRemoteAccessError),
				MSN:        0x010203,
				Imm:        0xcafef00d,
				InvRKey:    0x0badf00d,
				QKey:       0x80010000,
				SrcQP:      1,
				Atomic:     AtomicETHFields{VA: 8, RKey: 9, SwapAdd: 10, Compare: 11},
				AtomicOrig: 12,
			}
			for j := range buf {
				buf[j] = 0xee
			}
			k, err := Build(buf, &f, payload[:n])
			if !op.HasPayload() {
				if n > 0 {
					if !errors.Is(err, fabric.ErrInvalid) {
						t.Fatalf("%v with payload: %v", op, err)
					}
					continue
				}
			}
			if err != nil {
				t.Fatalf("%v/%d: %v", op, n, err)
			}
			if k != PacketLen(op, n) || k%4 != 0 {
				t.Fatalf("%v/%d: length %d", op, n, k)
			}
			if _, err := Build(buf[:k-1], &f, payload[:n]); err != ErrShortBuffer {
				t.Fatalf("%v/%d: short buffer: %v", op, n, err)
			}
			if _, err := BuildHeaders(buf[:op.HeaderLen()-1], &f, n); err != ErrShortBuffer {
				t.Fatalf("%v/%d: short header buffer: %v", op, n, err)
			}
			p, err := Parse(buf[:k])
			if err != nil {
				t.Fatalf("%v/%d: %v", op, n, err)
			}
			want := f.BTH
			want.PadCount = PadLen(n)
			if got := p.BTH.Fields(); got != want {
				t.Fatalf("%v/%d: BTH %+v", op, n, got)
			}
			if !bytes.Equal(p.Payload, payload[:n]) || p.ICRC != 0 {
				t.Fatalf("%v/%d: payload %q icrc %#x", op, n, p.Payload, p.ICRC)
			}
			for j := op.HeaderLen() + n; j < k; j++ {
				if buf[j] != 0 {
					t.Fatalf("%v/%d: pad or ICRC byte %d = %#x", op, n, j, buf[j])
				}
			}
			if op == OpCNP && !bytes.Equal(buf[BTHSize:op.HeaderLen()], make([]byte, cnpReservedSize)) {
				t.Fatalf("CNP reserved bytes %x", buf[BTHSize:op.HeaderLen()])
			}
			checkExt(t, op, &p, &f)
		}
	}
}

// checkExt checks that a parsed packet has exactly the extended headers
// of its opcode, holding the values of f.
func checkExt(t *testing.T, op OpCode, p *Packet, f *Fields) {
	t.Helper()
	has := func(e ExtHeader) bool { return op.ExtOffset(e) >= 0 }
	if (p.RETH != nil) != has(ExtRETH) || (p.AETH != nil) != has(ExtAETH) || (p.ImmDt != nil) != has(ExtImmDt) ||
		(p.IETH != nil) != has(ExtIETH) || (p.DETH != nil) != has(ExtDETH) || (p.AtomicETH != nil) != has(ExtAtomicETH) ||
		(p.AtomicAckETH != nil) != has(ExtAtomicAckETH) {
		t.Fatalf("%v: wrong set of extended headers", op)
	}
	if p.RETH != nil && (len(p.RETH) != RETHSize || p.RETH.VA() != f.RETH.VA || p.RETH.RKey() != f.RETH.RKey || p.RETH.DMALength() != f.RETH.DMALength) {
		t.Fatalf("%v: RETH", op)
	}
	if p.AETH != nil && (len(p.AETH) != AETHSize || p.AETH.Syndrome() != f.Syndrome || p.AETH.MSN() != f.MSN) {
		t.Fatalf("%v: AETH", op)
	}
	if p.ImmDt != nil && (len(p.ImmDt) != ImmDtSize || p.ImmDt.Imm() != f.Imm) {
		t.Fatalf("%v: ImmDt", op)
	}
	if p.IETH != nil && (len(p.IETH) != IETHSize || p.IETH.RKey() != f.InvRKey) {
		t.Fatalf("%v: IETH", op)
	}
	if p.DETH != nil && (len(p.DETH) != DETHSize || p.DETH.QKey() != f.QKey || p.DETH.SrcQP() != f.SrcQP) {
		t.Fatalf("%v: DETH", op)
	}
	if p.AtomicETH != nil && (len(p.AtomicETH) != AtomicETHSize || p.AtomicETH.VA() != f.Atomic.VA || p.AtomicETH.RKey() != f.Atomic.RKey ||
		p.AtomicETH.SwapAdd() != f.Atomic.SwapAdd || p.AtomicETH.Compare() != f.Atomic.Compare) {
		t.Fatalf("%v: AtomicETH", op)
	}
	if p.AtomicAckETH != nil && (len(p.AtomicAckETH) != AtomicAckETHSize || p.AtomicAckETH.OrigData() != f.AtomicOrig) {
		t.Fatalf("%v: AtomicAckETH", op)
	}
}

func TestShortBufferIsIO(t *testing.T) {
	if ErrShortBuffer != io.ErrShortBuffer {
		t.Fatal("ErrShortBuffer")
	}
}

func TestZeroAllocs(t *testing.T) {
	cnp := unhex(t, vectors[0].frame)[ethHeader:]
	udp := cnp[20+8:]
	buf := make([]byte, 256)
	payload := make([]byte, 100)
	f := Fields{BTH: BTHFields{OpCode: OpRCWriteOnlyWithImmediate}}
	var sink uint32
	allocs := testing.AllocsPerRun(100, func() {
		p, err := Parse(udp)
		if err != nil {
			t.Fatal(err)
		}
		sink += p.ICRC
		if _, err := Parse(udp[:7]); err == nil {
			t.Fatal("short packet parsed")
		}
		c, _ := ICRC(cnp)
		sink += c
		if VerifyICRC(cnp) != nil {
			t.Fatal("verify")
		}
		if _, err := Build(buf, &f, payload); err != nil {
			t.Fatal(err)
		}
		c, _ = ICRCParts(cnp[:48], cnp[48:len(cnp)-4])
		sink += c
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run", allocs)
	}
	_ = sink
}

func TestSplitIP(t *testing.T) {
	for _, v := range vectors {
		if v.v1 {
			continue
		}
		pkt := unhex(t, v.frame)[ethHeader:]
		padded := append(append([]byte(nil), pkt...), 0, 0, 0, 0, 0, 0)
		ip, udp, err := SplitIP(padded)
		if err != nil || !bytes.Equal(ip, pkt) {
			t.Fatalf("%s: %v", v.name, err)
		}
		hl, _, _ := ipHeaderLen(pkt)
		if !bytes.Equal(udp, pkt[hl+udpHeader:]) {
			t.Fatalf("%s: UDP payload", v.name)
		}
		if VerifyICRC(ip) != nil {
			t.Fatalf("%s: ICRC", v.name)
		}
		if _, err := Parse(udp); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
	}
	v4 := unhex(t, vectors[0].frame)[ethHeader:]
	v6 := unhex(t, vectors[2].frame)[ethHeader:]
	mod := func(b []byte, f func(b []byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	cases := []struct {
		name   string
		b      []byte
		reason Reason
	}{
		{"empty", nil, ReasonIPHeader},
		{"version 5", mod(v4, func(b []byte) { b[0] = 0x55 }), ReasonIPHeader},
		{"ihl 4", mod(v4, func(b []byte) { b[0] = 0x44 }), ReasonIPHeader},
		{"cut", v4[:40], ReasonIPHeader},
		{"tcp", mod(v4, func(b []byte) { b[9] = 6 }), ReasonIPHeader},
		{"more fragments", mod(v4, func(b []byte) { b[6] |= 0x20 }), ReasonIPHeader},
		{"fragment offset", mod(v4, func(b []byte) { b[7] = 1 }), ReasonIPHeader},
		{"truncated", v4[:len(v4)-1], ReasonIPHeader},
		{"total too small", mod(v4, func(b []byte) { binary.BigEndian.PutUint16(b[2:], 27) }), ReasonIPHeader},
		{"udp length", mod(v4, func(b []byte) { b[25]-- }), ReasonUDPHeader},
		{"ipv6 short", v6[:39], ReasonIPHeader},
		{"ipv6 extension header", mod(v6, func(b []byte) { b[6] = 0 }), ReasonIPHeader},
		{"ipv6 truncated", v6[:len(v6)-4], ReasonIPHeader},
		{"ipv6 udp length", mod(v6, func(b []byte) { b[45]++ }), ReasonUDPHeader},
	}
	for _, c := range cases {
		ip, udp, err := SplitIP(c.b)
		var pe *fabric.MalformedError
		if !errors.As(err, &pe) || Reason(pe.Code) != c.reason || ip != nil || udp != nil {
			t.Errorf("%s: %v, want %v", c.name, err, c.reason)
		}
	}
}

// TestICRCPartsBounds: the headers the ICRC masks must all be in hdr:
// at exactly IP, UDP and BTH the split is accepted and agrees with the
// whole packet's ICRC; one byte short is a ReasonIPHeader error, never a
// panic or a CRC over missing bytes. An IPv4 header length below 20 is
// refused.
func TestICRCPartsBounds(t *testing.T) {
	pkt := benchPacket(t, 100)
	whole, err := ICRC(pkt)
	if err != nil {
		t.Fatal(err)
	}
	body := pkt[:len(pkt)-ICRCSize]
	n := ipv4MinHeader + udpHeader + BTHSize
	for _, cut := range []int{n, n + 1, len(body)} {
		got, err := ICRCParts(body[:cut], body[cut:])
		if err != nil || got != whole {
			t.Errorf("split at %d: %#x, %v; want %#x", cut, got, err, whole)
		}
	}
	for _, cut := range []int{n - 1, ipv4MinHeader, 1, 0} {
		var pe *fabric.MalformedError
		if _, err := ICRCParts(body[:cut], body[cut:]); !errors.As(err, &pe) || Reason(pe.Code) != ReasonIPHeader {
			t.Errorf("split at %d (short of the BTH): %v, want ReasonIPHeader", cut, err)
		}
	}
	short := slices.Clone(body)
	short[0] = 0x44 // IHL 4: 16 bytes
	if _, err := ICRCParts(short, nil); err == nil {
		t.Error("an IPv4 header length of 16 bytes was accepted")
	}
	if _, err := ICRC(pkt[:ICRCSize-1]); err == nil {
		t.Error("ICRC of 3 bytes succeeded")
	}
}

// TestExtSizeBounds: Size of every header kind, and 0 for values past
// the last (never an index out of range).
func TestExtSizeBounds(t *testing.T) {
	for e := ExtHeader(0); e < 255; e++ {
		s := e.Size()
		if (e >= numExt || e == ExtNone) != (s == 0) {
			t.Errorf("ExtHeader(%d).Size() = %d", e, s)
		}
	}
}

// TestBuildHeadersExact: a buffer of exactly the header length takes the
// headers; one byte less is ErrShortBuffer. Build likewise at the packet
// length.
func TestBuildHeadersExact(t *testing.T) {
	f := Fields{BTH: BTHFields{OpCode: OpRCWriteOnly, PKey: DefaultPKey, DestQP: 18, PSN: 1},
		RETH: RETHFields{VA: 0x1000, RKey: 7, DMALength: 8}}
	hl := OpRCWriteOnly.HeaderLen()
	if n, err := BuildHeaders(make([]byte, hl), &f, 8); err != nil || n != hl {
		t.Fatalf("BuildHeaders into %d bytes = %d, %v", hl, n, err)
	}
	if _, err := BuildHeaders(make([]byte, hl-1), &f, 8); !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("BuildHeaders into %d bytes = %v, want ErrShortBuffer", hl-1, err)
	}
	pl := PacketLen(OpRCWriteOnly, 8)
	if n, err := Build(make([]byte, pl), &f, make([]byte, 8)); err != nil || n != pl {
		t.Fatalf("Build into %d bytes = %d, %v", pl, n, err)
	}
	if _, err := Build(make([]byte, pl-1), &f, make([]byte, 8)); !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("Build into %d bytes = %v, want ErrShortBuffer", pl-1, err)
	}
}
