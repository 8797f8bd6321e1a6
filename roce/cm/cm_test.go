package cm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

func newMAD(attr AttrID, tid uint64) MAD {
	m := MAD(make([]byte, MADSize))
	m.Init(attr, tid)
	return m
}

func TestMADHeader(t *testing.T) {
	m := newMAD(AttrREQ, 0x0000_0001_dead_beef)
	want := []byte{1, 0x07, 2, 0x03, 0, 0, 0, 0, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x10, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(m[:HeaderSize], want) {
		t.Fatalf("header % x, want % x", m[:HeaderSize], want)
	}
	if len(m.Data()) != DataSize || cap(m.Data()) != DataSize {
		t.Fatalf("data len %d cap %d", len(m.Data()), cap(m.Data()))
	}
	// Init zeroes a reused buffer.
	m.Data()[5] = 9
	m.SetAttrMod(7)
	m.Init(AttrRTU, 3)
	if m.Data()[5] != 0 || m.AttrMod() != 0 || m.AttrID() != AttrRTU || m.TID() != 3 {
		t.Fatal("Init did not reset the MAD")
	}
	if _, err := ParseMAD(m); err != nil {
		t.Fatal(err)
	}
}

func TestParseMADRejects(t *testing.T) {
	good := newMAD(AttrREQ, 1)
	REQ(good.Data()).SetPathMTU(MTU1024)
	if _, err := ParseMAD(good); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(m []byte) []byte
		reason Reason
	}{
		{"short", func(m []byte) []byte { return m[:MADSize-1] }, ReasonSize},
		{"long", func(m []byte) []byte { return append(m, 0) }, ReasonSize},
		{"empty", func(m []byte) []byte { return nil }, ReasonSize},
		{"base version", func(m []byte) []byte { m[0] = 2; return m }, ReasonBaseVersion},
		{"class", func(m []byte) []byte { m[1] = 0x01; return m }, ReasonClass},
		{"class version", func(m []byte) []byte { m[2] = 1; return m }, ReasonClassVersion},
		{"method", func(m []byte) []byte { m[3] = 0x83; return m }, ReasonMethod},
		{"attr LAP", func(m []byte) []byte { m[17] = 0x19; return m }, ReasonAttribute},
		{"attr ClassPortInfo", func(m []byte) []byte { m[17] = 0x01; return m }, ReasonAttribute},
		{"attr high", func(m []byte) []byte { m[16] = 0x10; return m }, ReasonAttribute},
		{"REQ MTU 0", func(m []byte) []byte { REQ(m[HeaderSize:]).SetPathMTU(0); return m }, ReasonField},
		{"REQ MTU 6", func(m []byte) []byte { REQ(m[HeaderSize:]).SetPathMTU(6); return m }, ReasonField},
		{"REQ transport 3", func(m []byte) []byte { m[HeaderSize+43] |= 6; return m }, ReasonField},
		{"REJ ARI length", func(m []byte) []byte {
			m[17] = byte(AttrREJ)
			m[HeaderSize+9] = 73 << 1
			return m
		}, ReasonField},
		{"REJ message 3", func(m []byte) []byte {
			m[17] = byte(AttrREJ)
			m[HeaderSize+8] = 0xc0
			return m
		}, ReasonField},
		{"MRA message 3", func(m []byte) []byte {
			m[17] = byte(AttrMRA)
			m[HeaderSize+8] = 0xc0
			return m
		}, ReasonField},
		{"SIDR_REP info length", func(m []byte) []byte {
			m[17] = byte(AttrSIDRRep)
			m[HeaderSize+5] = 73
			return m
		}, ReasonField},
	}
	var drops Drops
	for _, c := range cases {
		b := c.mutate(bytes.Clone(good))
		_, err := ParseMAD(b)
		var pe *fabric.MalformedError
		if !errors.As(err, &pe) || Reason(pe.Code) != c.reason {
			t.Errorf("%s: err %v, want reason %v", c.name, err, c.reason)
			continue
		}
		if !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("%s: %v does not match ErrMalformed", c.name, err)
		}
		if !drops.Add(err) {
			t.Errorf("%s: not counted", c.name)
		}
	}
	if drops.Total() != uint64(len(cases)) || drops.Count(ReasonField) != 7 || drops.Count(ReasonSize) != 3 {
		t.Errorf("drops: total %d, field %d, size %d", drops.Total(), drops.Count(ReasonField), drops.Count(ReasonSize))
	}
	if drops.Add(errors.New("other")) || drops.Add(nil) {
		t.Error("foreign error counted")
	}
	if Reason(200).String() != "unknown reason" || ReasonField.String() == "" {
		t.Error("Reason.String")
	}
}

func TestParseMADAllocs(t *testing.T) {
	good := newMAD(AttrREQ, 1)
	REQ(good.Data()).SetPathMTU(MTU1024)
	bad := bytes.Clone(good)
	bad[1] = 4
	var drops Drops
	n := testing.AllocsPerRun(100, func() {
		if _, err := ParseMAD(good); err != nil {
			t.Fatal(err)
		}
		_, err := ParseMAD(bad)
		drops.Add(err)
	})
	if n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
}

func TestREQFields(t *testing.T) {
	m := newMAD(AttrREQ, 42)
	r := REQ(m.Data())
	if !r.IsValid() || REQ(m.Data()[:DataSize-1]).IsValid() {
		t.Fatal("IsValid")
	}
	src, dst := netip.MustParseAddr("10.77.0.3"), netip.MustParseAddr("10.77.0.2")
	r.SetLocalCommID(0x11223344)
	r.SetServiceID(RDMACMServiceID(PortSpaceTCP, 7174))
	r.SetLocalCAGUID(0x5254_00ff_fe77_0003)
	r.SetLocalQKey(0xabcdef01)
	r.SetLocalQPN(0x000011)
	r.SetResponderResources(128)
	r.SetInitiatorDepth(16)
	r.SetRemoteCMResponseTimeout(20)
	r.SetTransportType(TransportUC)
	r.SetEndToEndFlowControl(true)
	r.SetStartingPSN(0xabcdef)
	r.SetLocalCMResponseTimeout(21)
	r.SetRetryCount(7)
	r.SetPKey(0xffff)
	r.SetPathMTU(MTU1024)
	r.SetRNRRetryCount(6)
	r.SetMaxCMRetries(15)
	r.SetSRQ(true)
	p := r.Primary()
	p.SetLocalLID(0xffff)
	p.SetRemoteLID(0xfffe)
	p.SetLocalGID(src)
	p.SetRemoteGID(dst)
	p.SetFlowLabel(0xfffff)
	p.SetPacketRate(0x3f)
	p.SetFlowLabel(0x12345)
	p.SetTrafficClass(0xb8)
	p.SetHopLimit(64)
	p.SetSL(5)
	p.SetSubnetLocal(true)
	p.SetLocalACKTimeout(18)
	copy(r.PrivateData(), "private")

	get := []struct {
		name      string
		got, want any
	}{
		{"LocalCommID", r.LocalCommID(), uint32(0x11223344)},
		{"ServiceID", r.ServiceID(), ServiceID(0x0000000001061c06)},
		{"LocalCAGUID", r.LocalCAGUID(), uint64(0x525400fffe770003)},
		{"LocalQKey", r.LocalQKey(), uint32(0xabcdef01)},
		{"LocalQPN", r.LocalQPN(), uint32(0x11)},
		{"ResponderResources", r.ResponderResources(), uint8(128)},
		{"InitiatorDepth", r.InitiatorDepth(), uint8(16)},
		{"LocalEECN", r.LocalEECN(), uint32(0)},
		{"RemoteEECN", r.RemoteEECN(), uint32(0)},
		{"RemoteCMResponseTimeout", r.RemoteCMResponseTimeout(), uint8(20)},
		{"TransportType", r.TransportType(), TransportUC},
		{"EndToEndFlowControl", r.EndToEndFlowControl(), true},
		{"StartingPSN", r.StartingPSN(), uint32(0xabcdef)},
		{"LocalCMResponseTimeout", r.LocalCMResponseTimeout(), uint8(21)},
		{"RetryCount", r.RetryCount(), uint8(7)},
		{"PKey", r.PKey(), uint16(0xffff)},
		{"PathMTU", r.PathMTU(), MTU1024},
		{"RDCExists", r.RDCExists(), false},
		{"RNRRetryCount", r.RNRRetryCount(), uint8(6)},
		{"MaxCMRetries", r.MaxCMRetries(), uint8(15)},
		{"SRQ", r.SRQ(), true},
		{"ExtendedTransportType", r.ExtendedTransportType(), uint8(0)},
		{"LocalLID", p.LocalLID(), uint16(0xffff)},
		{"RemoteLID", p.RemoteLID(), uint16(0xfffe)},
		{"LocalGID", p.LocalGID(), netip.MustParseAddr("::ffff:10.77.0.3")},
		{"RemoteGID", p.RemoteGID(), netip.MustParseAddr("::ffff:10.77.0.2")},
		{"FlowLabel", p.FlowLabel(), uint32(0x12345)},
		{"PacketRate", p.PacketRate(), uint8(0x3f)},
		{"TrafficClass", p.TrafficClass(), uint8(0xb8)},
		{"HopLimit", p.HopLimit(), uint8(64)},
		{"SL", p.SL(), uint8(5)},
		{"SubnetLocal", p.SubnetLocal(), true},
		{"LocalACKTimeout", p.LocalACKTimeout(), uint8(18)},
		{"Alternate", r.Alternate().LocalGID(), netip.IPv6Unspecified()},
	}
	for _, g := range get {
		if g.got != g.want {
			t.Errorf("%s = %v, want %v", g.name, g.got, g.want)
		}
	}
	// Bit-level placement (IBA table 106), byte offsets in the MAD.
	wantBytes := map[int]byte{
		24 + 35: 128, 24 + 39: 16, 24 + 43: 20<<3 | 1<<1 | 1, 24 + 47: 21<<3 | 7,
		24 + 50: 3<<4 | 6, 24 + 51: 15<<4 | 8, 24 + 88: 0x12, 24 + 89: 0x34, 24 + 90: 0x50, 24 + 91: 0x3f,
		24 + 94: 5<<4 | 8, 24 + 95: 18 << 3, 24 + 140: 'p',
	}
	for off, v := range wantBytes {
		if m[off] != v {
			t.Errorf("MAD byte %d = %#02x, want %#02x", off, m[off], v)
		}
	}
	if len(r.PrivateData()) != REQPrivateDataSize {
		t.Errorf("private data %d bytes", len(r.PrivateData()))
	}
	if _, err := ParseMAD(m); err != nil {
		t.Fatal(err)
	}
	// Clearing flags leaves their neighbours alone.
	r.SetEndToEndFlowControl(false)
	r.SetSRQ(false)
	p.SetSubnetLocal(false)
	if r.TransportType() != TransportUC || r.RemoteCMResponseTimeout() != 20 || r.MaxCMRetries() != 15 || p.SL() != 5 {
		t.Error("clearing a flag changed a neighbouring field")
	}
}

func TestREPAndOthers(t *testing.T) {
	m := newMAD(AttrREP, 1)
	r := REP(m.Data())
	r.SetLocalCommID(1)
	r.SetRemoteCommID(2)
	r.SetLocalQKey(3)
	r.SetLocalQPN(0xfffffe)
	r.SetStartingPSN(0x123456)
	r.SetResponderResources(4)
	r.SetInitiatorDepth(5)
	r.SetTargetACKDelay(31)
	r.SetFailoverAccepted(3)
	r.SetEndToEndFlowControl(true)
	r.SetRNRRetryCount(7)
	r.SetSRQ(true)
	r.SetLocalCAGUID(6)
	if r.LocalCommID() != 1 || r.RemoteCommID() != 2 || r.LocalQKey() != 3 || r.LocalQPN() != 0xfffffe ||
		r.StartingPSN() != 0x123456 || r.ResponderResources() != 4 || r.InitiatorDepth() != 5 ||
		r.TargetACKDelay() != 31 || r.FailoverAccepted() != 3 || !r.EndToEndFlowControl() ||
		r.RNRRetryCount() != 7 || !r.SRQ() || r.LocalCAGUID() != 6 || r.LocalEECN() != 0 {
		t.Error("REP fields")
	}
	if m[24+26] != 0xff || m[24+27] != 0xf0 || len(r.PrivateData()) != REPPrivateDataSize {
		t.Errorf("REP bytes %#x %#x", m[24+26], m[24+27])
	}

	m.Init(AttrMRA, 1)
	a := MRA(m.Data())
	a.SetLocalCommID(7)
	a.SetRemoteCommID(8)
	a.SetMessageMRAed(MsgREP)
	a.SetServiceTimeout(23)
	if a.LocalCommID() != 7 || a.RemoteCommID() != 8 || a.MessageMRAed() != MsgREP || a.ServiceTimeout() != 23 ||
		m[24+8] != 0x40 || m[24+9] != 23<<3 || len(a.PrivateData()) != MRAPrivateDataSize {
		t.Error("MRA fields")
	}

	m.Init(AttrREJ, 1)
	j := REJ(m.Data())
	j.SetLocalCommID(9)
	j.SetRemoteCommID(10)
	j.SetMessageRejected(MsgOther)
	j.SetReason(RejConsumerDefined)
	if n := j.SetARI(bytes.Repeat([]byte{0xaa}, 100)); n != ARISize {
		t.Errorf("SetARI copied %d", n)
	}
	j.SetARI([]byte{1, 2, 3})
	copy(j.PrivateData(), "no thanks")
	if j.LocalCommID() != 9 || j.RemoteCommID() != 10 || j.MessageRejected() != MsgOther || j.Reason() != RejConsumerDefined ||
		!bytes.Equal(j.ARI(), []byte{1, 2, 3}) || m[24+9] != 3<<1 || m[24+15] != 0 || m[24+11] != 28 ||
		len(j.PrivateData()) != REJPrivateDataSize || m[24+84] != 'n' {
		t.Error("REJ fields")
	}

	m.Init(AttrRTU, 1)
	u := RTU(m.Data())
	u.SetLocalCommID(11)
	u.SetRemoteCommID(12)
	if u.LocalCommID() != 11 || u.RemoteCommID() != 12 || len(u.PrivateData()) != RTUPrivateDataSize || !u.IsValid() {
		t.Error("RTU fields")
	}
	m.Init(AttrDREQ, 1)
	d := DREQ(m.Data())
	d.SetLocalCommID(13)
	d.SetRemoteCommID(14)
	d.SetRemoteQPN(0x000012)
	if d.LocalCommID() != 13 || d.RemoteCommID() != 14 || d.RemoteQPN() != 0x12 || m[24+10] != 0x12 || len(d.PrivateData()) != DREQPrivateDataSize {
		t.Error("DREQ fields")
	}
	m.Init(AttrDREP, 1)
	e := DREP(m.Data())
	e.SetLocalCommID(15)
	e.SetRemoteCommID(16)
	if e.LocalCommID() != 15 || e.RemoteCommID() != 16 || len(e.PrivateData()) != DREPPrivateDataSize {
		t.Error("DREP fields")
	}
	m.Init(AttrSIDRReq, 1)
	s := SIDRReq(m.Data())
	s.SetRequestID(17)
	s.SetPKey(0xffff)
	s.SetServiceID(RDMACMServiceID(PortSpaceUDP, 7174))
	if s.RequestID() != 17 || s.PKey() != 0xffff || s.ServiceID() != 0x0000000001111c06 || len(s.PrivateData()) != SIDRReqPrivateDataSize {
		t.Error("SIDR_REQ fields")
	}
	m.Init(AttrSIDRRep, 1)
	q := SIDRRep(m.Data())
	q.SetRequestID(18)
	q.SetStatus(SIDRSuccess)
	q.SetQPN(0x13)
	q.SetServiceID(0x0000000001111c06)
	q.SetQKey(0x01234567)
	if q.RequestID() != 18 || q.Status() != SIDRSuccess || q.QPN() != 0x13 || q.ServiceID() != 0x0000000001111c06 ||
		q.QKey() != 0x01234567 || q.AddInfoLength() != 0 || len(q.AddInfo()) != 0 || len(q.PrivateData()) != SIDRRepPrivateDataSize {
		t.Error("SIDR_REP fields")
	}
}

func TestServiceID(t *testing.T) {
	s := RDMACMServiceID(PortSpaceTCP, 20079)
	if s != 0x000000000106_4e6f || !s.IsRDMACM() || s.PortSpace() != PortSpaceTCP || s.Port() != 20079 {
		t.Fatalf("%#x", uint64(s))
	}
	if ServiceID(0x0200000000000001).IsRDMACM() || !RDMACMServiceID(PortSpaceIB, 1).IsRDMACM() {
		t.Error("IsRDMACM")
	}
}

func TestMTUAndTimeout(t *testing.T) {
	for m, n := range map[MTU]int{0: 0, MTU256: 256, MTU1024: 1024, MTU4096: 4096, 6: 0} {
		if m.Bytes() != n {
			t.Errorf("MTU(%d).Bytes() = %d", m, m.Bytes())
		}
	}
	for n, m := range map[int]MTU{1: MTU256, 300: MTU256, 1024: MTU1024, 1500: MTU1024, 9000: MTU4096} {
		if MTUOf(n) != m {
			t.Errorf("MTUOf(%d) = %d", n, MTUOf(n))
		}
	}
	if Timeout(0) != 4096*time.Nanosecond || Timeout(20) != 4294967296*time.Nanosecond {
		t.Error("Timeout")
	}
}

func TestCMAHeader(t *testing.T) {
	h := CMAHeader(make([]byte, CMAHeaderSize))
	h.Set(netip.MustParseAddrPort("10.77.0.3:39000"), netip.MustParseAddr("10.77.0.2"))
	want := []byte{0, 0x40, 0x98, 0x58, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 77, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 77, 0, 2}
	if !bytes.Equal(h, want) {
		t.Fatalf("% x", []byte(h))
	}
	if err := h.Check(); err != nil || h.Src() != netip.MustParseAddrPort("10.77.0.3:39000") || h.Dst() != netip.MustParseAddr("10.77.0.2") {
		t.Fatal(h.Src(), h.Dst(), err)
	}
	// IPv4-mapped input is stored as plain IPv4.
	h.Set(netip.MustParseAddrPort("[::ffff:10.77.0.3]:39000"), netip.MustParseAddr("::ffff:10.77.0.2"))
	if !bytes.Equal(h, want) {
		t.Fatalf("mapped: % x", []byte(h))
	}
	h.Set(netip.MustParseAddrPort("[fd00::1]:1"), netip.MustParseAddr("fd00::2"))
	if h.IPVersion() != 6 || h.Src() != netip.MustParseAddrPort("[fd00::1]:1") || h.Dst() != netip.MustParseAddr("fd00::2") || h.Check() != nil {
		t.Fatal("IPv6", h.Src(), h.Dst())
	}
	for _, bad := range []CMAHeader{h[:35], append(CMAHeader{1}, h[1:]...), append(CMAHeader{0, 0x50}, h[2:]...)} {
		if err := bad.Check(); !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("% x: %v", []byte(bad[:2]), err)
		}
	}
}

func TestRejectErrors(t *testing.T) {
	m := newMAD(AttrREJ, 1)
	j := REJ(m.Data())
	j.SetReason(RejInvalidServiceID)
	copy(j.PrivateData(), "x")
	err := error(NewRejectError(j))
	if !errors.Is(err, fabric.ErrRefused) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fabric.ErrInvalid) {
		t.Error("no listener:", err)
	}
	var re *RejectError
	if !errors.As(err, &re) || re.Reason != RejInvalidServiceID || re.PrivateData[0] != 'x' || len(re.PrivateData) != REJPrivateDataSize {
		t.Error("errors.As")
	}
	j.PrivateData()[0] = 'y'
	if re.PrivateData[0] != 'x' {
		t.Error("RejectError shares the MAD's memory")
	}
	j.SetReason(RejTimeout)
	err = NewRejectError(j)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fabric.ErrRefused) || !err.(*RejectError).Timeout() {
		t.Error("timeout:", err)
	}
	for _, c := range []struct {
		r                     RejectReason
		refused, inval, unsup bool
	}{
		{RejConsumerDefined, true, false, false},
		{RejStaleConn, true, false, false},
		{RejNoQP, true, false, false},
		{RejInvalidMTU, true, true, false},
		{RejInvalidGID, true, true, false},
		{RejInvalidAltPacketRate, true, true, false},
		{RejInsufficientRespRes, true, true, false},
		{RejInvalidClassVersion, true, false, true},
		{RejUnsupported, true, false, true},
	} {
		j.SetReason(c.r)
		err := NewRejectError(j)
		if errors.Is(err, fabric.ErrRefused) != c.refused || errors.Is(err, fabric.ErrInvalid) != c.inval || errors.Is(err, fabric.ErrNotSupported) != c.unsup {
			t.Errorf("%v: refused %v invalid %v unsupported %v", c.r, errors.Is(err, fabric.ErrRefused), errors.Is(err, fabric.ErrInvalid), errors.Is(err, fabric.ErrNotSupported))
		}
		if err.Error() == "" || c.r.String() == "" {
			t.Error("empty text")
		}
	}
	if RejectReason(34).String() != "reason 34" {
		t.Error(RejectReason(34).String())
	}
	if !errors.Is(ErrTimeout, context.DeadlineExceeded) || !errors.Is(ErrTimeout, os.ErrDeadlineExceeded) || errors.Is(ErrTimeout, fabric.ErrRefused) {
		t.Error("ErrTimeout")
	}
	se := &SIDRError{Status: SIDRUnsupported}
	if !errors.Is(se, fabric.ErrRefused) || errors.Is(se, fabric.ErrNotSupported) || se.Error() == "" {
		t.Error("SIDR unsupported")
	}
	se.Status = SIDRUnsupportedVersion
	if errors.Is(se, fabric.ErrRefused) || !errors.Is(se, fabric.ErrNotSupported) || SIDRStatus(9).String() != "status 9" {
		t.Error("SIDR version")
	}
}

func TestAttrString(t *testing.T) {
	if AttrREQ.String() != "REQ" || AttrSIDRRep.String() != "SIDR_REP" || AttrID(0xbeef).String() != "attribute 0xbeef" {
		t.Error(AttrREQ, AttrSIDRRep, AttrID(0xbeef))
	}
	if AttrLAP.Supported() || !AttrDREP.Supported() || AttrClassPortInfo.Supported() {
		t.Error("Supported")
	}
}
