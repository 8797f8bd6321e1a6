package roce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
	"github.com/weft-io/weft/roce/wire"
)

// cmPair starts two engines (127.0.0.1 dials, 127.0.0.2 listens on
// rdma_cm port 7471) and their CMs.
func cmPair(t *testing.T, loss link.LossConfig, cfg *ConnConfig) (*Engine, *Engine, *CMListener) {
	t.Helper()
	ea, eb, _ := enginePair(t, link.Port, loss)
	l, err := eb.CM().Listen(7471, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return ea, eb, l
}

// acceptOne accepts one request in the background.
func acceptOne(t *testing.T, ctx context.Context, l *CMListener, pd *PD, data []byte) <-chan *Conn {
	out := make(chan *Conn, 1)
	go func() {
		defer close(out)
		r, err := l.Next(ctx)
		if err != nil {
			t.Error("Next:", err)
			return
		}
		c, err := r.Accept(ctx, pd, data)
		if err != nil {
			t.Error("Accept:", err)
			return
		}
		out <- c
	}()
	return out
}

func sendRecv(t *testing.T, ctx context.Context, from, to *QP, pdFrom, pdTo *PD, msg string) {
	t.Helper()
	src, err := pdFrom.RegMR([]byte(msg), fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := from.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: len(msg)}}}}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	dst, _ := pdTo.RegMR(buf, fabric.AccessLocalWrite)
	in := []fabric.Message{{SGEs: []fabric.SGE{{Region: dst, Length: len(buf)}}}}
	if _, err := to.RecvWait(ctx, in); err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:in[0].Len]); got != msg {
		t.Fatalf("received %q, want %q", got, msg)
	}
}

func TestCMConnectDisconnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ea, eb, l := cmPair(t, link.LossConfig{}, &ConnConfig{ResponderResources: 4, InitiatorDepth: 8})
	pa, pb := ea.AllocPD(), eb.AllocPD()
	accepted := acceptOne(t, ctx, l, pb, []byte("welcome"))
	ca, err := ea.CM().Dial(ctx, pa, netip.MustParseAddrPort("127.0.0.2:7471"), &ConnConfig{PrivateData: []byte("hello"), ResponderResources: 16, InitiatorDepth: 2})
	if err != nil {
		t.Fatal(err)
	}
	cb := testenv.Recv(t, accepted, "the Accept")
	if cb == nil {
		t.FailNow()
	}
	if !bytes.HasPrefix(ca.PrivateData(), []byte("welcome\x00")) || len(ca.PrivateData()) != cm.REPPrivateDataSize {
		t.Errorf("dialer got private data %q", ca.PrivateData()[:16])
	}
	if !bytes.HasPrefix(cb.PrivateData(), []byte("hello\x00")) || len(cb.PrivateData()) != cm.UserREQPrivateDataSize {
		t.Errorf("listener got private data %q", cb.PrivateData()[:16])
	}
	if cb.RemoteAddr() != ca.LocalAddr() || ca.RemoteAddr() != netip.MustParseAddrPort("127.0.0.2:7471") || cb.LocalAddr().Port() != 7471 {
		t.Errorf("addresses: %v %v %v %v", ca.LocalAddr(), ca.RemoteAddr(), cb.LocalAddr(), cb.RemoteAddr())
	}
	// Negotiation: the dialer reads at most what the listener answers
	// (4), the listener at most what the dialer answers (16) and wants (8).
	if ca.c.depth != 2 || cb.c.depth != 8 || cb.c.rr != 2 || ca.c.rr != 8 {
		t.Errorf("negotiated: dialer depth %d rr %d, listener depth %d rr %d", ca.c.depth, ca.c.rr, cb.c.depth, cb.c.rr)
	}
	// Each side sends from the PSN the other advertised (Linux's reading
	// of the REQ's and REP's starting PSN).
	if ca.QP().attr.SQPSN != cb.c.psn || cb.QP().attr.SQPSN != ca.c.psn || ca.QP().attr.RQPSN != ca.c.psn {
		t.Errorf("PSNs: dialer sends from %v and expects %v, listener sends from %v and expects %v",
			ca.QP().attr.SQPSN, ca.c.psn, cb.QP().attr.SQPSN, cb.c.psn)
	}
	if ca.QP().State() != StateRTS || cb.QP().State() != StateRTS {
		t.Fatalf("QP states %v %v", ca.QP().State(), cb.QP().State())
	}
	sendRecv(t, ctx, ca.QP(), cb.QP(), pa, pb, "over rdma_cm")
	sendRecv(t, ctx, cb.QP(), ca.QP(), pb, pa, "and back")

	if err := ca.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cb.Done():
	case <-ctx.Done():
		t.Fatal("listener side did not see the DREQ")
	}
	gone := false
	for !gone {
		select {
		case ev := <-cb.QP().Events():
			gone = ev.Kind == fabric.EventPeerGone
		case <-ctx.Done():
			t.Fatal("no EventPeerGone")
		}
	}
	if err := cb.Disconnect(ctx); err != nil {
		t.Fatal("Disconnect after the peer's:", err)
	}
	ca.QP().Destroy()
	cb.QP().Destroy()
	sa, sb := ea.CM().Stats(), eb.CM().Stats()
	if sa.Unmatched+sb.Unmatched != 0 || sa.Malformed != sb.Malformed || sa.RxMADs != 2 || sb.RxMADs != 3 {
		t.Errorf("stats %+v %+v", sa, sb)
	}
}

func TestCMRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ea, _, l := cmPair(t, link.LossConfig{}, nil)
	_, err := ea.CM().Dial(ctx, ea.AllocPD(), netip.MustParseAddrPort("127.0.0.2:9999"), nil)
	var re *cm.RejectError
	if !errors.Is(err, fabric.ErrRefused) || !errors.As(err, &re) || re.Reason != cm.RejInvalidServiceID {
		t.Fatalf("dial with nobody listening: %v", err)
	}
	// The application rejects, with private data.
	go func() {
		r, err := l.Next(ctx)
		if err == nil {
			err = r.Reject([]byte("go away"))
		}
		if err != nil {
			t.Error(err)
		}
	}()
	_, err = ea.CM().Dial(ctx, ea.AllocPD(), netip.MustParseAddrPort("127.0.0.2:7471"), nil)
	if !errors.Is(err, fabric.ErrRefused) || !errors.As(err, &re) || re.Reason != cm.RejConsumerDefined || !bytes.HasPrefix(re.PrivateData, []byte("go away")) {
		t.Fatalf("rejected dial: %v", err)
	}
	// A closed listener refuses too.
	l.Close()
	if _, err := l.Next(ctx); !errors.Is(err, os.ErrClosed) {
		t.Fatal("Next after Close:", err)
	}
	_, err = ea.CM().Dial(ctx, ea.AllocPD(), netip.MustParseAddrPort("127.0.0.2:7471"), nil)
	if !errors.Is(err, fabric.ErrRefused) {
		t.Fatal("dial to a closed listener:", err)
	}
}

func TestCMTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ea, _, _ := cmPair(t, link.LossConfig{}, nil)
	// Nobody at 127.0.0.3: REQ, two retries 4 ms apart, then time out.
	start := time.Now()
	_, err := ea.CM().Dial(ctx, ea.AllocPD(), netip.MustParseAddrPort("127.0.0.3:7471"), &ConnConfig{ResponseTimeout: 10, MaxRetries: 2})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fabric.ErrRefused) {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 3*cm.Timeout(10) {
		t.Errorf("gave up after %v", d)
	}
	if s := ea.CM().Stats(); s.Retransmits != 2 || s.TxMADs != 4 { // REQ, 2 retries, REJ
		t.Errorf("stats %+v", s)
	}
	// A cancelled context ends the dial too.
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer ccancel()
	_, err = ea.CM().Dial(cctx, ea.AllocPD(), netip.MustParseAddrPort("127.0.0.3:7471"), nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

// TestCMLossy connects and disconnects through links that drop and
// duplicate datagrams: the CM's retries and duplicate handling must hold.
func TestCMLossy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ea, eb, l := cmPair(t, link.LossConfig{Drop: 0.2, Duplicate: 0.1, Seed: 7}, &ConnConfig{ResponseTimeout: 12, MaxRetries: 15})
	pa, pb := ea.AllocPD(), eb.AllocPD()
	for i := 0; i < 8; i++ {
		accepted := acceptOne(t, ctx, l, pb, nil)
		ca, err := ea.CM().Dial(ctx, pa, netip.MustParseAddrPort("127.0.0.2:7471"), &ConnConfig{ResponseTimeout: 12, MaxRetries: 15})
		if err != nil {
			t.Fatal(i, err)
		}
		cb := testenv.Recv(t, accepted, "the Accept")
		if cb == nil {
			t.FailNow()
		}
		sendRecv(t, ctx, ca.QP(), cb.QP(), pa, pb, "lossy")
		if err := ca.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
		testenv.Recv(t, cb.Done(), "the accepted side's end after Disconnect")
		ca.QP().Destroy()
		cb.QP().Destroy()
	}
}

// TestCMBadInput feeds the listener's CM malformed MADs, forged messages
// and a flood of random REQs; all are dropped or answered and counted,
// and a legitimate connection still goes through.
func TestCMBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ea, eb, l := cmPair(t, link.LossConfig{}, nil)
	src := netip.MustParseAddr("127.0.0.1")
	m := eb.CM()
	good := cm.MAD(make([]byte, cm.MADSize))
	good.Init(cm.AttrRTU, 1)
	// Malformed: truncated, wrong class, wrong version, unknown attribute.
	inject(eb, src, good[:100])
	for _, f := range []func(b []byte){
		func(b []byte) { b[1] = 0x04 },
		func(b []byte) { b[0] = 2 },
		func(b []byte) { b[2] = 1 },
		func(b []byte) { b[17] = 0x19 },
	} {
		b := bytes.Clone(good)
		f(b)
		inject(eb, src, b)
	}
	// Forged: REP, RTU, DREP and DREQ for connections that never existed.
	for _, a := range []cm.AttrID{cm.AttrREP, cm.AttrRTU, cm.AttrDREP, cm.AttrMRA, cm.AttrREJ, cm.AttrDREQ} {
		b := cm.MAD(make([]byte, cm.MADSize))
		b.Init(a, 9)
		binary.BigEndian.PutUint32(b.Data()[4:], 0x12345678)
		inject(eb, src, b)
	}
	s := m.Stats()
	if s.Malformed[cm.ReasonSize] != 1 || s.Malformed[cm.ReasonClass] != 1 || s.Malformed[cm.ReasonBaseVersion] != 1 ||
		s.Malformed[cm.ReasonClassVersion] != 1 || s.Malformed[cm.ReasonAttribute] != 1 || s.Unmatched != 6 {
		t.Fatalf("stats after bad input: %+v", s)
	}
	// A flood of random REQs: every one is answered or dropped, none
	// panics, and none blocks the legitimate connection below. REQs
	// naming the listener's port take backlog slots until they time out;
	// use another port for most of them.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 10000; i++ {
		b := cm.MAD(make([]byte, cm.MADSize))
		b.Init(cm.AttrREQ, rng.Uint64())
		for j := range b.Data() {
			b.Data()[j] = byte(rng.Uint32())
		}
		r := cm.REQ(b.Data())
		r.SetPathMTU(cm.MTU(1 + rng.IntN(5)))
		if i%3 == 0 {
			r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceTCP, uint16(rng.IntN(7000))))
		}
		if i%7 == 0 {
			r.Primary().SetLocalGID(src)
		}
		b.Data()[43] &^= 6 // transport RC
		inject(eb, src, b)
	}
	accepted := acceptOne(t, ctx, l, eb.AllocPD(), nil)
	ca, err := ea.CM().Dial(ctx, ea.AllocPD(), netip.MustParseAddrPort("127.0.0.2:7471"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cb := testenv.Recv(t, accepted, "the Accept"); cb == nil {
		t.FailNow()
	}
	ca.Disconnect(ctx)
}

// TestCMConcurrent dials 64 connections at once into one listener.
func TestCMConcurrent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	qcfg := QPConfig{RecvBuffer: 1 << 16, MaxMsgSize: 1024, SQDepth: 16, InlineSize: 64}
	ea, eb, l := cmPair(t, link.LossConfig{}, &ConnConfig{QP: qcfg})
	const n = 64
	pa, pb := ea.AllocPD(), eb.AllocPD()
	var wg sync.WaitGroup
	acc := make(chan *Conn, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			r, err := l.Next(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := r.Accept(ctx, pb, nil)
				if err != nil {
					t.Error(err)
					return
				}
				acc <- c
			}()
		}
	}()
	dialed := make(chan *Conn, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := ea.CM().Dial(ctx, pa, netip.MustParseAddrPort("127.0.0.2:7471"), &ConnConfig{QP: qcfg})
			if err != nil {
				t.Error(err)
				return
			}
			dialed <- c
		}()
	}
	testenv.Await(t, "the dials and the accepts", wg.Wait)
	close(dialed)
	close(acc)
	if len(dialed) != n || len(acc) != n {
		t.Fatalf("%d dialed, %d accepted", len(dialed), len(acc))
	}
	for c := range dialed {
		c.Disconnect(ctx)
		c.QP().Destroy()
	}
	for c := range acc {
		testenv.Recv(t, c.Done(), "the accepted side's end after Disconnect")
		c.QP().Destroy()
	}
}

// TestCMPeerVanishes: a peer that sends a REQ and then goes silent. The
// REP is retried and Accept fails with cm.ErrTimeout; the QP is released.
func TestCMPeerVanishes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, eb, l := cmPair(t, link.LossConfig{}, &ConnConfig{ResponseTimeout: 10, MaxRetries: 3})
	ghost := netip.MustParseAddr("127.0.0.3") // no engine there
	b := cm.MAD(make([]byte, cm.MADSize))
	b.Init(cm.AttrREQ, 77)
	r := cm.REQ(b.Data())
	r.SetLocalCommID(0xabcd)
	r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceTCP, 7471))
	r.SetLocalQPN(0x42)
	r.SetStartingPSN(5)
	r.SetPathMTU(cm.MTU1024)
	r.SetRemoteCMResponseTimeout(10)
	r.SetMaxCMRetries(3)
	r.Primary().SetLocalGID(ghost)
	r.Primary().SetRemoteGID(eb.LocalAddr())
	cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(ghost, 40000), eb.LocalAddr())
	inject(eb, ghost, b)
	req, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if req.RemoteAddr() != netip.AddrPortFrom(ghost, 40000) {
		t.Errorf("request from %v", req.RemoteAddr())
	}
	// The same REQ again (the peer's retry) is a duplicate, not a second
	// request.
	inject(eb, ghost, b)
	_, err = req.Accept(ctx, eb.AllocPD(), nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept with a vanished peer: %v", err)
	}
	if s := eb.CM().Stats(); s.Retransmits != 3 {
		t.Errorf("stats %+v", s)
	}
	select {
	case r2 := <-l.q:
		t.Fatalf("duplicate REQ queued as a new request from %v", r2.RemoteAddr())
	default:
	}
	eb.CM().mu.Lock()
	n := len(eb.CM().conns)
	eb.CM().mu.Unlock()
	if n != 0 {
		t.Errorf("%d connections left", n)
	}
}

// FuzzCMInput feeds arbitrary CM datagrams (the MAD) from a peer to an
// engine whose CM listens on rdma_cm port 7471 (TCP) and 7174 (UDP), and
// has a connection of its own pending. Nothing may panic, and every
// datagram is either taken or counted.
func FuzzCMInput(f *testing.F) {
	e, err := NewEngine(EngineConfig{Link: discardLink{netip.MustParseAddrPort("127.0.0.1:4791")}})
	if err != nil {
		f.Fatal(err)
	}
	defer e.Close()
	m := e.CM()
	l, _ := m.Listen(7471, 4, &ConnConfig{ResponseTimeout: 4, MaxRetries: 1})
	ul, _ := m.ListenUD(7174, 4, nil)
	defer l.Close()
	defer ul.Close()
	peer := netip.MustParseAddr("127.0.0.2")
	pd := e.AllocPD()
	go m.Dial(context.Background(), pd, netip.AddrPortFrom(peer, 7471), &ConnConfig{ResponseTimeout: 20, MaxRetries: 1})
	for _, s := range seedCMMADs(peer) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		before := m.Stats()
		inject(e, peer, b)
		after := m.Stats()
		var mal uint64
		for i := range after.Malformed {
			mal += after.Malformed[i] - before.Malformed[i]
		}
		if len(b) == cm.MADSize && after.RxMADs == before.RxMADs && mal == 0 {
			t.Fatal("a 256-byte datagram was neither taken nor counted as malformed")
		}
		// Drain requests so the backlogs never fill for good.
		for _, q := range []chan *ConnRequest{l.q, ul.q} {
			select {
			case r := <-q:
				r.Reject(nil)
			default:
			}
		}
	})
}

// seedCMMADs returns one plausible MAD of each kind from peer.
func seedCMMADs(peer netip.Addr) [][]byte {
	var out [][]byte
	for a := cm.AttrREQ; a <= cm.AttrSIDRRep; a++ {
		b := cm.MAD(make([]byte, cm.MADSize))
		b.Init(a, 1)
		switch a {
		case cm.AttrREQ:
			r := cm.REQ(b.Data())
			r.SetLocalCommID(5)
			r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceTCP, 7471))
			r.SetPathMTU(cm.MTU1024)
			r.Primary().SetLocalGID(peer)
			cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(peer, 9), netip.MustParseAddr("127.0.0.1"))
		case cm.AttrSIDRReq:
			r := cm.SIDRReq(b.Data())
			r.SetRequestID(6)
			r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceUDP, 7174))
			cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(peer, 9), netip.MustParseAddr("127.0.0.1"))
		}
		out = append(out, b)
	}
	return out
}

// TestCMStaleConnection: a REQ from the QP of an established connection
// (its peer restarted and reused the QPN) is rejected as stale, and the
// old connection is disconnected.
func TestCMStaleConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ea, eb, l := cmPair(t, link.LossConfig{}, nil)
	pa, pb := ea.AllocPD(), eb.AllocPD()
	accepted := acceptOne(t, ctx, l, pb, nil)
	ca, err := ea.CM().Dial(ctx, pa, netip.MustParseAddrPort("127.0.0.2:7471"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cb := testenv.Recv(t, accepted, "the Accept")
	if cb == nil {
		t.FailNow()
	}
	src := ea.LocalAddr()
	b := cm.MAD(make([]byte, cm.MADSize))
	b.Init(cm.AttrREQ, 99)
	r := cm.REQ(b.Data())
	r.SetLocalCommID(0x5ca1ab1e)
	r.SetServiceID(cm.RDMACMServiceID(cm.PortSpaceTCP, 7471))
	r.SetLocalQPN(ca.QP().QPN())
	r.SetPathMTU(cm.MTU1024)
	r.Primary().SetLocalGID(src)
	cm.CMAHeader(r.PrivateData()).Set(netip.AddrPortFrom(src, 1), eb.LocalAddr())
	inject(eb, src, b)
	for _, c := range []*Conn{ca, cb} {
		select {
		case <-c.Done():
		case <-ctx.Done():
			t.Fatal("the stale connection was not disconnected")
		}
	}
	select {
	case r := <-l.q:
		t.Fatalf("stale REQ queued from %v", r.RemoteAddr())
	default:
	}
}

// TestGSIDropAllocs: dropping a malformed or unmatched MAD allocates
// nothing, so a flood of them costs no garbage.
func TestGSIDropAllocs(t *testing.T) {
	e, err := NewEngine(EngineConfig{Link: discardLink{netip.MustParseAddrPort("127.0.0.1:4791")}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m := e.CM()
	src := netip.MustParseAddr("127.0.0.2")
	mk := func(payload []byte) wire.Packet {
		b := make([]byte, 512)
		n, _ := wire.Build(b, &wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: 1}, QKey: cm.GSIQKey, SrcQP: 1}, payload)
		p, err := wire.Parse(b[:n])
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := mk(make([]byte, 100))
	rtu := cm.MAD(make([]byte, cm.MADSize))
	rtu.Init(cm.AttrRTU, 1)
	unmatched := mk(rtu)
	n := testing.AllocsPerRun(200, func() {
		e.gsiInput(&bad, src)
		e.gsiInput(&unmatched, src)
	})
	if n != 0 {
		t.Errorf("%v allocations per dropped MAD pair", n)
	}
	if s := m.Stats(); s.Malformed[cm.ReasonSize] < 200 || s.Unmatched < 200 {
		t.Errorf("stats %+v", s)
	}
}

// TestCMACKTimeout pins the local ACK timeouts of an rdma_cm connection
// (issue 28): by default the REQ asks for Linux rdma_cm's 19 (2.1 s) and
// both QPs use it; the accepting QP takes the REQ's value, raised to the
// listener's own only when the listener sets one; an address's timeout=
// still wins over the default.
func TestCMACKTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ea, eb, _ := enginePair(t, link.Port, link.LossConfig{})
	pa, pb := ea.AllocPD(), eb.AllocPD()
	for i, tc := range []struct {
		dial, listen    uint8 // ConnConfig.ACKTimeout of each side (0: default)
		req, dialer, lq uint8 // the REQ's, the dialer's QP's and the listener's QP's
	}{
		{0, 0, 19, 19, 19},
		{14, 0, 14, 14, 14},
		{14, 20, 14, 14, 20},
		{21, 16, 21, 21, 21},
	} {
		port := uint16(7480 + i)
		l, err := eb.CM().Listen(port, 0, &ConnConfig{ACKTimeout: tc.listen})
		if err != nil {
			t.Fatal(err)
		}
		accepted := acceptOne(t, ctx, l, pb, nil)
		ca, err := ea.CM().Dial(ctx, pa, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port), &ConnConfig{ACKTimeout: tc.dial})
		if err != nil {
			t.Fatal(err)
		}
		cb := testenv.Recv(t, accepted, "the Accept")
		if cb == nil {
			t.FailNow()
		}
		if cb.c.remoteAck != tc.req || ca.QP().attr.Timeout != tc.dialer || cb.QP().attr.Timeout != tc.lq {
			t.Errorf("dial %d, listen %d: REQ asks %d, dialer's QP %d, listener's QP %d; want %d, %d, %d", tc.dial, tc.listen,
				cb.c.remoteAck, ca.QP().attr.Timeout, cb.QP().attr.Timeout, tc.req, tc.dialer, tc.lq)
		}
		ca.Disconnect(ctx)
		ca.QP().Destroy()
		cb.QP().Destroy()
		l.Close()
	}
	// A REQ asking for no timeout gets the default on the accepting side.
	var def ConnConfig
	if d := def.withDefaults(); d.acceptACKTimeout(0) != DefaultCMACKTimeout {
		t.Errorf("a REQ asking for 0: %d, want %d", d.acceptACKTimeout(0), DefaultCMACKTimeout)
	}

	// An rdma_cm address: without timeout= the CM's default, not the
	// exchange's 12; with it, its value.
	for addr, want := range map[string]uint8{
		"rdmacm://127.0.0.2:7471":                       DefaultCMACKTimeout,
		"127.0.0.2:7471?cm=1":                           DefaultCMACKTimeout,
		"rdmacm://127.0.0.2:7471?timeout=12":            12,
		"rdmacm://listen:127.0.0.2:7471?timeout=14":     14,
		"rdmacm://listen:127.0.0.2:7471?mtu=1024&rnr=3": DefaultCMACKTimeout,
	} {
		o, _, err := parseCMAddr(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		if c := o.connConfig(fabric.Options{}).withDefaults(); c.ACKTimeout != want {
			t.Errorf("%s: ACK timeout %d, want %d", addr, c.ACKTimeout, want)
		}
	}
	if o, err := ParseAddr("127.0.0.2:18515"); err != nil || o.Timeout != 12 {
		t.Errorf("the exchange's default timeout: %d (%v), want 12", o.Timeout, err)
	}
}
