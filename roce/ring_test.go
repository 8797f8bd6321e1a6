package roce

import (
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/testenv"
)

// TestRingGrowth checks the receive and inline rings, which start at
// initRing bytes and grow on demand: inline SENDs posted faster than
// they complete (the caller's buffer rewritten after every Send), and
// then messages of many sizes received as views that are all held while
// the receive ring grows under them, arrive intact, and the views taken
// before a growth still read their own bytes after it.
func TestRingGrowth(t *testing.T) {
	x, y := rcPair(t, "keepalive=0")
	rings := func(ep *Endpoint) (int, int) {
		ep.qp.mu.Lock()
		defer ep.qp.mu.Unlock()
		return len(ep.qp.rq), len(ep.qp.inlineBuf)
	}
	for _, ep := range []*Endpoint{x, y} {
		if rq, il := rings(ep); rq != initRing || il != initRing {
			t.Fatalf("new QP: receive ring %d, inline ring %d bytes; want %d", rq, il, initRing)
		}
	}
	ctx := testenv.Context(t)
	const slot = 40 << 10
	src, _ := x.Alloc(100*slot, 0)
	size := func(i int) int { return 1 + (i*7919)%slot }
	pattern := func(i int, b []byte) {
		for j := range b {
			b[j] = byte(i + j*13)
		}
	}
	check := func(i int, got []byte) {
		t.Helper()
		want := make([]byte, size(i))
		pattern(i, want)
		if string(got) != string(want) {
			t.Fatalf("message %d: %d bytes, not the %d sent", i, len(got), len(want))
		}
	}
	views := make([]fabric.View, 128)
	recvViews := func(n int) []fabric.View {
		var got []fabric.View
		for len(got) < n {
			k, err := y.RecvViewsWait(ctx, views[:min(len(views), n-len(got))])
			if err != nil {
				t.Fatalf("RecvViewsWait after %d of %d views: %v", len(got), n, err)
			}
			got = append(got, views[:k]...)
		}
		return got
	}

	// Phase 1: one burst of 200 inline SENDs of 1000 bytes, posted under
	// one hold of the QP lock, so that all 200 KB of inline copies are
	// in the ring at once; the sources are overwritten as soon as Send
	// returns.
	const ninl, isz = 200, 1000
	burst := make([]fabric.Message, ninl)
	for i := range burst {
		pattern(i, src.Bytes()[i*isz:(i+1)*isz])
		burst[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Offset: i * isz, Length: isz}}}
	}
	if n, err := x.Send(burst); n != ninl || err != nil {
		t.Fatalf("inline burst: %d of %d, %v", n, ninl, err)
	}
	clear(src.Bytes()[:ninl*isz])
	if _, il := rings(x); il < ninl*isz {
		t.Errorf("inline ring %d bytes after a burst of %d KB of inline sends", il, ninl*isz/1000)
	}
	for i, v := range recvViews(ninl) {
		want := make([]byte, isz)
		pattern(i, want)
		if string(v.Data) != string(want) {
			t.Fatalf("inline message %d differs", i)
		}
	}
	y.ReleaseViews(ninl)

	// Phase 2: 100 messages of up to 40 KiB (about 2 MB), each from its
	// own slot, all received as views and held.
	const nmsg = 100
	for i := range nmsg {
		n := size(i)
		pattern(i, src.Bytes()[i*slot:i*slot+n])
		if k, err := x.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Offset: i * slot, Length: n}}}}); k != 1 || err != nil {
			t.Fatalf("send %d: %d, %v", i, k, err)
		}
	}
	held := recvViews(nmsg)
	if rq, _ := rings(y); rq < 2<<20 {
		t.Errorf("receive ring %d bytes while holding about 2 MB of views", rq)
	}
	for i, v := range held {
		check(i, v.Data)
	}
	if err := y.ReleaseViews(nmsg); err != nil {
		t.Fatal(err)
	}
}
