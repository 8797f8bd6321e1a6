package roce

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
	"github.com/weft-io/weft/roce/link"
)

// autoCounts returns the counters of ep's engine's automatic link.
func autoCounts(t testing.TB, ep *Endpoint) link.AutoCounts {
	t.Helper()
	a := ep.qp.e.auto
	if a == nil {
		t.Fatalf("the engine at %v has no automatic link", ep.qp.e.local)
	}
	return a.Counts()
}

// udpBothWays checks that a and b report the UDP path and that a
// ping-pong between them moves no datagram through counted's rings
// (what says what it would mean).
func udpBothWays(t testing.TB, a, b, counted *Endpoint, what string) {
	t.Helper()
	if pa, pb := a.Caps().Path, b.Caps().Path; pa != "udp" || pb != "udp" {
		t.Fatalf("Caps().Path = %q and %q, want udp and udp", pa, pb)
	}
	c0 := autoCounts(t, counted)
	pingPongN(t, a, b, 10)
	if c := autoCounts(t, counted); c.ShmTx != c0.ShmTx || c.ShmRx != c0.ShmRx {
		t.Fatalf("%s: %+v -> %+v", what, c0, c)
	}
}

// pingPongN sends n messages from a to b and back, one at a time.
func pingPongN(t testing.TB, a, b *Endpoint, n int) {
	t.Helper()
	ctx := testenv.Context(t)
	ra, err := a.Alloc(256, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Alloc(256, fabric.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	// Each side's receive half and send half of its region.
	recvA := []fabric.Message{{SGEs: []fabric.SGE{{Region: ra, Length: 128}}}}
	recvB := []fabric.Message{{SGEs: []fabric.SGE{{Region: rb, Length: 128}}}}
	for i := range n {
		copy(ra.Bytes()[128:], []byte{byte(i), 'p', 'i', 'n', 'g'})
		if _, err := a.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: ra, Offset: 128, Length: 5}}}}); err != nil {
			t.Fatalf("a.SendWait %d: %v", i, err)
		}
		if _, err := b.RecvWait(ctx, recvB); err != nil || !bytes.Equal(rb.Bytes()[:recvB[0].Len], []byte{byte(i), 'p', 'i', 'n', 'g'}) {
			t.Fatalf("b.RecvWait %d: %v %q", i, err, rb.Bytes()[:recvB[0].Len])
		}
		copy(rb.Bytes()[128:], []byte{byte(i), 'p', 'o', 'n', 'g'})
		if _, err := b.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{{Region: rb, Offset: 128, Length: 5}}}}); err != nil {
			t.Fatalf("b.SendWait %d: %v", i, err)
		}
		if _, err := a.RecvWait(ctx, recvA); err != nil || !bytes.Equal(ra.Bytes()[:recvA[0].Len], []byte{byte(i), 'p', 'o', 'n', 'g'}) {
			t.Fatalf("a.RecvWait %d: %v %q", i, err, ra.Bytes()[:recvA[0].Len])
		}
	}
}

// TestAutoShm: two Weft endpoints of this host with the default link
// (link=auto), each engine owning the ring of its address, agree on shared
// memory in the exchange, say so in Caps.Path, and their messages go
// through the rings both ways, not UDP.
func TestAutoShm(t *testing.T) {
	a, b := loopPair(t, "", "", nil)
	for _, ep := range []*Endpoint{a, b} {
		if p := ep.Caps().Path; p != "shm" {
			t.Fatalf("Caps().Path = %q, want shm (rings: %v, %v)", p, a.qp.e.shmRing(), b.qp.e.shmRing())
		}
	}
	ca0, cb0 := autoCounts(t, a), autoCounts(t, b)
	pingPongN(t, a, b, 20)
	ca, cb := autoCounts(t, a), autoCounts(t, b)
	if ca.ShmTx-ca0.ShmTx < 20 || cb.ShmTx-cb0.ShmTx < 20 || ca.ShmRx-ca0.ShmRx < 20 || cb.ShmRx-cb0.ShmRx < 20 {
		t.Fatalf("20 round trips moved a %+v -> %+v, b %+v -> %+v: want at least 20 datagrams each way through the rings", ca0, ca, cb0, cb)
	}
}

// TestAutoWakes: an engine on an automatic link parks in one wait on its
// UDP socket and its ring, and a peer's datagram into the ring ends the
// wait through the ring's bell, not the engine's next deadline (a
// millisecond away: the link's wait would still end, late).
func TestAutoWakes(t *testing.T) {
	a, b := loopPair(t, "keepalive=0", "keepalive=0", &fabric.Options{Spin: -1})
	pingPongN(t, a, b, 1)
	// Each try waits until b's engine has parked, then sends it a
	// message; a try whose send came after the engine's deadline ended
	// the park proves nothing, so try until one rings the bell.
	for try := 0; autoCounts(t, b).BellWakes == 0; try++ {
		if try == 50 {
			t.Fatalf("50 messages to a parked engine: no park ended by the ring's bell (%+v)", autoCounts(t, b))
		}
		p0 := autoCounts(t, b).Parks
		if !testenv.Eventually(testenv.Timeout, func() bool { return autoCounts(t, b).Parks > p0 }) {
			t.Fatalf("b's engine did not park in %v (%+v)", testenv.Timeout, autoCounts(t, b))
		}
		pingPongN(t, a, b, 1)
	}
}

// TestAutoPeerUDP: an endpoint with the default link facing one on
// link=udp (which offers no ring) uses UDP both ways: nothing goes to a
// ring its peer does not read.
func TestAutoPeerUDP(t *testing.T) {
	a, b := loopPair(t, "", "link=udp", nil)
	udpBothWays(t, a, b, a, "the automatic side moved datagrams through rings")
}

// TestAutoRingTaken: an engine whose address's ring another engine of
// the host owns runs on UDP alone and offers no ring; its peer, which has
// one, still sends it UDP.
func TestAutoRingTaken(t *testing.T) {
	addr := shmAddr()
	taken, err := link.ListenShm(netip.AddrPortFrom(addr, link.Port), link.ShmConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	a, b := loopPairAt(t, addr, "", "", nil)
	if a.qp.e.auto != nil {
		t.Fatalf("the engine at %v has an automatic link although another owns its ring", addr)
	}
	udpBothWays(t, a, b, b, "the peer used a ring with an address whose engine offered none")
}

// TestConformanceAuto runs the conformance cases between two engines on
// the default link, through their rings.
func TestConformanceAuto(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := loopPair(t, "", "", nil)
		return a, b
	})
}

// The same cases with the peer in another process: the automatic link's
// rings between two address spaces.
func TestConformanceAutoProcesses(t *testing.T) {
	fabrictest.TestProcesses(t, func(t testing.TB, key string, side fabrictest.Side) fabric.Endpoint {
		local := shmAddr().String()
		ep := processSide(t, "weft-roce-auto-ft-"+key, side, "listen:127.0.0.1:%d?local="+local, "127.0.0.1:%d?local="+local)
		if p := ep.Caps().Path; p != "shm" {
			t.Fatalf("Caps().Path = %q, want shm", p)
		}
		return ep
	})
}

// BenchmarkEngineAuto is BenchmarkEngine with the default link between
// two engines of this host: through their rings.
func BenchmarkEngineAuto(b *testing.B) {
	fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
		x, y := loopPair(b, "mtu=4096&keepalive=0", "mtu=4096&keepalive=0", nil)
		return x, y
	})
}

// TestAutoPeerShm: an endpoint on link=shm and one with the default link
// meet through the rings both ways. The link=shm engine owns its
// address's ring, so it offers it as an automatic engine does: its peer
// must not answer on UDP, which a link=shm engine never reads.
func TestAutoPeerShm(t *testing.T) {
	a, b := loopPair(t, "link=shm", "", nil)
	if pa, pb := a.Caps().Path, b.Caps().Path; pa != "shm" || pb != "shm" {
		t.Fatalf("Caps().Path = %q and %q, want shm and shm", pa, pb)
	}
	c0 := autoCounts(t, b)
	pingPongN(t, a, b, 10)
	if c := autoCounts(t, b); c.ShmTx-c0.ShmTx < 10 || c.ShmRx-c0.ShmRx < 10 {
		t.Fatalf("10 round trips moved %+v -> %+v on the automatic side: want at least 10 datagrams each way through the rings", c0, c)
	}
}

// shmAutoEngines starts an engine on link=shm and one on the automatic
// link, on two random loopback addresses.
func shmAutoEngines(t *testing.T) (shm, auto *Engine) {
	t.Helper()
	la, lb := shmAddr(), shmAddr()
	for la == lb {
		lb = shmAddr()
	}
	shm, err := NewEngine(EngineConfig{Addr: netip.AddrPortFrom(la, link.Port), Shm: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Close() })
	auto, err = NewEngine(EngineConfig{Addr: netip.AddrPortFrom(lb, link.Port), Auto: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { auto.Close() })
	if !auto.shmRing() {
		t.Fatalf("the automatic engine at %v has no ring", lb)
	}
	return shm, auto
}

// TestCMShmPeerRefused: an engine on link=shm that dials one on the
// automatic link hears its REJs, which go through its ring (it reads no
// UDP): the CM's (nobody listens) and the application's. The CM's
// response timeout is longer than the test: a lost REJ would leave Dial
// waiting for the REQ's retries.
func TestCMShmPeerRefused(t *testing.T) {
	ctx := testenv.Context(t)
	ea, eb := shmAutoEngines(t)
	cfg := &ConnConfig{ResponseTimeout: 31}
	raddr := netip.AddrPortFrom(eb.LocalAddr(), 7471)
	eb.CM() // answering from now on
	if _, err := ea.CM().Dial(ctx, ea.AllocPD(), raddr, cfg); !errors.Is(err, fabric.ErrRefused) {
		t.Fatalf("Dial with nobody listening: %v, want fabric.ErrRefused", err)
	}
	l, err := eb.CM().Listen(7471, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		if r, err := l.Next(ctx); err == nil {
			r.Reject(nil)
		}
	}()
	if _, err := ea.CM().Dial(ctx, ea.AllocPD(), raddr, cfg); !errors.Is(err, fabric.ErrRefused) {
		t.Fatalf("Dial that the application rejects: %v, want fabric.ErrRefused", err)
	}
}

// TestCMShmPeerDisconnect: over rdma_cm, an engine on link=shm dials one
// on the automatic link; they meet through the rings, and the DREP that
// answers the link=shm side's DREQ goes through its ring too (it reads no
// UDP), so its Disconnect completes at once. The CM's response timeout is
// longer than the test: a lost DREP is not sent again in time.
func TestCMShmPeerDisconnect(t *testing.T) {
	ctx := testenv.Context(t)
	ea, eb := shmAutoEngines(t)
	cfg := &ConnConfig{ResponseTimeout: 31}
	l, err := eb.CM().Listen(7471, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	pa, pb := ea.AllocPD(), eb.AllocPD()
	accepted := acceptOne(t, ctx, l, pb, nil)
	ca, err := ea.CM().Dial(ctx, pa, netip.AddrPortFrom(eb.LocalAddr(), 7471), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cb := testenv.Recv(t, accepted, "the Accept")
	if cb == nil {
		t.FailNow()
	}
	if !cb.QP().viaShm {
		t.Fatal("the automatic side does not send through the link=shm engine's ring")
	}
	sendRecv(t, ctx, ca.QP(), cb.QP(), pa, pb, "through the rings")
	sendRecv(t, ctx, cb.QP(), ca.QP(), pb, pa, "and back")
	if err := ca.Disconnect(ctx); err != nil {
		t.Fatalf("the link=shm side's Disconnect: %v (no DREP came back)", err)
	}
}

// TestCMShmMarkForeign: an engine with a ring marks its CA GUID, and only
// a Weft GUID so marked offers a ring: not an EUI-64 GUID whose MAC bytes
// happen to spell the mark (rxe's GUID from MAC 50:57:46:12:34:56).
func TestCMShmMarkForeign(t *testing.T) {
	_, eb := shmAutoEngines(t)
	if g := eb.CM().guid; !cmOffersShm(g) {
		t.Fatalf("the CA GUID %#x of an engine with a ring does not offer it", g)
	}
	if g := uint64(0x5257_46ff_fe12_3456); cmOffersShm(g) {
		t.Fatalf("the foreign CA GUID %#x offers a ring", g)
	}
}

// TestEngineViaShm: the automatic link's one rule (Engine.viaShm), which
// the endpoints' exchange, the CM's REP and Accept all take: an RC QP to
// a peer that offered its ring, alive on this host, from an engine with
// an automatic link.
func TestEngineViaShm(t *testing.T) {
	shm, auto := shmAutoEngines(t)
	ring, none := shm.LocalAddr(), shmAddr()
	for none == ring || none == auto.LocalAddr() {
		none = shmAddr()
	}
	for _, c := range []struct {
		e       *Engine
		typ     QPType
		offered bool
		peer    netip.Addr
		want    bool
	}{
		{auto, RC, true, ring, true},
		{auto, UD, true, ring, false},            // UD keeps UDP
		{auto, RC, false, ring, false},           // not offered: another process's ring
		{auto, RC, true, none, false},            // offered, but no ring there
		{shm, RC, true, auto.LocalAddr(), false}, // no automatic link
	} {
		if got := c.e.viaShm(c.typ, c.offered, c.peer); got != c.want {
			t.Errorf("engine %v: viaShm(%v, offered %v, %v) = %v, want %v", c.e.LocalAddr(), c.typ, c.offered, c.peer, got, c.want)
		}
	}
}

// TestAutoUDKeepsUDP: UD endpoints with the default link send on UDP,
// although both engines have rings: UD cannot recover what a full ring
// drops.
func TestAutoUDKeepsUDP(t *testing.T) {
	a, b := loopPair(t, "type=ud", "type=ud", nil)
	udpBothWays(t, a, b, a, "UD moved datagrams through rings")
}
