package cm

import (
	"bytes"
	"net/netip"
	"testing"
)

// seedMADs returns one valid MAD of every supported attribute, and the
// golden MADs cut from captures.
func seedMADs() [][]byte {
	var out [][]byte
	for a := AttrREQ; a <= AttrSIDRRep; a++ {
		m := MAD(make([]byte, MADSize))
		m.Init(a, uint64(a))
		if a == AttrREQ {
			r := REQ(m.Data())
			r.SetPathMTU(MTU1024)
			CMAHeader(r.PrivateData()).Set(netip.MustParseAddrPort("10.0.0.1:5"), netip.MustParseAddr("10.0.0.2"))
		}
		out = append(out, m)
	}
	for _, g := range goldenMADs {
		out = append(out, g.mad())
	}
	return out
}

// readAll calls every accessor of the message view of m.
func readAll(m MAD) (sum uint64) {
	add := func(v ...uint64) {
		for _, x := range v {
			sum += x
		}
	}
	d := m.Data()
	add(uint64(m.Status()), uint64(m.ClassSpecific()), m.TID(), uint64(m.AttrMod()))
	switch m.AttrID() {
	case AttrREQ:
		r := REQ(d)
		add(uint64(r.LocalCommID()), uint64(r.ServiceID()), r.LocalCAGUID(), uint64(r.LocalQKey()), uint64(r.LocalQPN()),
			uint64(r.ResponderResources()), uint64(r.InitiatorDepth()), uint64(r.LocalEECN()), uint64(r.RemoteEECN()),
			uint64(r.RemoteCMResponseTimeout()), uint64(r.TransportType()), uint64(r.StartingPSN()),
			uint64(r.LocalCMResponseTimeout()), uint64(r.RetryCount()), uint64(r.PKey()), uint64(r.PathMTU().Bytes()),
			uint64(r.RNRRetryCount()), uint64(r.MaxCMRetries()), uint64(r.ExtendedTransportType()))
		_ = r.EndToEndFlowControl() || r.RDCExists() || r.SRQ()
		for _, p := range []Path{r.Primary(), r.Alternate()} {
			add(uint64(p.LocalLID()), uint64(p.RemoteLID()), uint64(p.FlowLabel()), uint64(p.PacketRate()),
				uint64(p.TrafficClass()), uint64(p.HopLimit()), uint64(p.SL()), uint64(p.LocalACKTimeout()))
			_, _, _ = p.LocalGID(), p.RemoteGID(), p.SubnetLocal()
		}
		if h := CMAHeader(r.PrivateData()); h.Check() == nil {
			_, _ = h.Src(), h.Dst()
		}
	case AttrMRA:
		a := MRA(d)
		add(uint64(a.LocalCommID()), uint64(a.RemoteCommID()), uint64(a.MessageMRAed()), uint64(a.ServiceTimeout()), uint64(len(a.PrivateData())))
	case AttrREJ:
		j := REJ(d)
		add(uint64(j.LocalCommID()), uint64(j.RemoteCommID()), uint64(j.MessageRejected()), uint64(len(j.ARI())), uint64(len(j.PrivateData())))
		_ = NewRejectError(j).Error()
	case AttrREP:
		r := REP(d)
		add(uint64(r.LocalCommID()), uint64(r.RemoteCommID()), uint64(r.LocalQKey()), uint64(r.LocalQPN()), uint64(r.LocalEECN()),
			uint64(r.StartingPSN()), uint64(r.ResponderResources()), uint64(r.InitiatorDepth()), uint64(r.TargetACKDelay()),
			uint64(r.FailoverAccepted()), uint64(r.RNRRetryCount()), r.LocalCAGUID(), uint64(len(r.PrivateData())))
	case AttrRTU:
		add(uint64(RTU(d).LocalCommID()), uint64(RTU(d).RemoteCommID()), uint64(len(RTU(d).PrivateData())))
	case AttrDREQ:
		add(uint64(DREQ(d).LocalCommID()), uint64(DREQ(d).RemoteCommID()), uint64(DREQ(d).RemoteQPN()), uint64(len(DREQ(d).PrivateData())))
	case AttrDREP:
		add(uint64(DREP(d).LocalCommID()), uint64(DREP(d).RemoteCommID()), uint64(len(DREP(d).PrivateData())))
	case AttrSIDRReq:
		s := SIDRReq(d)
		add(uint64(s.RequestID()), uint64(s.PKey()), uint64(s.ServiceID()), uint64(len(s.PrivateData())))
		if h := CMAHeader(s.PrivateData()); h.Check() == nil {
			_, _ = h.Src(), h.Dst()
		}
	case AttrSIDRRep:
		s := SIDRRep(d)
		add(uint64(s.RequestID()), uint64(s.Status()), uint64(s.QPN()), uint64(s.ServiceID()), uint64(s.QKey()), uint64(len(s.AddInfo())), uint64(len(s.PrivateData())))
	}
	return sum
}

// FuzzParseMAD feeds arbitrary datagrams to ParseMAD. It must not panic;
// what it accepts must have the checked header and be readable through
// every accessor of its message.
func FuzzParseMAD(f *testing.F) {
	for _, s := range seedMADs() {
		f.Add(s)
	}
	f.Add([]byte{1, 7, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		m, err := ParseMAD(b)
		if !bytes.Equal(in, b) {
			t.Fatal("ParseMAD modified its input")
		}
		if err != nil {
			var d Drops
			if m != nil || !d.Add(err) {
				t.Fatalf("error %v not a counted MalformedError (mad %v)", err, m != nil)
			}
			return
		}
		if len(m) != MADSize || m.BaseVersion() != BaseVersion || m.MgmtClass() != ClassCM ||
			m.ClassVersion() != ClassVersion || m.Method() != MethodSend || !m.AttrID().Supported() {
			t.Fatal("accepted a MAD with a bad header")
		}
		readAll(m)
	})
}

// FuzzCMAHeader checks that Check, Src and Dst never panic, and that a
// valid header without stray padding is rebuilt byte for byte by Set.
func FuzzCMAHeader(f *testing.F) {
	h := CMAHeader(make([]byte, CMAHeaderSize))
	h.Set(netip.MustParseAddrPort("10.77.0.3:39000"), netip.MustParseAddr("10.77.0.2"))
	f.Add([]byte(h))
	h.Set(netip.MustParseAddrPort("[fd00::1]:1"), netip.MustParseAddr("fd00::2"))
	f.Add([]byte(h))
	f.Add([]byte{0, 0x40})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := CMAHeader(b)
		if h.Check() != nil {
			return
		}
		src, dst := h.Src(), h.Dst()
		if h.IPVersion() == 4 && (!src.Addr().Is4() || !dst.Is4()) {
			t.Fatal("IPv4 header gave", src, dst)
		}
		if h[1]&0x0f != 0 || (h.IPVersion() == 4 && (!allZero(h[4:16]) || !allZero(h[20:32]))) ||
			(h.IPVersion() == 6 && (src.Addr().Is4In6() || dst.Is4In6())) {
			return // bits Set never writes
		}
		g := CMAHeader(make([]byte, CMAHeaderSize))
		g.Set(src, dst)
		if !bytes.Equal(g, h[:CMAHeaderSize]) {
			t.Fatalf("rebuilt % x\n  from % x", []byte(g), []byte(h[:CMAHeaderSize]))
		}
	})
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
