package roce

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/wire"
)

// The CM's rules, broken by a hostile peer (issue 29): REP, RTU, DREQ,
// REJ and MRA with the wrong communication ids or from the wrong address,
// on the dialing (active) and the listening (passive) side; REQs the
// listener must refuse; the private-data bounds; MaxRetries run out.

// The communication id the hostile peer uses for itself.
const peerCommID = 0x0bad_cafe

// cmMAD returns a MAD of attr, its message filled in by f.
func cmMAD(attr cm.AttrID, tid uint64, f func(d []byte)) []byte {
	m := cm.MAD(make([]byte, cm.MADSize))
	m.Init(attr, tid)
	if f != nil {
		f(m.Data())
	}
	return m
}

// unmatched returns the engine's CM's count of unmatched MADs.
func (p *peer) unmatched() uint64 { return p.e.CM().Stats().Unmatched }

// expectMAD returns the next MAD of attr the engine sent.
func (p *peer) expectMAD(attr cm.AttrID) cm.MAD {
	p.t.Helper()
	return cm.MAD(p.expect("a "+attr.String(), isMAD(attr)).Payload)
}

// forged injects mad from src and checks that the CM counted it unmatched.
func (p *peer) forged(what string, src netip.Addr, mad []byte) {
	p.t.Helper()
	before := p.unmatched()
	p.injectMAD(src, mad)
	if d := p.unmatched() - before; d != 1 {
		p.t.Errorf("%s: %d unmatched, want 1", what, d)
	}
}

// dial starts a Dial from the engine to the peer's rdma_cm port 7471 and
// returns the REQ it sent and the channel its result comes on.
func (p *peer) dial(cfg *ConnConfig) (cm.MAD, <-chan dialResult) {
	p.t.Helper()
	out := make(chan dialResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := p.e.CM().Dial(ctx, p.e.AllocPD(), netip.AddrPortFrom(p.addr, 7471), cfg)
		out <- dialResult{c, err}
	}()
	return p.expectMAD(cm.AttrREQ), out
}

type dialResult struct {
	c   *Conn
	err error
}

// result waits at most 20 s for a Dial's or an Accept's result.
func result(t testing.TB, ch <-chan dialResult, what string) dialResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not return within 20 s", what)
	}
	return dialResult{}
}

// pending checks that ch has no result yet. (The CM takes a MAD
// synchronously: one that ended the handshake would have closed it.)
func pending(t testing.TB, ch <-chan dialResult, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned (%v) on forged messages", what, r.err)
	default:
	}
}

// rep is the peer's REP to req.
func rep(req cm.MAD, local, remote uint32) []byte {
	return cmMAD(cm.AttrREP, req.TID(), func(d []byte) {
		r := cm.REP(d)
		r.SetLocalCommID(local)
		r.SetRemoteCommID(remote)
		r.SetLocalQPN(peerQPN)
		r.SetStartingPSN(uint32(qpRQPSN))
		r.SetResponderResources(4)
		r.SetInitiatorDepth(4)
		r.SetRNRRetryCount(7)
	})
}

// ids returns a MAD of attr with the given local and remote
// communication ids (RTU, DREP, MRA, REJ, DREQ: the same offsets).
func ids(attr cm.AttrID, local, remote uint32, f func(d []byte)) []byte {
	return cmMAD(attr, 7, func(d []byte) {
		cm.RTU(d).SetLocalCommID(local)
		cm.RTU(d).SetRemoteCommID(remote)
		if f != nil {
			f(d)
		}
	})
}

// TestCMActiveForged: while a Dial waits for the REP, and once it is
// established, messages with the wrong ids or from the wrong address are
// counted unmatched and change nothing; the real ones go through.
func TestCMActiveForged(t *testing.T) {
	p := newPeer(t)
	req, res := p.dial(&ConnConfig{ResponseTimeout: 20})
	mine := cm.REQ(req.Data()).LocalCommID()
	if got := cm.REQ(req.Data()).Primary().LocalGID().Unmap(); got != engineAddr {
		t.Fatalf("REQ names %v as its sender", got)
	}
	p.forged("a REP for another id", p.addr, rep(req, peerCommID, mine+1))
	p.forged("a REP from another address", strayAddr, rep(req, peerCommID, mine))
	p.forged("an RTU to a dialing side", p.addr, ids(cm.AttrRTU, peerCommID, mine, nil))
	p.forged("a DREP with nothing to answer", p.addr, ids(cm.AttrDREP, peerCommID, mine, nil))
	p.forged("a REJ from another address", strayAddr, ids(cm.AttrREJ, 0, mine, func(d []byte) { cm.REJ(d).SetReason(cm.RejConsumerDefined) }))
	p.forged("a REJ for another id", p.addr, ids(cm.AttrREJ, 0, mine^1, func(d []byte) { cm.REJ(d).SetReason(cm.RejConsumerDefined) }))
	p.forged("an MRA of a REP", p.addr, ids(cm.AttrMRA, peerCommID, mine, func(d []byte) { cm.MRA(d).SetMessageMRAed(cm.MsgREP) }))
	p.forged("an MRA from another address", strayAddr, ids(cm.AttrMRA, peerCommID, mine, func(d []byte) { cm.MRA(d).SetMessageMRAed(cm.MsgREQ) }))
	before := p.unmatched()
	p.injectMAD(p.addr, ids(cm.AttrMRA, peerCommID, mine, func(d []byte) { cm.MRA(d).SetMessageMRAed(cm.MsgREQ) }))
	if p.unmatched() != before {
		t.Error("the peer's MRA of our REQ was counted unmatched")
	}
	pending(t, res, "Dial")
	if n := p.count(isMAD(cm.AttrRTU)); n != 0 {
		t.Fatalf("%d RTUs sent on forged REPs", n)
	}

	p.injectMAD(p.addr, rep(req, peerCommID, mine))
	p.expectMAD(cm.AttrRTU)
	r := result(t, res, "Dial")
	if r.err != nil {
		t.Fatal(r.err)
	}
	qp := r.c.QP()
	defer qp.Destroy()
	if qp.State() != StateRTS || qp.attr.DestQPN != peerQPN || qp.attr.Dest != p.addr || qp.attr.SQPSN != qpRQPSN {
		t.Fatalf("QP %v to %v QPN %#x from PSN %v", qp.State(), qp.attr.Dest, qp.attr.DestQPN, qp.attr.SQPSN)
	}
	// The REP again (our RTU lost) is answered with the RTU again; one
	// from another id or address is not.
	p.injectMAD(p.addr, rep(req, peerCommID, mine))
	p.expectMAD(cm.AttrRTU)
	p.forged("a REP of another peer id once established", p.addr, rep(req, peerCommID+1, mine))
	p.forged("a REP from another address once established", strayAddr, rep(req, peerCommID, mine))

	dreq := func(local, remote, qpn uint32) []byte {
		return ids(cm.AttrDREQ, local, remote, func(d []byte) { cm.DREQ(d).SetRemoteQPN(qpn) })
	}
	dreps := p.count(isMAD(cm.AttrDREP))
	p.forged("a DREQ for another QP", p.addr, dreq(peerCommID, mine, qp.QPN()+1))
	p.forged("a DREQ of another peer id", p.addr, dreq(peerCommID+1, mine, qp.QPN()))
	p.forged("a DREQ from another address", strayAddr, dreq(peerCommID, mine, qp.QPN()))
	p.forged("a REJ of another peer id", p.addr, ids(cm.AttrREJ, peerCommID+1, mine, nil))
	if qp.State() != StateRTS {
		t.Fatalf("QP %v after forged DREQs", qp.State())
	}
	select {
	case <-r.c.Done():
		t.Fatal("the connection ended on forged DREQs")
	default:
	}
	// Every DREQ is answered (the peer may have missed our DREP), to its
	// sender.
	if n := p.count(isMAD(cm.AttrDREP)) - dreps; n != 3 {
		t.Errorf("%d DREPs for 3 DREQs", n)
	}
	p.injectMAD(p.addr, dreq(peerCommID, mine, qp.QPN()))
	select {
	case <-r.c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the peer's DREQ did not end the connection within 10 s")
	}
	if qp.State() != StateErr || qp.status != fabric.StatusPeerClosed {
		t.Fatalf("QP %v (%v) after the peer's DREQ, want ERR (peer closed)", qp.State(), qp.status)
	}
}

// TestCMActiveRejected: the peer's REJ of our REQ fails the Dial with
// its reason and private data.
func TestCMActiveRejected(t *testing.T) {
	p := newPeer(t)
	req, res := p.dial(nil)
	mine := cm.REQ(req.Data()).LocalCommID()
	p.injectMAD(p.addr, ids(cm.AttrREJ, 0, mine, func(d []byte) {
		cm.REJ(d).SetReason(cm.RejConsumerDefined)
		copy(cm.REJ(d).PrivateData(), "go away")
	}))
	r := result(t, res, "Dial")
	var re *cm.RejectError
	if !errors.As(r.err, &re) || re.Reason != cm.RejConsumerDefined || string(re.PrivateData[:7]) != "go away" || !errors.Is(r.err, fabric.ErrRefused) {
		t.Fatalf("Dial: %v, want the peer's REJ", r.err)
	}
}

// TestCMMaxRetries: a REQ nobody answers is sent MaxRetries+1 times, then
// the Dial fails with cm.ErrTimeout and a REJ (timeout) goes out.
func TestCMMaxRetries(t *testing.T) {
	for _, n := range []uint8{1, 2} {
		p := newPeer(t)
		_, res := p.dial(&ConnConfig{ResponseTimeout: 8, MaxRetries: n}) // 1 ms
		r := result(t, res, "Dial")
		if !errors.Is(r.err, cm.ErrTimeout) {
			t.Fatalf("MaxRetries %d: Dial %v, want cm.ErrTimeout", n, r.err)
		}
		if got := p.count(isMAD(cm.AttrREQ)); got != int(n)+1 {
			t.Errorf("MaxRetries %d: the REQ went out %d times, want %d", n, got, n+1)
		}
		rej := p.expectMAD(cm.AttrREJ)
		if cm.REJ(rej.Data()).Reason() != cm.RejTimeout {
			t.Errorf("REJ reason %v, want timeout", cm.REJ(rej.Data()).Reason())
		}
		if s := p.e.CM().Stats(); s.Retransmits != uint64(n) {
			t.Errorf("MaxRetries %d: %d retransmissions counted", n, s.Retransmits)
		}
	}
}

// TestCMDialBounds: the private data of a REQ, and the MTU, at and past
// their bounds.
func TestCMDialBounds(t *testing.T) {
	p := newPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []ConnConfig{
		{PrivateData: make([]byte, cm.UserREQPrivateDataSize+1)},
		{MTU: 1000},
		{MTU: 8192},
	} {
		if _, err := p.e.CM().Dial(ctx, p.e.AllocPD(), netip.AddrPortFrom(p.addr, 7471), &c); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("Dial with %d bytes of private data, MTU %d: %v, want ErrInvalid", len(c.PrivateData), c.MTU, err)
		}
	}
	if n := p.count(isMAD(cm.AttrREQ)); n != 0 {
		t.Fatalf("%d REQs sent for invalid Dials", n)
	}
	data := make([]byte, cm.UserREQPrivateDataSize)
	data[len(data)-1] = 0x5a
	req, _ := p.dial(&ConnConfig{PrivateData: data, MTU: 4096})
	r := cm.REQ(req.Data())
	if r.PrivateData()[cm.CMAHeaderSize+len(data)-1] != 0x5a || r.PathMTU() != cm.MTU4096 {
		t.Fatalf("REQ private data ends %#x, MTU %v", r.PrivateData()[cm.REQPrivateDataSize-1], r.PathMTU())
	}
}

// peerREQ is a REQ from the peer for the engine's rdma_cm port.
func peerREQ(port uint16, commID, qpn uint32, f func(r cm.REQ)) []byte {
	return cmMAD(cm.AttrREQ, uint64(commID)<<8, func(d []byte) {
		r := cm.REQ(d)
		r.SetLocalCommID(commID)
		r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceTCP, port))
		r.SetLocalQPN(qpn)
		r.SetResponderResources(4)
		r.SetInitiatorDepth(4)
		r.SetRemoteCMResponseTimeout(20)
		r.SetTransportType(cm.TransportRC)
		r.SetStartingPSN(uint32(qpSQPSN))
		r.SetLocalCMResponseTimeout(20)
		r.SetRetryCount(3)
		r.SetPathMTU(cm.MTU1024)
		r.SetRNRRetryCount(7)
		r.SetMaxCMRetries(3)
		r.Primary().SetLocalGID(peerAddr)
		r.Primary().SetRemoteGID(engineAddr)
		r.Primary().SetLocalACKTimeout(14)
		cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(peerAddr, 40000), engineAddr)
		if f != nil {
			f(r)
		}
	})
}

// TestCMPassiveForged: a listener's connection in REP_SENT takes only the
// RTU with its ids from its peer; once established, only the DREQ naming
// its QP.
func TestCMPassiveForged(t *testing.T) {
	p := newPeer(t)
	l, err := p.e.CM().Listen(7471, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p.forged("a REQ naming another sender", strayAddr, peerREQ(7471, peerCommID, peerQPN, nil))
	p.injectMAD(p.addr, peerREQ(7471, peerCommID, peerQPN, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cr, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cr.RemoteAddr() != netip.MustParseAddrPort("127.0.0.2:40000") {
		t.Errorf("request from %v", cr.RemoteAddr())
	}
	res := make(chan dialResult, 1)
	go func() {
		data := make([]byte, cm.UserREPPrivateDataSize) // all the room there is
		copy(data, "welcome")
		data[len(data)-1] = 0x5a
		c, err := cr.Accept(ctx, p.e.AllocPD(), data)
		res <- dialResult{c, err}
	}()
	repMAD := p.expectMAD(cm.AttrREP)
	r := cm.REP(repMAD.Data())
	mine := r.LocalCommID()
	if r.RemoteCommID() != peerCommID || r.StartingPSN() == 0 || string(r.PrivateData()[:7]) != "welcome" || r.PrivateData()[cm.UserREPPrivateDataSize-1] != 0x5a {
		t.Fatalf("REP to %#x, PSN %d, data %q", r.RemoteCommID(), r.StartingPSN(), r.PrivateData()[:7])
	}
	// The REQ again (our REP lost) brings the REP again.
	p.injectMAD(p.addr, peerREQ(7471, peerCommID, peerQPN, nil))
	p.expectMAD(cm.AttrREP)

	p.forged("an RTU for another id", p.addr, ids(cm.AttrRTU, peerCommID, mine+1, nil))
	p.forged("an RTU of another peer id", p.addr, ids(cm.AttrRTU, peerCommID+1, mine, nil))
	p.forged("an RTU from another address", strayAddr, ids(cm.AttrRTU, peerCommID, mine, nil))
	p.forged("a REP to a listening side", p.addr, rep(repMAD, peerCommID, mine))
	p.forged("a DREP with nothing to answer", p.addr, ids(cm.AttrDREP, peerCommID, mine, nil))
	p.forged("an MRA of a REQ", p.addr, ids(cm.AttrMRA, peerCommID, mine, func(d []byte) { cm.MRA(d).SetMessageMRAed(cm.MsgREQ) }))
	p.forged("a REJ from another address", strayAddr, ids(cm.AttrREJ, peerCommID, mine, nil))
	pending(t, res, "Accept")

	p.injectMAD(p.addr, ids(cm.AttrRTU, peerCommID, mine, nil))
	a := result(t, res, "Accept")
	if a.err != nil {
		t.Fatal(a.err)
	}
	qp := a.c.QP()
	defer qp.Destroy()
	if qp.attr.DestQPN != peerQPN || qp.attr.SQPSN != qpSQPSN || qp.attr.RetryCnt != 3 || qp.attr.Timeout != 14 { // the REQ's
		t.Fatalf("accepted QP to %#x from PSN %v, retry %d, timeout %d", qp.attr.DestQPN, qp.attr.SQPSN, qp.attr.RetryCnt, qp.attr.Timeout)
	}
	p.forged("an RTU once established", p.addr, ids(cm.AttrRTU, peerCommID, mine, nil))
	dreq := func(local, remote, qpn uint32) []byte {
		return ids(cm.AttrDREQ, local, remote, func(d []byte) { cm.DREQ(d).SetRemoteQPN(qpn) })
	}
	p.forged("a DREQ for another QP", p.addr, dreq(peerCommID, mine, qp.QPN()^1))
	p.forged("a DREQ for another id", p.addr, dreq(peerCommID, mine^1, qp.QPN()))
	p.forged("a DREQ from another address", strayAddr, dreq(peerCommID, mine, qp.QPN()))
	if qp.State() != StateRTS {
		t.Fatalf("QP %v after forged DREQs", qp.State())
	}
	// A new QP of the same peer QP while this one lives: stale.
	p.injectMAD(p.addr, peerREQ(7471, peerCommID+5, peerQPN, nil))
	if j := p.expectMAD(cm.AttrREJ); cm.REJ(j.Data()).Reason() != cm.RejStaleConn {
		t.Errorf("a second REQ from a connected QP: REJ %v, want stale connection", cm.REJ(j.Data()).Reason())
	}
	p.expectMAD(cm.AttrDREQ) // and the old connection goes
}

// TestCMPassiveRefuses: REQs the listener must refuse, each answered by
// the REJ with its reason; and a full backlog.
func TestCMPassiveRefuses(t *testing.T) {
	p := newPeer(t)
	l, err := p.e.CM().Listen(7471, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i, c := range []struct {
		name string
		req  []byte
		want cm.RejectReason
	}{
		{"another port", peerREQ(7472, peerCommID+1, peerQPN+1, nil), cm.RejInvalidServiceID},
		{"the UDP port space", peerREQ(7471, peerCommID+2, peerQPN+2, func(r cm.REQ) {
			r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceUDP, 7471))
		}), cm.RejInvalidServiceID},
		{"UC", peerREQ(7471, peerCommID+3, peerQPN+3, func(r cm.REQ) { r.SetTransportType(cm.TransportUC) }), cm.RejInvalidTransportType},
		{"XRC", peerREQ(7471, peerCommID+4, peerQPN+4, func(r cm.REQ) { r[51] |= 1 }), cm.RejInvalidTransportType}, // extended transport type 1
		{"a bad rdma_cm header", peerREQ(7471, peerCommID+5, peerQPN+5, func(r cm.REQ) { r.PrivateData()[0] = 1 }), cm.RejConsumerDefined},
	} {
		before := p.count(isMAD(cm.AttrREJ))
		p.injectMAD(p.addr, c.req)
		if p.count(isMAD(cm.AttrREJ)) != before+1 {
			t.Errorf("%s: no REJ", c.name)
			continue
		}
		j := p.expectMAD(cm.AttrREJ)
		if got := cm.REJ(j.Data()); got.Reason() != c.want || got.RemoteCommID() != peerCommID+uint32(i)+1 {
			t.Errorf("%s: REJ %v to %#x, want %v", c.name, got.Reason(), got.RemoteCommID(), c.want)
		}
	}
	if s := p.e.CM().Stats(); s.Malformed[cm.ReasonCMAHeader] != 1 {
		t.Errorf("%d malformed rdma_cm headers counted, want 1", s.Malformed[cm.ReasonCMAHeader])
	}
	// The backlog holds one request; the second is refused.
	p.injectMAD(p.addr, peerREQ(7471, peerCommID+10, peerQPN+10, nil))
	p.injectMAD(p.addr, peerREQ(7471, peerCommID+11, peerQPN+11, nil))
	j := p.expectMAD(cm.AttrREJ)
	if got := cm.REJ(j.Data()); got.Reason() != cm.RejConsumerDefined || got.RemoteCommID() != peerCommID+11 {
		t.Errorf("backlog full: REJ %v to %#x, want consumer defined to %#x", got.Reason(), got.RemoteCommID(), peerCommID+11)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cr, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The REP's private data: at most cm.UserREPPrivateDataSize bytes.
	if _, err := cr.Accept(ctx, p.e.AllocPD(), make([]byte, cm.UserREPPrivateDataSize+1)); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("Accept with %d bytes of private data: %v, want ErrInvalid", cm.UserREPPrivateDataSize+1, err)
	}
	if err := cr.Reject(make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	j = p.expectMAD(cm.AttrREJ)
	if got := cm.REJ(j.Data()); got.Reason() != cm.RejConsumerDefined || got.RemoteCommID() != peerCommID+10 {
		t.Errorf("Reject: REJ %v to %#x", got.Reason(), got.RemoteCommID())
	}
}

// TestSIDRForged: while ResolveUD waits, SIDR_REPs for another request,
// from another address or for another service are counted unmatched;
// the real one resolves the service. A SIDR_REQ the listener cannot take
// is answered with its status.
func TestSIDRForged(t *testing.T) {
	p := newPeer(t)
	res := make(chan error, 1)
	var svc *UDService
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := p.e.CM().ResolveUD(ctx, p.e.AllocPD(), netip.AddrPortFrom(p.addr, 7174), &ConnConfig{ResponseTimeout: 20})
		svc = s
		res <- err
	}()
	req := p.expectMAD(cm.AttrSIDRReq)
	id := cm.SIDRReq(req.Data()).RequestID()
	sid := cm.RDMACMServiceID(cm.PortSpaceUDP, 7174)
	sidrRep := func(id uint32, sid cm.ServiceID) []byte {
		return cmMAD(cm.AttrSIDRRep, req.TID(), func(d []byte) {
			r := cm.SIDRRep(d)
			r.SetRequestID(id)
			r.SetServiceID(sid)
			r.SetQPN(peerQPN)
			r.SetQKey(RDMACMUDPQKey)
		})
	}
	p.forged("a SIDR_REP for another request", p.addr, sidrRep(id+1, sid))
	p.forged("a SIDR_REP from another address", strayAddr, sidrRep(id, sid))
	p.forged("a SIDR_REP for another service", p.addr, sidrRep(id, sid+1))
	select {
	case err := <-res:
		t.Fatalf("ResolveUD returned (%v) on forged SIDR_REPs", err)
	default:
	}
	p.injectMAD(p.addr, sidrRep(id, sid))
	select {
	case err := <-res:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ResolveUD did not return within 20 s of the SIDR_REP")
	}
	defer svc.QP().Destroy()
	if svc.RemoteQPN() != peerQPN || svc.QKey() != RDMACMUDPQKey {
		t.Fatalf("resolved QPN %#x Q_Key %#x", svc.RemoteQPN(), svc.QKey())
	}
	p.forged("the SIDR_REP again", p.addr, sidrRep(id, sid))

	// The listening side.
	l, err := p.e.CM().ListenUD(7174, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sidrReq := func(id uint32, port uint16, f func(r cm.SIDRReq)) []byte {
		return cmMAD(cm.AttrSIDRReq, 9, func(d []byte) {
			r := cm.SIDRReq(d)
			r.SetRequestID(id)
			r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceUDP, port))
			cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(peerAddr, 40001), engineAddr)
			if f != nil {
				f(r)
			}
		})
	}
	for _, c := range []struct {
		name string
		req  []byte
		want cm.SIDRStatus
	}{
		{"another port", sidrReq(1, 7175, nil), cm.SIDRUnsupported},
		{"the TCP port space", sidrReq(2, 7174, func(r cm.SIDRReq) { r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceTCP, 7174)) }), cm.SIDRUnsupported},
		{"a bad rdma_cm header", sidrReq(3, 7174, func(r cm.SIDRReq) { r.PrivateData()[1] = 0x50 }), cm.SIDRReject},
	} {
		p.injectMAD(p.addr, c.req)
		r := cm.SIDRRep(p.expectMAD(cm.AttrSIDRRep).Data())
		if r.Status() != c.want || r.RequestID() != cm.SIDRReq(cm.MAD(c.req).Data()).RequestID() {
			t.Errorf("%s: SIDR_REP %v for request %d, want %v", c.name, r.Status(), r.RequestID(), c.want)
		}
	}
}

// TestListenCMBadAddress: a listener on an address this host does not
// have fails with an error (the engine cannot bind it).
func TestListenCMBadAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := ListenCM(ctx, "rdmacm://192.0.2.1:7471", fabric.Options{})
	if err == nil {
		l.Close()
		t.Fatal("ListenCM on 192.0.2.1 (TEST-NET-1, not this host's) succeeded")
	}
}

// TestMalformedCounted: datagrams that do not parse, and GSI datagrams
// with the wrong transport (opcode, Q_Key) or a MAD of the wrong size,
// are dropped and counted where each is checked.
func TestMalformedCounted(t *testing.T) {
	p := newPeer(t)
	m := p.e.CM()
	mal := func() uint64 { return p.e.stats.Drops[fabric.DropMalformed].Load() }
	before := mal()
	injectRaw(p.e, p.addr, make([]byte, wire.BTHSize+wire.ICRCSize-4)) // too short for a BTH and an ICRC
	bad := make([]byte, wire.BTHSize+wire.ICRCSize)
	bad[0] = 0xff // no such opcode
	injectRaw(p.e, p.addr, bad)
	if d := mal() - before; d != 2 {
		t.Errorf("a short datagram and an unknown opcode: %d malformed drops, want 2", d)
	}
	mad := cmMAD(cm.AttrRTU, 1, nil)
	injectPacket(p.e, p.addr, &wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: gsiQPN},
		QKey: cm.GSIQKey ^ 1, SrcQP: gsiQPN}, mad)
	injectPacket(p.e, p.addr, &wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnlyWithImmediate, PKey: 0xffff, DestQP: gsiQPN},
		QKey: cm.GSIQKey, SrcQP: gsiQPN}, mad)
	injectPacket(p.e, p.addr, &wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCSendOnly, PKey: 0xffff, DestQP: gsiQPN}}, mad)
	p.injectMAD(p.addr, mad[:cm.MADSize-4])
	p.injectMAD(p.addr, append(mad, 0, 0, 0, 0))
	s := m.Stats()
	if s.Malformed[0] != 3 || s.Malformed[cm.ReasonSize] != 2 || s.RxMADs != 0 {
		t.Errorf("GSI datagrams with the wrong Q_Key, immediate, RC opcode, 252 and 260 bytes: malformed %v, %d taken; want 3 transport, 2 size, none taken",
			s.Malformed, s.RxMADs)
	}
	if d := mal() - before; d != 7 {
		t.Errorf("%d malformed drops in all, want 7", d)
	}
	p.injectMAD(p.addr, mad)
	if s := m.Stats(); s.RxMADs != 1 || s.Unmatched != 1 {
		t.Errorf("a valid RTU for nothing: %d taken, %d unmatched; want 1 and 1", s.RxMADs, s.Unmatched)
	}
}

// TestCMPrivateDataBounds: the private data of a SIDR_REQ and a
// SIDR_REP, at and one past their room.
func TestCMPrivateDataBounds(t *testing.T) {
	p := newPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.e.CM().ResolveUD(ctx, p.e.AllocPD(), netip.AddrPortFrom(p.addr, 7174),
		&ConnConfig{PrivateData: make([]byte, cm.UserSIDRReqPrivateDataSize+1)})
	if !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("ResolveUD with %d bytes of private data: %v, want ErrInvalid", cm.UserSIDRReqPrivateDataSize+1, err)
	}
	if n := p.count(isMAD(cm.AttrSIDRReq)); n != 0 {
		t.Fatalf("%d SIDR_REQs sent for an invalid ResolveUD", n)
	}
	l, err := p.e.CM().ListenUD(7174, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p.injectMAD(p.addr, cmMAD(cm.AttrSIDRReq, 3, func(d []byte) {
		r := cm.SIDRReq(d)
		r.SetRequestID(42)
		r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceUDP, 7174))
		cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(peerAddr, 40001), engineAddr)
	}))
	cr, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ud, err := p.e.AllocPD().CreateQP(QPConfig{Type: UD})
	if err != nil {
		t.Fatal(err)
	}
	defer ud.Destroy()
	if err := cr.AcceptUD(ud, 7, make([]byte, cm.SIDRRepPrivateDataSize+1)); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("AcceptUD with %d bytes of private data: %v, want ErrInvalid", cm.SIDRRepPrivateDataSize+1, err)
	}
	data := make([]byte, cm.SIDRRepPrivateDataSize)
	data[len(data)-1] = 0x5a
	if err := cr.AcceptUD(ud, 7, data); err != nil {
		t.Fatalf("AcceptUD with %d bytes of private data: %v", len(data), err)
	}
	r := cm.SIDRRep(p.expectMAD(cm.AttrSIDRRep).Data())
	if r.Status() != cm.SIDRSuccess || r.RequestID() != 42 || r.QPN() != ud.QPN() || r.PrivateData()[len(data)-1] != 0x5a {
		t.Fatalf("SIDR_REP %v for %d, QPN %#x, private data ends %#x", r.Status(), r.RequestID(), r.QPN(), r.PrivateData()[len(data)-1])
	}
}
