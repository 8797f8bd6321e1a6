package roce

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
)

// udQP creates a UD QP with rdma_cm's Q_Key that sends to dest/qpn.
func udQP(t *testing.T, pd *PD, dest netip.Addr, qpn uint32) *QP {
	t.Helper()
	qp, err := pd.CreateQP(QPConfig{Type: UD})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Connect(&QPAttr{PathMTU: 1024, Dest: dest, DestQPN: qpn, QKey: RDMACMUDPQKey}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Destroy() })
	return qp
}

// TestCMSIDR resolves a UD service as udaddy does: SIDR_REQ, SIDR_REP
// with the server's QPN and Q_Key, a datagram carrying the client's QPN
// as immediate data, and the server's reply to it.
func TestCMSIDR(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ea, eb, _ := enginePair(t, link.Port, link.LossConfig{})
	l, err := eb.CM().ListenUD(7174, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pa, pb := ea.AllocPD(), eb.AllocPD()
	srv := udQP(t, pb, ea.LocalAddr(), 0)
	go func() {
		r, err := l.Next(ctx)
		if err == nil {
			err = r.AcceptUD(srv, RDMACMUDPQKey, []byte("ud ok"))
		}
		if err != nil {
			t.Error(err)
		}
	}()
	s, err := ea.CM().ResolveUD(ctx, pa, netip.MustParseAddrPort("127.0.0.2:7174"), &ConnConfig{PrivateData: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.QP().Destroy()
	if s.RemoteQPN() != srv.QPN() || s.QKey() != RDMACMUDPQKey || string(s.PrivateData()[:5]) != "ud ok" {
		t.Fatalf("resolved QPN %#x Q_Key %#x data %q", s.RemoteQPN(), s.QKey(), s.PrivateData()[:8])
	}
	sendRecvImm := func(from, to *QP, fromPD, toPD *PD, imm uint32) uint32 {
		buf := make([]byte, 100)
		src, _ := fromPD.RegMR(buf, fabric.AccessLocalWrite)
		if _, err := from.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 100}}, Imm: imm, Flags: fabric.FlagImm}}); err != nil {
			t.Fatal(err)
		}
		in := make([]byte, 256)
		dst, _ := toPD.RegMR(in, fabric.AccessLocalWrite)
		m := []fabric.Message{{SGEs: []fabric.SGE{{Region: dst, Length: len(in)}}}}
		if _, err := to.RecvWait(ctx, m); err != nil {
			t.Fatal(err)
		}
		if m[0].Len != 100 || m[0].Flags&fabric.FlagImm == 0 {
			t.Fatalf("received %d bytes, flags %v", m[0].Len, m[0].Flags)
		}
		return m[0].Imm
	}
	clientQPN := sendRecvImm(s.QP(), srv, pa, pb, s.QP().QPN())
	// The server answers from another UD QP, to the QPN the client named.
	reply := udQP(t, pb, ea.LocalAddr(), clientQPN)
	sendRecvImm(reply, s.QP(), pb, pa, 0)

	// Nobody on another port: the SIDR_REP says unsupported.
	_, err = ea.CM().ResolveUD(ctx, pa, netip.MustParseAddrPort("127.0.0.2:9"), nil)
	var se *cm.SIDRError
	if !errors.Is(err, fabric.ErrRefused) || !errors.As(err, &se) || se.Status != cm.SIDRUnsupported {
		t.Fatal("resolve with nobody listening:", err)
	}
	// The listener rejects.
	go func() {
		if r, err := l.Next(ctx); err == nil {
			r.Reject(nil)
		}
	}()
	_, err = ea.CM().ResolveUD(ctx, pa, netip.MustParseAddrPort("127.0.0.2:7174"), nil)
	if !errors.As(err, &se) || se.Status != cm.SIDRReject {
		t.Fatal("rejected resolve:", err)
	}
	// No answer at all.
	_, err = ea.CM().ResolveUD(ctx, pa, netip.MustParseAddrPort("127.0.0.3:7174"), &ConnConfig{ResponseTimeout: 8, MaxRetries: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("resolve with nobody there:", err)
	}
}
