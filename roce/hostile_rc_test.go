package roce

import (
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/wire"
)

// Tests of the RC rules a peer can break, played by a hostile peer (see
// hostile_test.go): forged acknowledgements, finite retry counts run
// out, and requests at and beside every bound.

// TestForgedACKs: acknowledgements a peer cannot send (of a PSN never
// sent, for another QP, from another address, of an unknown type) change
// nothing; the real one then completes the send.
func TestForgedACKs(t *testing.T) {
	p := newPeer(t)
	// (A timer that would fail the QP only after seconds: it must stop
	// once nothing is outstanding.)
	qp, pd := p.rcQP(QPConfig{}, QPAttr{Timeout: 14, RetryCnt: 7})
	postSend(t, qp, pd, 300, 'a', 1) // two packets at MTU 256: PSNs 500 and 501
	p.expect("the send's last packet", isOpPSN(wire.OpRCSendLast, qpSQPSN+1))

	ackOK := wire.ACKSyndrome(wire.CreditsInvalid)
	p.ack(qp, qpSQPSN+2, ackOK) // a PSN never sent (one past the last)
	noCompletion(t, qp, "an ACK of PSN 502, never sent")
	p.ack(qp, qpSQPSN+0x7fffff, ackOK) // far beyond
	noCompletion(t, qp, "an ACK of a PSN half the space away")
	p.ack(qp, qpSQPSN-2, ackOK) // stale: before the first PSN
	noCompletion(t, qp, "an ACK of PSN 498, before the first sent")

	// Another QP number: the engine has no such QP.
	other := p.e.stats.Drops[fabric.DropOther].Load()
	p.inject(&wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCAcknowledge, PKey: 0xffff, DestQP: unusedQPN(p.e, qp.QPN()), PSN: qpSQPSN + 1},
		Syndrome: ackOK}, nil)
	if d := p.e.stats.Drops[fabric.DropOther].Load() - other; d != 1 {
		t.Errorf("an ACK for no QP: %d drops counted, want 1", d)
	}
	// The right QP, from a third address.
	mal := drops(qp, fabric.DropMalformed)
	injectPacket(p.e, strayAddr, &wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpRCAcknowledge, PKey: 0xffff, DestQP: qp.QPN(),
		PSN: qpSQPSN + 1}, Syndrome: ackOK}, nil)
	// A UD opcode on an RC QP.
	p.inject(&wire.Fields{BTH: wire.BTHFields{OpCode: wire.OpUDSendOnly, PKey: 0xffff, DestQP: qp.QPN(), PSN: qpSQPSN + 1},
		QKey: 1, SrcQP: peerQPN}, []byte("x"))
	// The reserved acknowledgement type.
	p.ack(qp, qpSQPSN+1, wire.Syndrome(2<<5))
	if d := drops(qp, fabric.DropMalformed) - mal; d != 3 {
		t.Errorf("an ACK from another address, a UD SEND and a reserved ACK type: %d malformed drops, want 3", d)
	}
	noCompletion(t, qp, "forged acknowledgements")
	if qp.State() != StateRTS {
		t.Fatalf("QP %v after forged acknowledgements", qp.State())
	}

	// The ACK of the first packet only does not complete the message.
	p.ack(qp, qpSQPSN, ackOK)
	noCompletion(t, qp, "an ACK of the first of two packets")
	// The ACK of exactly the last PSN sent does.
	p.ack(qp, qpSQPSN+1, ackOK)
	if c := completion(t, qp, "the send"); c.Status != fabric.StatusOK || c.Context != 1 {
		t.Fatalf("completion %+v, want context 1 ok", c)
	}
	// Nothing is outstanding: no retransmission timer runs (one would
	// spend the retries of an idle QP).
	qp.mu.Lock()
	armed := !qp.deadline.IsZero()
	qp.mu.Unlock()
	if armed {
		t.Fatal("the retransmission timer runs with nothing outstanding")
	}
}

// TestForgedNAKs: a sequence NAK the requester must not act on (stale,
// or for a PSN it has not sent) sends nothing again; one in range
// rewinds to its PSN. Every fatal NAK fails the QP with its own status.
func TestForgedNAKs(t *testing.T) {
	p := newPeer(t)
	qp, pd := p.rcQP(QPConfig{}, QPAttr{})
	postSend(t, qp, pd, 3*256, 'a', 1) // PSNs 500, 501, 502
	p.expect("the last packet", isOpPSN(wire.OpRCSendLast, qpSQPSN+2))
	first := isOpPSN(wire.OpRCSendFirst, qpSQPSN)
	seq := wire.NAKSyndrome(wire.NAKPSNSequenceError)

	// (A sequence NAK of PSN 503 would acknowledge all three: the peer
	// expects 503.)
	p.ack(qp, qpSQPSN+4, seq) // not sent yet: nothing to resend
	p.ack(qp, qpSQPSN-1, seq) // stale
	noCompletion(t, qp, "sequence NAKs of PSNs 504 and 499")
	if n := p.count(first); n != 1 {
		t.Fatalf("sequence NAKs of PSNs 504 and 499: the first packet sent %d times, want once", n)
	}
	p.ack(qp, qpSQPSN+1, seq) // the peer lost 501: resend 501 and 502, not 500
	p.expect("the middle packet sent again", isOpPSN(wire.OpRCSendMiddle, qpSQPSN+1))
	p.expect("the last packet sent again", isOpPSN(wire.OpRCSendLast, qpSQPSN+2))
	if n := p.count(first); n != 1 {
		t.Fatalf("sequence NAK of PSN 501: the first packet sent %d times, want once", n)
	}
	p.ack(qp, qpSQPSN+2, wire.ACKSyndrome(wire.CreditsInvalid))
	if c := completion(t, qp, "the send"); c.Status != fabric.StatusOK {
		t.Fatalf("completion %+v", c)
	}

	for _, c := range []struct {
		code wire.NAKCode
		want fabric.Status
	}{
		{wire.NAKRemoteAccessError, fabric.StatusRemoteAccess},
		{wire.NAKRemoteOperationalError, fabric.StatusRemoteOp},
		{wire.NAKInvalidRequest, fabric.StatusRemoteInvalid},
		{wire.NAKInvalidRDRequest, fabric.StatusRemoteInvalid},
	} {
		p := newPeer(t)
		qp, pd := p.rcQP(QPConfig{}, QPAttr{})
		postSend(t, qp, pd, 8, 'b', 2)
		p.expect("the send", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
		p.ack(qp, qpSQPSN, wire.NAKSyndrome(c.code))
		if got := completion(t, qp, "the send NAKed "+c.code.String()); got.Status != c.want {
			t.Errorf("NAK %v: completion status %v, want %v", c.code, got.Status, c.want)
		}
		if qp.State() != StateErr {
			t.Errorf("NAK %v: QP %v, want ERR", c.code, qp.State())
		}
	}
}

// TestRetryCountRunsOut: a requester whose peer never answers sends a
// request exactly RetryCnt+1 times, then fails it with
// StatusRetryExceeded; with RetryCnt 0, once.
func TestRetryCountRunsOut(t *testing.T) {
	for _, n := range []uint8{0, 1, 2} {
		p := newPeer(t)
		qp, pd := p.rcQP(QPConfig{}, QPAttr{Timeout: 1, RetryCnt: n})
		postSend(t, qp, pd, 8, 'r', 3)
		c := completion(t, qp, "a send nobody acknowledges")
		if c.Status != fabric.StatusRetryExceeded || !errors.Is(c.Err(), fabric.ErrPeerGone) {
			t.Fatalf("RetryCnt %d: completion %+v, want retry exceeded", n, c)
		}
		if got := p.count(isOpPSN(wire.OpRCSendOnly, qpSQPSN)); got != int(n)+1 {
			t.Errorf("RetryCnt %d: the request went out %d times, want %d", n, got, n+1)
		}
		if qp.State() != StateErr {
			t.Errorf("RetryCnt %d: QP %v, want ERR", n, qp.State())
		}
	}
}

// TestRetryCountRestartsOnProgress: an acknowledgement that advances
// restores the retry count: with RetryCnt 1, a second message still gets
// its retry after the first needed one.
func TestRetryCountRestartsOnProgress(t *testing.T) {
	p := newPeer(t)
	qp, pd := p.rcQP(QPConfig{}, QPAttr{Timeout: 1, RetryCnt: 1})
	// The timers stop once the retry is out, so that the ACK below comes
	// before the retry count runs out, however slow the host.
	sent := 0
	p.link.freezeAfter(func(pk *wire.Packet) bool {
		if pk.OpCode() == wire.OpRCSendOnly && pk.BTH.PSN() == qpSQPSN {
			sent++
		}
		return sent == 2
	})
	postSend(t, qp, pd, 8, 'a', 1)
	p.expect("the first send", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
	p.expect("the first send again", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
	p.ack(qp, qpSQPSN, wire.ACKSyndrome(wire.CreditsInvalid))
	if c := completion(t, qp, "the first send"); c.Status != fabric.StatusOK {
		t.Fatalf("first send: %+v", c)
	}
	p.link.thaw()
	postSend(t, qp, pd, 8, 'b', 2)
	c := completion(t, qp, "the second send")
	if c.Status != fabric.StatusRetryExceeded {
		t.Fatalf("second send: %+v, want retry exceeded", c)
	}
	if got := p.count(isOpPSN(wire.OpRCSendOnly, qpSQPSN+1)); got != 2 {
		t.Errorf("the second send went out %d times, want 2 (RetryCnt 1, restored by the first's ACK)", got)
	}
}

// TestRNRRetryRunsOut: with RNRRetry n (0-6) the requester takes n RNR
// NAKs, each followed by a retransmission, and fails the request with
// StatusRNRRetryExceeded at the next; with 7 it retries for ever.
func TestRNRRetryRunsOut(t *testing.T) {
	rnr := wire.RNRNAKSyndrome(1) // 10 µs
	for _, n := range []uint8{0, 1, 2, 7} {
		p := newPeer(t)
		qp, pd := p.rcQP(QPConfig{}, QPAttr{RNRRetry: n}) // Timeout 0: no retransmission timer
		postSend(t, qp, pd, 8, 'r', 3)
		naks := int(n)
		if n == 7 {
			naks = 12
		}
		for i := 0; i <= naks; i++ {
			p.expect("transmission "+itoa(i+1)+" of the send", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
			noCompletion(t, qp, "RNR NAK "+itoa(i)+" of RNRRetry "+itoa(int(n)))
			p.ack(qp, qpSQPSN, rnr)
		}
		if n == 7 {
			p.expect("the send after 13 RNR NAKs", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
			p.ack(qp, qpSQPSN, wire.ACKSyndrome(wire.CreditsInvalid))
			if c := completion(t, qp, "the send"); c.Status != fabric.StatusOK {
				t.Fatalf("RNRRetry 7: completion %+v, want ok", c)
			}
			continue
		}
		c := completion(t, qp, "a send RNR NAKed "+itoa(naks+1)+" times")
		if c.Status != fabric.StatusRNRRetryExceeded {
			t.Fatalf("RNRRetry %d: completion %+v, want RNR retry exceeded", n, c)
		}
		if got := p.count(isOpPSN(wire.OpRCSendOnly, qpSQPSN)); got != naks+1 {
			t.Errorf("RNRRetry %d: the request went out %d times, want %d", n, got, naks+1)
		}
	}
}

// TestResponderSequence: a request ahead of the expected PSN is NAKed once
// per gap and counted; a duplicate is acknowledged again and not
// delivered twice; the request at the expected PSN is taken.
func TestResponderSequence(t *testing.T) {
	p := newPeer(t)
	qp, _ := p.rcQP(QPConfig{}, QPAttr{})
	seqDrops := drops(qp, fabric.DropSequence)
	p.request(qp, wire.OpRCSendOnly, qpRQPSN+1, wire.Fields{}, []byte("ahead"))
	p.request(qp, wire.OpRCSendOnly, qpRQPSN+2, wire.Fields{}, []byte("ahead"))
	if d := drops(qp, fabric.DropSequence) - seqDrops; d != 2 {
		t.Errorf("two requests ahead: %d sequence drops, want 2", d)
	}
	nak := p.expect("a sequence NAK", isAck(wire.AckTypeNAK, wire.NAKPSNSequenceError))
	if nak.BTH.PSN() != qpRQPSN {
		t.Errorf("sequence NAK for PSN %v, want %v", nak.BTH.PSN(), qpRQPSN)
	}
	if n := p.count(isAck(wire.AckTypeNAK, wire.NAKPSNSequenceError)); n != 1 {
		t.Errorf("%d sequence NAKs for one gap, want 1", n)
	}
	p.request(qp, wire.OpRCSendOnly, qpRQPSN, wire.Fields{}, []byte("first"))
	p.request(qp, wire.OpRCSendOnly, qpRQPSN, wire.Fields{}, []byte("again"))
	ack := p.expect("the ACK of the duplicate", isAck(wire.AckTypeACK, 0))
	if ack.BTH.PSN() != qpRQPSN {
		t.Errorf("duplicate acknowledged with PSN %v, want %v", ack.BTH.PSN(), qpRQPSN)
	}
	if d := drops(qp, fabric.DropDuplicate); d != 1 {
		t.Errorf("%d duplicates counted, want 1", d)
	}
	if got := received(t, qp); len(got) != 1 || got[0] != "first" {
		t.Fatalf("received %q, want just \"first\"", got)
	}
}

func mustReg(t testing.TB, qp *QP, b []byte) *fabric.Region {
	t.Helper()
	r, err := qp.pd.RegMR(b, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAckReqPlacement: the requester asks for an acknowledgement (AckReq)
// on the last packet of a burst and of a signaled message, and not on
// the others: a peer acknowledges cumulatively, and an unasked ACK costs
// it a packet.
func TestAckReqPlacement(t *testing.T) {
	p := newPeer(t)
	qp, pd := p.rcQP(QPConfig{}, QPAttr{})
	mr, _ := pd.RegMR(make([]byte, 600), 0)
	msg := func(n int, flags fabric.MsgFlags) fabric.Message {
		return fabric.Message{SGEs: []fabric.SGE{{Region: mr, Length: n}}, Flags: flags}
	}
	post := func(ms ...fabric.Message) {
		if n, err := qp.Send(ms); n != len(ms) || err != nil {
			t.Fatalf("Send: %d of %d, %v", n, len(ms), err)
		}
	}
	post(msg(8, 0), msg(8, 0))                                 // PSNs 500, 501
	post(msg(8, fabric.FlagSignal), msg(600, 0))               // 502; 503-505
	post(msg(8, fabric.FlagSignal), msg(8, fabric.FlagSignal)) // 506, 507
	want := []bool{false, true, true, false, false, true, true, true}
	for i, w := range want {
		pk := p.expect("request PSN "+itoa(500+i), func(pk *wire.Packet) bool { return pk.BTH.PSN() == qpSQPSN.Add(i) })
		if pk.BTH.AckReq() != w {
			t.Errorf("PSN %d (%v): AckReq %v, want %v", 500+i, pk.OpCode(), pk.BTH.AckReq(), w)
		}
	}
}

// TestReleaseViewsBounds: ReleaseViews takes 0 to the number of views
// outstanding.
func TestReleaseViewsBounds(t *testing.T) {
	p := newPeer(t)
	qp, _ := p.rcQP(QPConfig{}, QPAttr{})
	p.request(qp, wire.OpRCSendOnly, qpRQPSN, wire.Fields{}, []byte("one"))
	p.request(qp, wire.OpRCSendOnly, qpRQPSN+1, wire.Fields{}, []byte("two"))
	views := make([]fabric.View, 4)
	if n, err := qp.RecvViews(views); n != 2 || err != nil {
		t.Fatalf("RecvViews: %d, %v; want 2", n, err)
	}
	for _, n := range []int{-1, 3} {
		if err := qp.ReleaseViews(n); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("ReleaseViews(%d) with 2 outstanding: %v, want ErrInvalid", n, err)
		}
	}
	if err := qp.ReleaseViews(0); err != nil || qp.OutstandingViews() != 2 {
		t.Fatalf("ReleaseViews(0): %v, %d outstanding", err, qp.OutstandingViews())
	}
	if err := qp.ReleaseViews(2); err != nil || qp.OutstandingViews() != 0 {
		t.Fatalf("ReleaseViews(2): %v, %d outstanding", err, qp.OutstandingViews())
	}
	if err := qp.ReleaseViews(1); !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("ReleaseViews(1) with none outstanding: %v", err)
	}
}

// TestPostBounds: what a post takes, at and one past each limit: SGEs per
// message, the UD message size (the MTU), the RC message size
// (MaxMsgSize).
func TestPostBounds(t *testing.T) {
	p := newPeer(t)
	qp, pd := p.rcQP(QPConfig{MaxMsgSize: 1000}, QPAttr{})
	mr, _ := pd.RegMR(make([]byte, 2048), 0)
	sges := func(n, each int) []fabric.SGE {
		s := make([]fabric.SGE, n)
		for i := range s {
			s[i] = fabric.SGE{Region: mr, Offset: i * each, Length: each}
		}
		return s
	}
	for _, c := range []struct {
		name string
		sges []fabric.SGE
		err  error
	}{
		{"32 SGEs", sges(maxSGE, 1), nil},
		{"33 SGEs", sges(maxSGE+1, 1), fabric.ErrMessageSize},
		{"MaxMsgSize", sges(1, 1000), nil},
		{"MaxMsgSize+1", sges(1, 1001), fabric.ErrMessageSize},
	} {
		n, err := qp.Send([]fabric.Message{{SGEs: c.sges}})
		if c.err == nil && (n != 1 || err != nil) || c.err != nil && (n != 0 || !errors.Is(err, c.err)) {
			t.Errorf("RC send of %s: %d posted, %v; want error %v", c.name, n, err, c.err)
		}
	}
	ud, err := pd.CreateQP(QPConfig{Type: UD})
	if err != nil {
		t.Fatal(err)
	}
	defer ud.Destroy()
	if err := ud.Connect(&QPAttr{PathMTU: 512, Dest: p.addr, DestQPN: peerQPN, QKey: 1}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		n  int
		ok bool
	}{{512, true}, {513, false}} {
		n, err := ud.Send([]fabric.Message{{SGEs: sges(1, c.n)}})
		if c.ok && (n != 1 || err != nil) || !c.ok && !errors.Is(err, fabric.ErrMessageSize) {
			t.Errorf("UD send of %d bytes at MTU 512: %d posted, %v", c.n, n, err)
		}
	}
}

// TestInlineBound: a SEND of at most InlineSize bytes is copied when it is
// posted (a retransmission carries what was posted, whatever the buffer
// holds since); one byte more is read from the buffer when sent.
func TestInlineBound(t *testing.T) {
	const inline = 64
	for _, c := range []struct {
		n    int
		want byte // what the retransmission carries
	}{{inline - 1, 'a'}, {inline, 'a'}, {inline + 1, 'b'}} {
		p := newPeer(t)
		qp, pd := p.rcQP(QPConfig{InlineSize: inline}, QPAttr{}) // no timer: the NAK below resends
		mr := postSend(t, qp, pd, c.n, 'a', 1)
		if first := p.expect("the send", isOpPSN(wire.OpRCSendOnly, qpSQPSN)); first.Payload[0] != 'a' {
			t.Fatalf("%d bytes: sent %q", c.n, first.Payload[0])
		}
		for i := range mr.Bytes() {
			mr.Bytes()[i] = 'b'
		}
		p.ack(qp, qpSQPSN, wire.NAKSyndrome(wire.NAKPSNSequenceError))
		retry := p.expect("the send again", isOpPSN(wire.OpRCSendOnly, qpSQPSN))
		if retry.Payload[0] != c.want || retry.Payload[c.n-1] != c.want {
			t.Errorf("%d bytes, InlineSize %d: the retransmission carries %q...%q, want %q", c.n, inline,
				retry.Payload[0], retry.Payload[c.n-1], c.want)
		}
	}
}

// TestTimeoutProbeHoldsFlight: after a retransmission timeout with more
// than minWindow packets outstanding, the requester resends only the
// first minWindow (the probe) and holds back the rest of the flight: an
// ACK within the probe sends nothing beyond it. (A responder that only
// stalled has the flight; resending it all doubles the load that stalled
// it.)
func TestTimeoutProbeHoldsFlight(t *testing.T) {
	p := newPeer(t)
	qp, pd := p.rcQP(QPConfig{}, QPAttr{Timeout: 1, RetryCnt: 7})
	const n = 20
	first := func(pk *wire.Packet) bool { return pk.BTH.PSN() == qpSQPSN && pk.OpCode() == wire.OpRCSendFirst }
	sent := 0
	p.link.freezeAfter(func(pk *wire.Packet) bool { // stop the timers at the first retransmission
		if first(pk) {
			sent++
		}
		return sent == 2
	})
	postSend(t, qp, pd, n*256, 'f', 1) // PSNs 500-519
	p.expect("the flight", isOpPSN(wire.OpRCSendLast, qpSQPSN+n-1))
	p.expect("the probe after the timeout", first)
	probeEnd := qpSQPSN.Add(minWindow) // 508: the first PSN after the probe
	p.expect("the end of the probe", func(pk *wire.Packet) bool { return pk.BTH.PSN() == probeEnd-1 })
	atEnd := func(pk *wire.Packet) bool { return pk.BTH.PSN() == probeEnd }
	if c := p.count(atEnd); c != 1 {
		t.Fatalf("PSN %v sent %d times by the timeout, want once (the original)", probeEnd, c)
	}
	p.ack(qp, qpSQPSN, wire.ACKSyndrome(wire.CreditsInvalid)) // within the probe
	if c := p.count(atEnd); c != 1 {
		t.Fatalf("an ACK within the probe: PSN %v sent %d times, want once (held back)", probeEnd, c)
	}
	p.ack(qp, qpSQPSN+n-1, wire.ACKSyndrome(wire.CreditsInvalid))
	if c := completion(t, qp, "the send"); c.Status != fabric.StatusOK {
		t.Fatalf("completion %+v", c)
	}
	p.link.thaw()
}

// TestViewEpochReset: a QP moved to RESET forgets its receive ring's
// positions, and its next connection writes its messages over the memory
// of views still outstanding: ViewEpoch must change (fabric/sock checks
// it after copying from the views it holds).
func TestViewEpochReset(t *testing.T) {
	p := newPeer(t)
	qp, _ := p.rcQP(QPConfig{}, QPAttr{})
	p.request(qp, wire.OpRCSendOnly, qpRQPSN, wire.Fields{}, []byte("one"))
	views := make([]fabric.View, 1)
	if n, err := qp.RecvViews(views); n != 1 || err != nil {
		t.Fatalf("RecvViews: %d, %v; want 1", n, err)
	}
	e0 := qp.ViewEpoch()
	if err := qp.Modify(StateReset, nil); err != nil {
		t.Fatal(err)
	}
	if e := qp.ViewEpoch(); e == e0 {
		t.Fatalf("ViewEpoch is still %d after RESET, with a view outstanding", e)
	}
}
