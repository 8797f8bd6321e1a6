package roce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/cm"
	"github.com/weft-io/weft/roce/link"
)

// goodbyeMAD is a goodbye from the QP numbered from to the QP numbered
// to (see sendGoodbye).
func goodbyeMAD(from, to uint32) []byte {
	b := cm.MAD(make([]byte, cm.MADSize))
	b.Init(cm.AttrDREQ, 7)
	d := cm.DREQ(b.Data())
	d.SetLocalCommID(from)
	d.SetRemoteQPN(to)
	return b
}

// unusedQPN returns a QPN of e's block, near near, that names no QP.
func unusedQPN(e *Engine, near uint32) uint32 {
	e.objMu.RLock()
	defer e.objMu.RUnlock()
	base := near &^ (link.QPNBlockSize - 1)
	for i := uint32(1); ; i++ {
		q := base | (near+i*97)&(link.QPNBlockSize-1)
		if _, used := e.qps[q]; !used && q > 1 {
			return q
		}
	}
}

// TestGoodbye: closing an endpoint made by the exchange tells the peer at
// once: its QP fails with fabric.StatusPeerClosed, its receives and the
// event say fabric.ErrPeerClosed. A goodbye that names a QP not
// connected to its sender, from the wrong address or for the wrong QP, is
// dropped and counted, and the QP goes on.
func TestGoodbye(t *testing.T) {
	a, b := fabrictest.ListenPair(t, "roce", "127.0.0.1:0", nil)
	defer a.Close()
	defer b.Close() // closed below; here too if the test stops before
	qa, qb := a.(*Endpoint).QP(), b.(*Endpoint).QP()
	e := qa.e
	// The engine is the process's for 127.0.0.1: count from here.
	sent, taken, unmatched := e.goodbyes.sent.Load(), e.goodbyes.received.Load(), e.goodbyes.unmatched.Load()
	local := netip.MustParseAddr("127.0.0.1")
	inject(e, local, goodbyeMAD(qb.QPN()+1, qa.QPN()))                          // not a's peer
	inject(e, netip.MustParseAddr("127.0.0.9"), goodbyeMAD(qb.QPN(), qa.QPN())) // a's peer's QPN from elsewhere
	inject(e, local, goodbyeMAD(qb.QPN(), unusedQPN(e, qa.QPN())))              // no such QP
	if u, r := e.goodbyes.unmatched.Load()-unmatched, e.goodbyes.received.Load()-taken; u != 3 || r != 0 {
		t.Fatalf("forged goodbyes: %d unmatched, %d taken; want 3 and 0", u, r)
	}
	if e.QPNBlock() != 0 { // a shared port's engine: another engine's goodbye is not dropped
		foreign, drops := e.goodbyes.foreign.Load(), e.Stats().Drops[fabric.DropOther]
		inject(e, local, goodbyeMAD(qb.QPN(), qa.QPN()^link.QPNBlockSize))
		if f, d := e.goodbyes.foreign.Load()-foreign, e.Stats().Drops[fabric.DropOther]-drops; f != 1 || d != 0 {
			t.Errorf("a goodbye for another engine's block: %d counted as foreign, %d dropped; want 1 and 0", f, d)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pd := b.(*Endpoint).pd
	sendRecv(t, ctx, qb, qa, pd, a.(*Endpoint).pd, "still up")

	b.Close()
	if got := e.goodbyes.sent.Load() - sent; got != 1 {
		t.Errorf("%d goodbyes sent, want 1", got)
	}
	buf, _ := a.Alloc(64, fabric.AccessLocalWrite)
	_, err := a.RecvWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}})
	if !errors.Is(err, fabric.ErrPeerClosed) || !errors.Is(err, fabric.ErrPeerGone) {
		t.Fatalf("receive after the peer's Close: %v; want ErrPeerClosed (and ErrPeerGone)", err)
	}
	for gone := false; !gone; {
		select {
		case ev := <-a.Events():
			if gone = ev.Kind == fabric.EventPeerGone; gone && !errors.Is(ev.Err, fabric.ErrPeerClosed) {
				t.Errorf("peer-gone event: %v, want ErrPeerClosed", ev.Err)
			}
		case <-ctx.Done():
			t.Fatal("no peer-gone event")
		}
	}
	if got := e.goodbyes.received.Load() - taken; got != 1 {
		t.Errorf("%d goodbyes taken, want 1", got)
	}
}

// TestGoodbyeSharedPort: on a port that several engines share (the
// processes of a host, here three engines of one process), a goodbye
// reaches the engine that owns the QP it names: steered there by the
// port's eBPF program (raw=0), or seen by every raw socket and taken by
// the owner only (raw=1). QPs on the first two engines fail with
// fabric.ErrPeerClosed when their peers on the third say goodbye. Two
// owners make the test certain: goodbyes left to the kernel's choice all
// go to one socket (they share their addresses and ports), so at least
// one would be lost. No engine drops anything.
func TestGoodbyeSharedPort(t *testing.T) {
	testenv.RequireRoot(t)
	for _, noRaw := range []bool{true, false} {
		t.Run(fmt.Sprintf("raw=%v", !noRaw), func(t *testing.T) {
			host, _ := testHosts()
			addr := netip.MustParseAddrPort(host + ":4791")
			var es [3]*Engine
			for i := range es {
				e, err := NewEngine(EngineConfig{Addr: addr, NoRaw: noRaw})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if !e.link.(*link.UDPLink).Shared() {
					testenv.SkipOrFail(t, "the port is not shared (no steering program)")
				}
				es[i] = e
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, owner := range es[:2] {
				a, b, _, _ := connect(t, owner, es[2], QPConfig{}, QPAttr{})
				b.sendGoodbye()
				buf, _ := a.pd.RegMR(make([]byte, 64), fabric.AccessLocalWrite)
				_, err := a.RecvWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(buf)}}})
				if !errors.Is(err, fabric.ErrPeerClosed) {
					t.Fatalf("receive on engine %d after the peer's goodbye: %v, want ErrPeerClosed", owner.QPNBlock(), err)
				}
			}
			for i, e := range es {
				if d := e.Stats().Drops[fabric.DropOther]; d != 0 || e.goodbyes.unmatched.Load() != 0 {
					t.Errorf("engine %d dropped %d packets, %d goodbyes unmatched", i, d, e.goodbyes.unmatched.Load())
				}
			}
		})
	}
}

// TestGoodbyeAcksFirst: a message the closing side took in is
// acknowledged before the goodbye, so the peer's send of it completes
// successfully rather than flushed by the goodbye (the acknowledgement
// is otherwise held back for ackDelay).
//
// Over UDP, and over the automatic link, where both go through the
// peer's ring (here the engine's own: the pair shares it): a goodbye sent
// on UDP would overtake the acknowledgement there.
func TestGoodbyeAcksFirst(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0?link=udp", shmAddr().String() + ":0"} {
		t.Run(addr, func(t *testing.T) { goodbyeAcksFirst(t, addr) })
	}
}

func goodbyeAcksFirst(t *testing.T, addr string) {
	for i := range 20 {
		a, b := fabrictest.ListenPair(t, "roce", addr, nil)
		if want := map[bool]string{true: "udp", false: "shm"}[strings.Contains(addr, "link=udp")]; a.Caps().Path != want {
			t.Fatalf("Caps().Path = %q, want %s", a.Caps().Path, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sbuf, _ := b.Alloc(64, 0)
		if _, err := b.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(sbuf)}, Flags: fabric.FlagSignal}}); err != nil {
			t.Fatal(err)
		}
		rbuf, _ := a.Alloc(64, fabric.AccessLocalWrite)
		if _, err := a.RecvWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(rbuf)}}}); err != nil {
			t.Fatal(err)
		}
		a.Close()
		out := make([]fabric.Completion, 1)
		n, err := b.CQ().Wait(ctx, out)
		cancel()
		b.Close()
		if err != nil || n != 1 || out[0].Status != fabric.StatusOK {
			t.Fatalf("round %d: the send the peer received and closed after completed %d, %v, %v; want StatusOK", i, n, out[0].Status, err)
		}
	}
}
