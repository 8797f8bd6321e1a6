package link

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
)

// xdpPairLinks opens an XDPLink on side A and a UDPLink (raw=0) on side B
// of a fresh veth pair (MTU 3000, static neighbours).
func xdpPairLinks(t *testing.T) (*netns.Pair, *XDPLink, *UDPLink) {
	t.Helper()
	testenv.RequireAFXDP(t)
	p, err := netns.NewPair(netns.PairConfig{MTU: 3000, StaticNeigh: true})
	if err != nil {
		testenv.SkipOrFail(t, "veth pair: "+err.Error())
	}
	t.Cleanup(func() { p.Close() })
	ipA, ipB := netip.MustParseAddr(p.IPA.String()), netip.MustParseAddr(p.IPB.String())
	var x *XDPLink
	if err := p.A.Do(func() (err error) {
		x, err = ListenXDP(netip.AddrPortFrom(ipA, 0), XDPConfig{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	var b *UDPLink
	if err := p.B.Do(func() (err error) {
		b, err = ListenUDPConfig(netip.AddrPortFrom(ipB, 0), UDPConfig{NoRaw: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return p, x, b
}

// TestXDPLinkAllocs checks that a datagram sent and one received through
// an XDPLink (WriteBatch, ReadBatch, WaitRead) allocate nothing once the
// peer's MAC address is known: the link is on the engine's hot path.
func TestXDPLinkAllocs(t *testing.T) {
	p, x, b := xdpPairLinks(t)
	ipA, ipB := netip.MustParseAddr(p.IPA.String()), netip.MustParseAddr(p.IPB.String())
	payload := make([]byte, 64)
	out := []Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipB, Port), SrcPort: 50001}}
	if n, err := x.WriteBatch(out); n != 1 || err != nil { // resolves the MAC
		t.Fatalf("write: %d, %v", n, err)
	}
	readOne(t, b)
	in := []Packet{{Buf: make([]byte, MaxPacket+128)}}
	back := []Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipA, Port), SrcPort: 50002}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(50, func() {
		if n, err := x.WriteBatch(out); n != 1 || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
		if n, err := b.WriteBatch(back); n != 1 || err != nil {
			t.Fatalf("peer write: %d, %v", n, err)
		}
		for {
			n, err := x.ReadBatch(in)
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if err := x.WaitRead(ctx, time.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		rb := []Packet{{Buf: in[0].Buf}}
		for {
			n, _ := b.ReadBatch(rb)
			if n == 1 {
				break
			}
			b.WaitRead(ctx, time.Now().Add(time.Second))
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per round trip (the XDP link's write, read and wait, the peer's UDP link's)", allocs)
	}
}

// TestXDPLinkCloseRace closes an XDPLink while goroutines read, write and
// wait on it: each returns os.ErrClosed (or nothing) and none panics or
// races (run with -race).
func TestXDPLinkCloseRace(t *testing.T) {
	p, x, b := xdpPairLinks(t)
	ipA, ipB := netip.MustParseAddr(p.IPA.String()), netip.MustParseAddr(p.IPB.String())
	payload := make([]byte, 1000)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 8)
	loop := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := f(); err != nil {
					errs <- err
					return
				}
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
			}
		}()
	}
	rd := []Packet{{Buf: make([]byte, MaxPacket+128)}, {Buf: make([]byte, MaxPacket+128)}}
	loop(func() error { _, err := x.ReadBatch(rd); return err })
	loop(func() error { return x.WaitRead(context.Background(), time.Now().Add(time.Millisecond)) })
	out := make([]Packet, 16)
	for i := range out {
		out[i] = Packet{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipB, Port), SrcPort: 50001}
	}
	loop(func() error { _, err := x.WriteBatch(out); return err })
	back := make([]Packet, 16)
	for i := range back {
		back[i] = Packet{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipA, Port), SrcPort: 50002}
	}
	loop(func() error { b.WriteBatch(back); return nil })
	// Let traffic flow both ways before closing.
	if !testenv.Eventually(5*time.Second, func() bool { s := x.Stats(); return s.RX > 100 && s.TX > 100 }) {
		t.Fatalf("no traffic: %+v", x.Stats())
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := testenv.Recv(t, errs, "a goroutine's end"); !errors.Is(err, os.ErrClosed) {
			t.Fatalf("after Close: %v, want os.ErrClosed", err)
		}
	}
	close(stop)
	wg.Wait()
	if err := x.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestXDPLinkInterfaceMTU checks that a datagram too large for the
// interface's MTU is refused by WriteBatch with an error, as the kernel's
// UDP path refuses it (EMSGSIZE: the link sends with don't-fragment), not
// taken and then dropped by the device where nothing counts it; one that
// fits is sent.
func TestXDPLinkInterfaceMTU(t *testing.T) {
	testenv.RequireAFXDP(t)
	p, err := netns.NewPair(netns.PairConfig{MTU: 1500, StaticNeigh: true})
	if err != nil {
		testenv.SkipOrFail(t, "veth pair: "+err.Error())
	}
	defer p.Close()
	ipA, ipB := netip.MustParseAddr(p.IPA.String()), netip.MustParseAddr(p.IPB.String())
	var x *XDPLink
	if err := p.A.Do(func() (err error) {
		x, err = ListenXDP(netip.AddrPortFrom(ipA, 0), XDPConfig{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	var b *UDPLink
	if err := p.B.Do(func() (err error) {
		b, err = ListenUDPConfig(netip.AddrPortFrom(ipB, 0), UDPConfig{NoRaw: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	payload := make([]byte, 1500-28+1)
	pk := []Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipB, Port), SrcPort: 50001}}
	if n, err := x.WriteBatch(pk); n != 0 || !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("write of a %d-byte datagram on an interface of MTU 1500: %d, %v; want 0 and ErrInvalid", len(payload), n, err)
	}
	pk[0].N--
	if n, err := x.WriteBatch(pk); n != 1 || err != nil {
		t.Fatalf("write of a %d-byte datagram on an interface of MTU 1500: %d, %v", pk[0].N, n, err)
	}
	if got := readOne(t, b); got.N != pk[0].N {
		t.Fatalf("read %d bytes, want %d", got.N, pk[0].N)
	}
	if s := x.Stats(); s.TX != 1 || s.NoRoute != 1 {
		t.Fatalf("stats %+v, want TX 1, NoRoute 1", s)
	}
}

// TestXDPLinkOthersTraffic checks that an XDPLink takes only the RoCEv2
// datagrams to its own address: those to port 4791 of another IPv4
// address of its interface, or of an IPv6 one, still reach the kernel's
// sockets there (another engine on a UDP link, Linux rxe), neither
// stolen by the link's program nor dropped by the link.
func TestXDPLinkOthersTraffic(t *testing.T) {
	testenv.RequireAFXDP(t)
	p, err := netns.NewPair(netns.PairConfig{MTU: 3000})
	if err != nil {
		testenv.SkipOrFail(t, "veth pair: "+err.Error())
	}
	defer p.Close()
	for _, ns := range []*netns.NS{p.A, p.B} {
		for _, k := range []string{"all", "default", p.NameA, p.NameB} {
			ns.Sysctl("net/ipv6/conf/"+k+"/disable_ipv6", "0")
			ns.Sysctl("net/ipv6/conf/"+k+"/accept_dad", "0")
		}
	}
	if err := p.A.AddAddr(p.NameA, "10.11.0.3/24"); err != nil {
		t.Fatal(err)
	}
	if err := p.A.AddAddr(p.NameA, "fd00:11::1/64"); err != nil {
		t.Fatal(err)
	}
	if err := p.B.AddAddr(p.NameB, "fd00:11::2/64"); err != nil {
		t.Fatal(err)
	}
	var x *XDPLink
	if err := p.A.Do(func() (err error) {
		x, err = ListenXDP(netip.AddrPortFrom(netip.MustParseAddr(p.IPA.String()), 0), XDPConfig{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	for _, to := range []string{"10.11.0.3:4791", "[fd00:11::1]:4791"} {
		dst := netip.MustParseAddrPort(to)
		var c *net.UDPConn
		if err := p.A.Do(func() (err error) {
			c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(dst))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := p.B.Do(func() error {
			s, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
			if err != nil {
				return err
			}
			defer s.Close()
			_, err = s.Write(make([]byte, 64))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, _, err := c.ReadFromUDPAddrPort(make([]byte, 256)); n != 64 || err != nil {
			t.Errorf("datagram to %v: %d, %v (the link's stats %+v)", dst, n, err, x.Stats())
		}
	}
	if n, err := x.ReadBatch(make([]Packet, 4)); n != 0 || err != nil {
		t.Fatalf("the link took %d of others' datagrams (%v)", n, err)
	}
	if s := x.Stats(); s.Dropped != 0 || s.RX != 0 {
		t.Fatalf("the link took others' datagrams: %+v", s)
	}
}
