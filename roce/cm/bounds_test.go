package cm

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// The rules this package owns, each at, one below and one above its
// bound (issue 29): a peer's MAD is parsed here, so a broken check must
// fail a test here, not only through roce.

// parseReason parses b and returns the reason it was dropped for (0 if it
// was taken).
func parseReason(t *testing.T, b []byte) Reason {
	t.Helper()
	m, err := ParseMAD(b)
	if err == nil {
		if len(m) != MADSize {
			t.Fatalf("ParseMAD took %d bytes", len(m))
		}
		return 0
	}
	var pe *fabric.MalformedError
	if !errors.As(err, &pe) || !errors.Is(err, fabric.ErrMalformed) {
		t.Fatalf("ParseMAD: %v is not a MalformedError matching ErrMalformed", err)
	}
	return Reason(pe.Code)
}

// validMAD is a MAD of attr that ParseMAD takes.
func validMAD(attr AttrID) MAD {
	m := newMAD(attr, 1)
	if attr == AttrREQ {
		REQ(m.Data()).SetPathMTU(MTU1024)
	}
	return m
}

// TestParseMADBounds: every header field at the value taken and the
// values beside it.
func TestParseMADBounds(t *testing.T) {
	for _, c := range []struct {
		name string
		b    []byte
		want Reason
	}{
		{"255 bytes", validMAD(AttrRTU)[:MADSize-1], ReasonSize},
		{"256 bytes", validMAD(AttrRTU), 0},
		{"257 bytes", append(validMAD(AttrRTU), 0), ReasonSize},
		{"base version 0", func() []byte { m := validMAD(AttrRTU); m[0] = 0; return m }(), ReasonBaseVersion},
		{"class 0x06", func() []byte { m := validMAD(AttrRTU); m[1] = 0x06; return m }(), ReasonClass},
		{"class 0x08", func() []byte { m := validMAD(AttrRTU); m[1] = 0x08; return m }(), ReasonClass},
		{"class version 3", func() []byte { m := validMAD(AttrRTU); m[2] = 3; return m }(), ReasonClassVersion},
		{"method Get", func() []byte { m := validMAD(AttrRTU); m[3] = byte(MethodGet); return m }(), ReasonMethod},
		{"method GetResp", func() []byte { m := validMAD(AttrRTU); m[3] = byte(MethodGetResp); return m }(), ReasonMethod},
		{"attribute 0x000f", func() []byte { m := validMAD(AttrRTU); m[17] = 0x0f; return m }(), ReasonAttribute},
		{"attribute REQ (0x0010)", validMAD(AttrREQ), 0},
		{"attribute SIDR_REP (0x0018)", validMAD(AttrSIDRRep), 0},
		{"attribute LAP (0x0019)", func() []byte { m := validMAD(AttrRTU); m[17] = 0x19; return m }(), ReasonAttribute},
	} {
		if got := parseReason(t, c.b); got != c.want {
			t.Errorf("%s: reason %d (%v), want %d (%v)", c.name, got, got, c.want, c.want)
		}
	}
	// Every supported attribute parses, every other one is dropped.
	for a := AttrID(0); a < 0x20; a++ {
		m := validMAD(AttrRTU)
		m[16], m[17] = byte(a>>8), byte(a)
		if a == AttrREQ {
			REQ(m.Data()).SetPathMTU(MTU1024)
		}
		want := ReasonAttribute
		if a.Supported() {
			want = 0
		}
		if got := parseReason(t, m); got != want {
			t.Errorf("attribute %#x: reason %v, want %v", uint16(a), got, want)
		}
	}
}

// TestParseMessageBounds: the message fields with a limited range, each
// at its largest valid value and one above, and the smallest.
func TestParseMessageBounds(t *testing.T) {
	req := func(f func(r REQ)) []byte {
		m := validMAD(AttrREQ)
		f(REQ(m.Data()))
		return m
	}
	with := func(attr AttrID, f func(d []byte)) []byte {
		m := validMAD(attr)
		f(m.Data())
		return m
	}
	for _, c := range []struct {
		name string
		b    []byte
		want Reason
	}{
		{"REQ MTU 0", req(func(r REQ) { r.SetPathMTU(0) }), ReasonField},
		{"REQ MTU 256", req(func(r REQ) { r.SetPathMTU(MTU256) }), 0},
		{"REQ MTU 4096", req(func(r REQ) { r.SetPathMTU(MTU4096) }), 0},
		{"REQ MTU 6", req(func(r REQ) { r.SetPathMTU(6) }), ReasonField},
		{"REQ transport RC", req(func(r REQ) { r.SetTransportType(TransportRC) }), 0},
		{"REQ transport RD", req(func(r REQ) { r.SetTransportType(TransportRD) }), 0},
		{"REQ transport 3", req(func(r REQ) { r.SetTransportType(3) }), ReasonField},
		{"MRA message LAP (2)", with(AttrMRA, func(d []byte) { MRA(d).SetMessageMRAed(MsgOther) }), 0},
		{"MRA message 3", with(AttrMRA, func(d []byte) { MRA(d).SetMessageMRAed(3) }), ReasonField},
		{"REJ message other (2)", with(AttrREJ, func(d []byte) { REJ(d).SetMessageRejected(MsgOther) }), 0},
		{"REJ message 3", with(AttrREJ, func(d []byte) { REJ(d).SetMessageRejected(3) }), ReasonField},
		{"REJ ARI 71", with(AttrREJ, func(d []byte) { REJ(d).SetARI(make([]byte, ARISize-1)) }), 0},
		{"REJ ARI 72", with(AttrREJ, func(d []byte) { REJ(d).SetARI(make([]byte, ARISize)) }), 0},
		{"REJ ARI 73", with(AttrREJ, func(d []byte) { d[9] = (ARISize + 1) << 1 }), ReasonField},
		{"SIDR_REP info 72", with(AttrSIDRRep, func(d []byte) { d[5] = ARISize }), 0},
		{"SIDR_REP info 73", with(AttrSIDRRep, func(d []byte) { d[5] = ARISize + 1 }), ReasonField},
		// Fields that only the message with the limit checks: the same
		// bytes in another message are taken.
		{"RTU with REQ's MTU byte 0", with(AttrRTU, func(d []byte) { d[reqByte50] = 0 }), 0},
		{"DREQ with REJ's message byte", with(AttrDREQ, func(d []byte) { d[8] = 0xc0; d[9] = 0xff }), 0},
	} {
		if got := parseReason(t, c.b); got != c.want {
			t.Errorf("%s: reason %d (%v), want %d (%v)", c.name, got, got, c.want, c.want)
		}
	}
}

// TestLengthAccessorsClamp: a REJ's ARI and a SIDR_REP's additional
// information never reach past ARISize, whatever the length byte says
// (the views are also used on messages ParseMAD did not check).
func TestLengthAccessorsClamp(t *testing.T) {
	m := validMAD(AttrREJ)
	j := REJ(m.Data())
	for _, n := range []int{0, 1, ARISize - 1, ARISize} {
		if got := j.SetARI(bytes.Repeat([]byte{7}, n)); got != n || len(j.ARI()) != n || int(j.ARILength()) != n {
			t.Errorf("SetARI(%d bytes): copied %d, ARI %d bytes, length %d", n, got, len(j.ARI()), j.ARILength())
		}
	}
	if got := j.SetARI(make([]byte, ARISize+1)); got != ARISize || len(j.ARI()) != ARISize {
		t.Errorf("SetARI(%d bytes): copied %d, ARI %d bytes", ARISize+1, got, len(j.ARI()))
	}
	m.Data()[9] = 127 << 1
	if len(j.ARI()) != ARISize {
		t.Errorf("ARI length 127: %d bytes, want %d", len(j.ARI()), ARISize)
	}
	s := SIDRRep(validMAD(AttrSIDRRep).Data())
	for n, want := range map[int]int{0: 0, ARISize - 1: ARISize - 1, ARISize: ARISize, ARISize + 1: ARISize, 255: ARISize} {
		s[5] = byte(n)
		if len(s.AddInfo()) != want {
			t.Errorf("SIDR_REP info length %d: %d bytes, want %d", n, len(s.AddInfo()), want)
		}
	}
}

// TestDropsBounds: Drops counts this package's reasons and nothing else.
func TestDropsBounds(t *testing.T) {
	var d Drops
	for r := ReasonSize; r < numReasons; r++ {
		if !d.Add(malformed(r)) {
			t.Errorf("reason %v not counted", r)
		}
		if d.Count(r) != 1 {
			t.Errorf("reason %v: count %d, want 1", r, d.Count(r))
		}
	}
	last := numReasons - 1
	if d.Add(&fabric.MalformedError{Where: "roce/cm MAD", What: "x", Code: int(numReasons)}) || d.Add(&fabric.MalformedError{Code: 255}) {
		t.Error("a MalformedError with a reason out of range was counted")
	}
	cp := *parseErrs[ReasonSize]
	if d.Add(&cp) || d.Add(fmt.Errorf("x: %w", parseErrs[ReasonSize])) || d.Add(fabric.ErrMalformed) || d.Add(nil) || d.Count(ReasonSize) != 1 {
		t.Error("an error that is not one of ParseMAD's own was counted")
	}
	if d.Count(numReasons) != 0 || d.Count(255) != 0 || d.Count(last) != 1 {
		t.Errorf("Count(numReasons) %d, Count(255) %d, Count(last) %d", d.Count(numReasons), d.Count(255), d.Count(last))
	}
	if d.Total() != uint64(numReasons-1) {
		t.Errorf("total %d, want %d", d.Total(), numReasons-1)
	}
}

// TestMTUBounds: the MTU codes and sizes at each boundary.
func TestMTUBounds(t *testing.T) {
	for m, n := range map[MTU]int{0: 0, MTU256: 256, MTU512: 512, MTU2048: 2048, MTU4096: 4096, 6: 0, 15: 0} {
		if m.Bytes() != n {
			t.Errorf("MTU(%d).Bytes() = %d, want %d", m, m.Bytes(), n)
		}
	}
	for n, m := range map[int]MTU{0: MTU256, 255: MTU256, 256: MTU256, 511: MTU256, 512: MTU512, 1023: MTU512,
		2047: MTU1024, 2048: MTU2048, 4095: MTU2048, 4096: MTU4096, 4097: MTU4096} {
		if MTUOf(n) != m {
			t.Errorf("MTUOf(%d) = %d, want %d", n, MTUOf(n), m)
		}
	}
	if Timeout(31) != Timeout(63) || Timeout(1) != 2*Timeout(0) {
		t.Error("Timeout keeps only 5 bits of its exponent")
	}
}

// TestServiceIDBounds: the rdma_cm range is exactly 0x0000000001xxxxxx.
func TestServiceIDBounds(t *testing.T) {
	for s, want := range map[ServiceID]bool{
		0x0000_0000_00ff_ffff: false,
		0x0000_0000_0100_0000: true,
		0x0000_0000_01ff_ffff: true,
		0x0000_0000_0200_0000: false,
		0x0000_0001_0100_0000: false,
		0x1000_0000_0100_0000: false,
	} {
		if s.IsRDMACM() != want {
			t.Errorf("%#016x.IsRDMACM() = %v", uint64(s), !want)
		}
	}
}

// TestCMAHeaderBounds: the rdma_cm header's length, version and IP
// version, each at and beside the values taken.
func TestCMAHeaderBounds(t *testing.T) {
	good := CMAHeader(make([]byte, CMAHeaderSize))
	good.Set(netip.MustParseAddrPort("10.0.0.1:7"), netip.MustParseAddr("10.0.0.2"))
	for _, c := range []struct {
		name string
		h    CMAHeader
		ok   bool
	}{
		{"36 bytes", good, true},
		{"35 bytes", good[:CMAHeaderSize-1], false},
		{"37 bytes", append(bytes.Clone(good), 0), true},
		{"version 1", append(CMAHeader{1}, good[1:]...), false},
		{"IP version 3", append(CMAHeader{0, 0x30}, good[2:]...), false},
		{"IP version 4", append(CMAHeader{0, 0x40}, good[2:]...), true},
		{"IP version 5", append(CMAHeader{0, 0x50}, good[2:]...), false},
		{"IP version 6", append(CMAHeader{0, 0x60}, good[2:]...), true},
		{"IP version 7", append(CMAHeader{0, 0x70}, good[2:]...), false},
		{"IP version 4, low bits set", append(CMAHeader{0, 0x4f}, good[2:]...), true},
	} {
		err := c.h.Check()
		if (err == nil) != c.ok {
			t.Errorf("%s: Check() = %v, want ok %v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, fabric.ErrMalformed) {
			t.Errorf("%s: %v does not match ErrMalformed", c.name, err)
		}
	}
}

// TestRejectReasonBounds: which reasons mean an invalid parameter,
// checked at the ends of each range and just outside them.
func TestRejectReasonBounds(t *testing.T) {
	m := validMAD(AttrREJ)
	j := REJ(m.Data())
	invalid := map[RejectReason]bool{
		RejRDCNotExist:          false, // 11, below the path range
		RejInvalidGID:           true,  // 12
		RejInvalidAltPacketRate: true,  // 23
		RejPortCMRedirect:       false, // 24, above it
		RejPortRedirect:         false,
		RejInvalidMTU:           true,
		RejInsufficientRespRes:  true,
		RejConsumerDefined:      false,
		RejInvalidRNRRetry:      true,
		RejDuplicateLocalCommID: false,
		RejInvalidClassVersion:  false,
		RejInvalidFlowLabel:     true,
		RejInvalidAltFlowLabel:  true,
		34:                      false,
	}
	for r, want := range invalid {
		j.SetReason(r)
		if got := errors.Is(NewRejectError(j), fabric.ErrInvalid); got != want {
			t.Errorf("reason %d (%v): matches ErrInvalid %v, want %v", r, r, got, want)
		}
	}
	unsup := map[RejectReason]bool{
		RejUnsupported: true, RejInvalidTransportType: true, RejInvalidClassVersion: true,
		RejVendorOptionNotSupported: true, RejInvalidCommID: false, RejTimeout: false, 34: false,
	}
	for r, want := range unsup {
		j.SetReason(r)
		if got := errors.Is(NewRejectError(j), fabric.ErrNotSupported); got != want {
			t.Errorf("reason %d (%v): matches ErrNotSupported %v, want %v", r, r, got, want)
		}
	}
	j.SetMessageRejected(MsgREP)
	j.SetARI([]byte{1, 2})
	re := NewRejectError(j)
	if re.Rejected != MsgREP || !bytes.Equal(re.ARI, []byte{1, 2}) {
		t.Errorf("RejectError: rejected %d, ARI % x", re.Rejected, re.ARI)
	}
	j.ARI()[0] = 9
	if re.ARI[0] != 1 {
		t.Error("RejectError.ARI shares the MAD's memory")
	}
	for st, want := range map[SIDRStatus][2]bool{
		SIDRSuccess: {true, false}, SIDRReject: {true, false}, SIDRNoQP: {true, false},
		SIDRRedirect: {true, false}, SIDRUnsupportedVersion: {false, true},
	} {
		e := &SIDRError{Status: st}
		if errors.Is(e, fabric.ErrRefused) != want[0] || errors.Is(e, fabric.ErrNotSupported) != want[1] || errors.Is(e, fabric.ErrInvalid) {
			t.Errorf("SIDR status %v: refused %v, not supported %v", st, errors.Is(e, fabric.ErrRefused), errors.Is(e, fabric.ErrNotSupported))
		}
	}
}

// TestViewsIsValid: every message view needs the whole message, DataSize
// bytes, and takes a longer one.
func TestViewsIsValid(t *testing.T) {
	valid := map[string]func(b []byte) bool{
		"REQ":      func(b []byte) bool { return REQ(b).IsValid() },
		"MRA":      func(b []byte) bool { return MRA(b).IsValid() },
		"REJ":      func(b []byte) bool { return REJ(b).IsValid() },
		"REP":      func(b []byte) bool { return REP(b).IsValid() },
		"RTU":      func(b []byte) bool { return RTU(b).IsValid() },
		"DREQ":     func(b []byte) bool { return DREQ(b).IsValid() },
		"DREP":     func(b []byte) bool { return DREP(b).IsValid() },
		"SIDR_REQ": func(b []byte) bool { return SIDRReq(b).IsValid() },
		"SIDR_REP": func(b []byte) bool { return SIDRRep(b).IsValid() },
		"MAD":      func(b []byte) bool { return MAD(b).IsValid() },
	}
	for name, ok := range valid {
		n := DataSize
		if name == "MAD" {
			n = MADSize
		}
		b := make([]byte, n+1)
		if ok(b[:n-1]) || !ok(b[:n]) || !ok(b) {
			t.Errorf("%s.IsValid: %d bytes %v, %d bytes %v, %d bytes %v", name, n-1, ok(b[:n-1]), n, ok(b[:n]), n+1, ok(b))
		}
	}
	if MAD(make([]byte, MADSize-1)).IsValid() {
		t.Error("MAD.IsValid takes 255 bytes")
	}
}
