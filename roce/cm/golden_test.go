package cm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"os"
	"testing"

	"github.com/weft-io/weft/roce/wire"
)

// goldenMAD is one CM MAD cut from a capture in testdata.
type goldenMAD struct {
	name string
	hex  string
}

func (g goldenMAD) mad() []byte {
	b, err := hex.DecodeString(g.hex)
	if err != nil || len(b) != MADSize {
		panic("bad golden MAD " + g.name)
	}
	return b
}

// goldenMADs are the non-zero prefixes of MADs from
// testdata/rping_udaddy.pcap (zero-padded to 256 bytes by init).
var goldenMADs = []goldenMAD{
	{"REQ", "010702030000000000000002d1b4d459001000000000000059d4b4d100000000" +
		"0000000001061c06505400fffe77000300000000000000000000110100000001" +
		"000000a0a1e4fda7ffff37f0ffffffff00000000000000000000ffff0a4d0003" +
		"00000000000000000000ffff0a4d0002b5308000004000980000000000000000" +
		"0000000000000000000000000000000000000000000000000000000000000000" +
		"000000000040e0be0000000000000000000000000a4d00030000000000000000" +
		"000000000a4d0002"},
	{"REJ", "010702030000000000000002d1b4d45800120000000000000000000058d4b4d1" +
		"00000008"},
}

func init() {
	for i := range goldenMADs {
		goldenMADs[i].hex += string(bytes.Repeat([]byte("0"), 2*MADSize-len(goldenMADs[i].hex)))
	}
}

// pcapIPPackets returns the IP packets of a little-endian Ethernet pcap.
func pcapIPPackets(t *testing.T, name string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 1 {
		t.Fatal("not a little-endian Ethernet pcap")
	}
	var out [][]byte
	for p := b[24:]; len(p) >= 16; {
		n := int(binary.LittleEndian.Uint32(p[8:]))
		frame := p[16 : 16+n]
		p = p[16+n:]
		if len(frame) > 14 && binary.BigEndian.Uint16(frame[12:]) == 0x0800 {
			out = append(out, frame[14:])
		}
	}
	return out
}

// captureMADs returns the MADs sent to QP 1 in a capture, after checking
// their transport headers as rxe sends them.
func captureMADs(t *testing.T, name string) []MAD {
	var mads []MAD
	for _, pkt := range pcapIPPackets(t, name) {
		ip, udp, err := wire.SplitIP(pkt)
		if err != nil || binary.BigEndian.Uint16(pkt[(pkt[0]&15)*4+2:]) != wire.UDPPort {
			continue // the capture also holds rdma_cm's other traffic
		}
		p, err := wire.Parse(udp)
		if err != nil {
			t.Fatal(err)
		}
		if p.BTH.DestQP() != GSIQPN {
			continue
		}
		if err := wire.VerifyICRC(ip); err != nil {
			t.Fatal(err)
		}
		if p.OpCode() != wire.OpUDSendOnly || p.BTH.PKey() != 0xffff || p.DETH.QKey() != GSIQKey || p.DETH.SrcQP() != GSIQPN || len(p.Payload) != MADSize {
			t.Fatalf("GSI packet: op %v pkey %#x qkey %#x srcqp %d len %d", p.OpCode(), p.BTH.PKey(), p.DETH.QKey(), p.DETH.SrcQP(), len(p.Payload))
		}
		mads = append(mads, MAD(p.Payload))
	}
	return mads
}

// rebuild writes a fresh MAD from the fields that m's accessors decode,
// through the setters only.
func rebuild(t *testing.T, m MAD) MAD {
	out := MAD(make([]byte, MADSize))
	out.Init(m.AttrID(), m.TID())
	out.SetStatus(m.Status())
	out.SetAttrMod(m.AttrMod())
	d, o := m.Data(), out.Data()
	switch m.AttrID() {
	case AttrREQ:
		r, q := REQ(d), REQ(o)
		q.SetLocalCommID(r.LocalCommID())
		q.SetServiceID(r.ServiceID())
		q.SetLocalCAGUID(r.LocalCAGUID())
		q.SetLocalQKey(r.LocalQKey())
		q.SetLocalQPN(r.LocalQPN())
		q.SetResponderResources(r.ResponderResources())
		q.SetInitiatorDepth(r.InitiatorDepth())
		q.SetRemoteCMResponseTimeout(r.RemoteCMResponseTimeout())
		q.SetTransportType(r.TransportType())
		q.SetEndToEndFlowControl(r.EndToEndFlowControl())
		q.SetStartingPSN(r.StartingPSN())
		q.SetLocalCMResponseTimeout(r.LocalCMResponseTimeout())
		q.SetRetryCount(r.RetryCount())
		q.SetPKey(r.PKey())
		q.SetPathMTU(r.PathMTU())
		q.SetRNRRetryCount(r.RNRRetryCount())
		q.SetMaxCMRetries(r.MaxCMRetries())
		q.SetSRQ(r.SRQ())
		for i, p := range []Path{r.Primary(), r.Alternate()} {
			n := q.Primary()
			if i == 1 {
				n = q.Alternate()
			}
			n.SetLocalLID(p.LocalLID())
			n.SetRemoteLID(p.RemoteLID())
			if p.LocalGID().IsUnspecified() && p.RemoteGID().IsUnspecified() {
				continue
			}
			n.SetLocalGID(p.LocalGID())
			n.SetRemoteGID(p.RemoteGID())
			n.SetFlowLabel(p.FlowLabel())
			n.SetPacketRate(p.PacketRate())
			n.SetTrafficClass(p.TrafficClass())
			n.SetHopLimit(p.HopLimit())
			n.SetSL(p.SL())
			n.SetSubnetLocal(p.SubnetLocal())
			n.SetLocalACKTimeout(p.LocalACKTimeout())
		}
		h := CMAHeader(r.PrivateData())
		if err := h.Check(); err != nil {
			t.Fatal(err)
		}
		CMAHeader(q.PrivateData()).Set(h.Src(), h.Dst())
		copy(q.PrivateData()[CMAHeaderSize:], r.PrivateData()[CMAHeaderSize:])
	case AttrREP:
		r, q := REP(d), REP(o)
		q.SetLocalCommID(r.LocalCommID())
		q.SetRemoteCommID(r.RemoteCommID())
		q.SetLocalQKey(r.LocalQKey())
		q.SetLocalQPN(r.LocalQPN())
		q.SetStartingPSN(r.StartingPSN())
		q.SetResponderResources(r.ResponderResources())
		q.SetInitiatorDepth(r.InitiatorDepth())
		q.SetTargetACKDelay(r.TargetACKDelay())
		q.SetFailoverAccepted(r.FailoverAccepted())
		q.SetEndToEndFlowControl(r.EndToEndFlowControl())
		q.SetRNRRetryCount(r.RNRRetryCount())
		q.SetSRQ(r.SRQ())
		q.SetLocalCAGUID(r.LocalCAGUID())
		copy(q.PrivateData(), r.PrivateData())
	case AttrRTU:
		RTU(o).SetLocalCommID(RTU(d).LocalCommID())
		RTU(o).SetRemoteCommID(RTU(d).RemoteCommID())
		copy(RTU(o).PrivateData(), RTU(d).PrivateData())
	case AttrDREQ:
		DREQ(o).SetLocalCommID(DREQ(d).LocalCommID())
		DREQ(o).SetRemoteCommID(DREQ(d).RemoteCommID())
		DREQ(o).SetRemoteQPN(DREQ(d).RemoteQPN())
		copy(DREQ(o).PrivateData(), DREQ(d).PrivateData())
	case AttrDREP:
		DREP(o).SetLocalCommID(DREP(d).LocalCommID())
		DREP(o).SetRemoteCommID(DREP(d).RemoteCommID())
		copy(DREP(o).PrivateData(), DREP(d).PrivateData())
	case AttrREJ:
		r, q := REJ(d), REJ(o)
		q.SetLocalCommID(r.LocalCommID())
		q.SetRemoteCommID(r.RemoteCommID())
		q.SetMessageRejected(r.MessageRejected())
		q.SetReason(r.Reason())
		q.SetARI(r.ARI())
		copy(q.PrivateData(), r.PrivateData())
	case AttrMRA:
		r, q := MRA(d), MRA(o)
		q.SetLocalCommID(r.LocalCommID())
		q.SetRemoteCommID(r.RemoteCommID())
		q.SetMessageMRAed(r.MessageMRAed())
		q.SetServiceTimeout(r.ServiceTimeout())
		copy(q.PrivateData(), r.PrivateData())
	case AttrSIDRReq:
		r, q := SIDRReq(d), SIDRReq(o)
		q.SetRequestID(r.RequestID())
		q.SetPKey(r.PKey())
		q.SetServiceID(r.ServiceID())
		h := CMAHeader(r.PrivateData())
		if err := h.Check(); err != nil {
			t.Fatal(err)
		}
		CMAHeader(q.PrivateData()).Set(h.Src(), h.Dst())
		copy(q.PrivateData()[CMAHeaderSize:], r.PrivateData()[CMAHeaderSize:])
	case AttrSIDRRep:
		r, q := SIDRRep(d), SIDRRep(o)
		q.SetRequestID(r.RequestID())
		q.SetStatus(r.Status())
		q.SetQPN(r.QPN())
		q.SetServiceID(r.ServiceID())
		q.SetQKey(r.QKey())
		copy(q.PrivateData(), r.PrivateData())
	}
	return out
}

// TestCaptureRpingUdaddy decodes every CM MAD of a capture of rping (one
// connection, three iterations, then disconnect), an rping to a port
// nobody listens on, and udaddy (UD through SIDR) between two Soft-RoCE
// guests (Linux 6.1, rdma-core 44), checks the decoded values, and
// rebuilds each MAD byte for byte through the setters.
func TestCaptureRpingUdaddy(t *testing.T) {
	mads := captureMADs(t, "testdata/rping_udaddy.pcap")
	var attrs []AttrID
	for _, m := range mads {
		if _, err := ParseMAD(m); err != nil {
			t.Fatalf("%v: %v", m.AttrID(), err)
		}
		attrs = append(attrs, m.AttrID())
		if got := rebuild(t, m); !bytes.Equal(got, m) {
			t.Errorf("%v rebuilt differs:\n got %x\nwant %x", m.AttrID(), []byte(got), []byte(m))
		}
	}
	want := []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrREQ, AttrREJ, AttrSIDRReq, AttrSIDRRep}
	if len(attrs) != len(want) {
		t.Fatalf("messages %v, want %v", attrs, want)
	}
	for i := range want {
		if attrs[i] != want[i] {
			t.Fatalf("messages %v, want %v", attrs, want)
		}
	}
	client, server := netip.MustParseAddr("10.77.0.3"), netip.MustParseAddr("10.77.0.2")

	// rping: REQ from the client to rdma_cm port 7174 (rping's default).
	req := REQ(mads[0].Data())
	h := CMAHeader(req.PrivateData())
	if req.ServiceID() != RDMACMServiceID(PortSpaceTCP, 7174) || req.LocalQPN() != 0x11 ||
		req.ResponderResources() != 1 || req.InitiatorDepth() != 1 || req.PathMTU() != MTU1024 ||
		req.TransportType() != TransportRC || req.RemoteCMResponseTimeout() != 20 || req.LocalCMResponseTimeout() != 20 ||
		req.RetryCount() != 7 || req.RNRRetryCount() != 7 || req.MaxCMRetries() != 15 || req.PKey() != 0xffff ||
		req.Primary().LocalGID() != netip.AddrFrom16(client.As16()) || req.Primary().RemoteGID() != netip.AddrFrom16(server.As16()) ||
		req.Primary().LocalLID() != 0xffff || req.Primary().HopLimit() != 64 || req.Primary().LocalACKTimeout() != 19 ||
		h.IPVersion() != 4 || h.Src().Addr() != client || h.Dst() != server || h.Port() != 0xe0be {
		t.Errorf("REQ decoded wrong: sid %#x qpn %#x rr %d id %d mtu %d", uint64(req.ServiceID()), req.LocalQPN(), req.ResponderResources(), req.InitiatorDepth(), req.PathMTU())
	}
	rep := REP(mads[1].Data())
	if rep.RemoteCommID() != req.LocalCommID() || rep.LocalQPN() != 0x11 || rep.ResponderResources() != 1 ||
		rep.InitiatorDepth() != 1 || rep.RNRRetryCount() != 7 || rep.TargetACKDelay() != 15 || mads[1].TID() != mads[0].TID() {
		t.Error("REP decoded wrong")
	}
	rtu := RTU(mads[2].Data())
	if rtu.LocalCommID() != req.LocalCommID() || rtu.RemoteCommID() != rep.LocalCommID() {
		t.Error("RTU ids")
	}
	dreq := DREQ(mads[3].Data())
	if dreq.LocalCommID() != req.LocalCommID() || dreq.RemoteCommID() != rep.LocalCommID() || dreq.RemoteQPN() != rep.LocalQPN() {
		t.Error("DREQ decoded wrong")
	}
	drep := DREP(mads[4].Data())
	if drep.LocalCommID() != rep.LocalCommID() || drep.RemoteCommID() != req.LocalCommID() {
		t.Error("DREP ids")
	}
	// rping -p 9999 where nobody listens: REJ "invalid service id",
	// without a local communication id.
	req2 := REQ(mads[5].Data())
	rej := REJ(mads[6].Data())
	if req2.ServiceID().Port() != 9999 || rej.LocalCommID() != 0 || rej.RemoteCommID() != req2.LocalCommID() ||
		rej.MessageRejected() != MsgREQ || rej.Reason() != RejInvalidServiceID || rej.ARILength() != 0 || mads[6].TID() != mads[5].TID() {
		t.Error("REJ decoded wrong")
	}
	// udaddy: SIDR to UDP port 7174; the reply names QP 0x12 and
	// udaddy's Q_Key.
	sreq := SIDRReq(mads[7].Data())
	srep := SIDRRep(mads[8].Data())
	sh := CMAHeader(sreq.PrivateData())
	if sreq.ServiceID() != RDMACMServiceID(PortSpaceUDP, 7174) || sreq.PKey() != 0xffff || sh.Src().Addr() != client || sh.Dst() != server ||
		srep.RequestID() != sreq.RequestID() || srep.Status() != SIDRSuccess || srep.QPN() != 0x12 || srep.QKey() != 0x01234567 ||
		srep.ServiceID() != sreq.ServiceID() {
		t.Error("SIDR decoded wrong")
	}
	// The golden table matches the capture.
	for _, g := range goldenMADs {
		found := false
		for _, m := range mads {
			found = found || bytes.Equal(m, g.mad())
		}
		if !found {
			t.Errorf("golden %s not in the capture", g.name)
		}
	}
}

// TestCaptureWeftRxe decodes and rebuilds every CM MAD of a capture of
// Weft's engine (10.77.0.1) against librdmacm in a Soft-RoCE guest
// (10.77.0.2): rdma_server refusing until it listened, then accepting
// Weft's REQ (REP, RTU, its DREQ, Weft's DREP); rdma_client connecting to
// Weft's listener (REQ, Weft's REP, RTU, DREQ, DREP); and rping refused by
// Weft (REJ, invalid service id). The MADs Weft built decode as Linux's do.
func TestCaptureWeftRxe(t *testing.T) {
	mads := captureMADs(t, "testdata/weft_rxe.pcap")
	count := map[AttrID]int{}
	for _, m := range mads {
		if _, err := ParseMAD(m); err != nil {
			t.Fatalf("%v: %v", m.AttrID(), err)
		}
		count[m.AttrID()]++
		if got := rebuild(t, m); !bytes.Equal(got, m) {
			t.Errorf("%v rebuilt differs:\n got %x\nwant %x", m.AttrID(), []byte(got), []byte(m))
		}
	}
	if count[AttrREQ] < 3 || count[AttrREP] != 2 || count[AttrRTU] != 2 || count[AttrDREQ] != 2 || count[AttrDREP] != 2 || count[AttrREJ] < 2 {
		t.Errorf("messages: %v", count)
	}
	last := REJ(mads[len(mads)-1].Data())
	if mads[len(mads)-1].AttrID() != AttrREJ || last.Reason() != RejInvalidServiceID || last.LocalCommID() != 0 {
		t.Error("the engine's REJ of rping decoded wrong")
	}
}
