package link

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
	"golang.org/x/sys/unix"
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
		// The address may not be usable at once: attaching the link's
		// program makes the veth go through a carrier change, after
		// which the kernel holds its IPv6 addresses back for a moment
		// (EADDRNOTAVAIL, one run in four).
		var c *net.UDPConn
		var err error
		testenv.Eventually(testenv.Timeout, func() bool {
			err = p.A.Do(func() (err error) {
				c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(dst))
				return err
			})
			return !errors.Is(err, syscall.EADDRNOTAVAIL)
		})
		if err != nil {
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

// TestXDPLinkConcurrentClose checks that a Close called while another is
// releasing the link returns only once the release is done (the AF_XDP
// socket closed, the port's kernel socket too), with the same error: a
// caller that closes and then reuses the interface or the port must not
// find them still held. The first Close is held in its release (the
// test holds the reader's lock, which it takes before the UMEM); the
// second starts once the first is there, and the lock is let go only
// once the second waits for the first (goroutine stacks), or returned.
func TestXDPLinkConcurrentClose(t *testing.T) {
	p, x, _ := xdpPairLinks(t)
	var st unix.Stat_t
	if err := unix.Fstat(x.sock.FD(), &st); err != nil {
		t.Fatal(err)
	}
	xskName := fmt.Sprintf("socket:[%d]", st.Ino)
	// gone reports whether the XSK socket is closed (no descriptor of
	// the process names it) and the port free to bind.
	var goneMu sync.Mutex
	gone := func() error {
		goneMu.Lock()
		defer goneMu.Unlock()
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return err
		}
		for _, fd := range fds {
			if s, _ := os.Readlink("/proc/self/fd/" + fd.Name()); s == xskName {
				return fmt.Errorf("the AF_XDP socket is still open (fd %s)", fd.Name())
			}
		}
		return p.A.Do(func() error {
			c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(x.LocalAddr()))
			if err != nil {
				return fmt.Errorf("the port is still held: %w", err)
			}
			return c.Close()
		})
	}
	type result struct{ closeErr, goneErr error }
	closer := func() chan result {
		ch := make(chan result, 1)
		go func() {
			err := x.Close()
			ch <- result{err, gone()}
		}()
		return ch
	}
	// inClose counts the goroutines in XDPLink.Close whose stack holds
	// all of want.
	inClose := func(want ...string) int {
		buf := make([]byte, 1<<20)
		n := 0
		for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
			ok := bytes.Contains(g, []byte("(*XDPLink).Close"))
			for _, w := range want {
				ok = ok && bytes.Contains(g, []byte(w))
			}
			if ok {
				n++
			}
		}
		return n
	}
	x.rmu.Lock()
	first := closer()
	if !testenv.Eventually(10*time.Second, func() bool { return inClose("(*XDPLink).release", "sync.(*Mutex).Lock") == 1 }) {
		x.rmu.Unlock()
		t.Fatal("the first Close never reached its release")
	}
	second := closer()
	var early *result
	if !testenv.Eventually(10*time.Second, func() bool {
		select {
		case r := <-second:
			early = &r
			return true
		default:
		}
		// Waiting for the first, not releasing.
		return inClose("sync.(*Once).doSlow") == 2 && inClose("(*XDPLink).release") == 1
	}) {
		x.rmu.Unlock()
		t.Fatal("the second Close neither returned nor waited for the first")
	}
	if early != nil {
		x.rmu.Unlock()
		t.Fatalf("the second Close returned (%v) while the first was releasing the link (%v)", early.closeErr, early.goneErr)
	}
	x.rmu.Unlock()
	r1 := testenv.Recv(t, first, "the first Close")
	r2 := testenv.Recv(t, second, "the second Close")
	for i, r := range []result{r1, r2} {
		if r.goneErr != nil {
			t.Errorf("Close %d returned before the release was done: %v", i+1, r.goneErr)
		}
	}
	if r1.closeErr != nil || r2.closeErr != nil {
		t.Fatalf("Close: %v, %v", r1.closeErr, r2.closeErr)
	}
	if err := x.Close(); err != nil {
		t.Fatalf("a third Close: %v", err)
	}
}

// TestXDPLinkUnresolvedNeighbour checks that a WriteBatch to a peer whose
// MAC address the kernel's neighbour table does not have returns at once
// rather than wait for ARP, which would stall the engine's sends to
// every peer: it fails the packet (counted in NoRoute) and returns while
// the resolution still runs in the background, here for a neighbour
// that never answers. Once a peer that answers is resolved, its packets
// flow. Close stops a resolution under way.
func TestXDPLinkUnresolvedNeighbour(t *testing.T) {
	testenv.RequireAFXDP(t)
	p, err := netns.NewPair(netns.PairConfig{MTU: 3000})
	if err != nil {
		testenv.SkipOrFail(t, "veth pair: "+err.Error())
	}
	defer p.Close()
	ipA, ipB := netip.MustParseAddr(p.IPA.String()), netip.MustParseAddr(p.IPB.String())
	var x *XDPLink
	if err := p.A.Do(func() (err error) {
		// Long enough that a write which waited for the resolution
		// would find it over.
		x, err = ListenXDP(netip.AddrPortFrom(ipA, 0), XDPConfig{ResolveTimeout: 20 * time.Second})
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
	pending := func(ip netip.Addr) bool {
		x.nmu.Lock()
		defer x.nmu.Unlock()
		return x.macs[ip].pending
	}

	payload := make([]byte, 200)
	ghostIP := netip.MustParseAddr("10.11.0.99")
	ghost := []Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ghostIP, Port), SrcPort: 50001}}
	for i := range 3 {
		n, err := x.WriteBatch(ghost)
		if n != 0 || !errors.Is(err, errNoMAC) || !strings.Contains(err.Error(), "being resolved") {
			t.Fatalf("write %d to a neighbour that never answers: %d, %v; want 0 and errNoMAC, being resolved", i, n, err)
		}
		if !pending(ghostIP) {
			t.Fatalf("write %d to a neighbour that never answers returned once its resolution was over", i)
		}
	}
	if s := x.Stats(); s.NoRoute != 3 || s.TX != 0 {
		t.Fatalf("stats %+v, want NoRoute 3, TX 0", s)
	}

	// B answers ARP: its packets flow once it is resolved (the first
	// ones fail while it is being resolved, and the engine's
	// retransmission would recover them).
	pk := []Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipB, Port), SrcPort: 50001}}
	var lastErr error
	if !testenv.Eventually(10*time.Second, func() bool {
		n, err := x.WriteBatch(pk)
		lastErr = err
		if err != nil && !errors.Is(err, errNoMAC) {
			t.Fatalf("write to a neighbour that answers: %d, %v", n, err)
		}
		return n == 1
	}) {
		t.Fatalf("a neighbour that answers ARP was never resolved: %v (stats %+v)", lastErr, x.Stats())
	}
	if got := readOne(t, b); got.N != len(payload) {
		t.Fatalf("read %d bytes, want %d", got.N, len(payload))
	}

	// A resolved address past its time is still used, and looked up
	// again in the background.
	x.nmu.Lock()
	m := x.macs[ipB]
	m.until = time.Now().Add(-time.Second)
	x.macs[ipB] = m
	x.nmu.Unlock()
	if n, err := x.WriteBatch(pk); n != 1 || err != nil {
		t.Fatalf("write to a neighbour whose address is being looked up again: %d, %v", n, err)
	}
	// (The lookup may be over already: the kernel's neighbour table
	// holds B. That it ran shows in the renewal below.)
	readOne(t, b)
	if !testenv.Eventually(10*time.Second, func() bool {
		x.nmu.Lock()
		defer x.nmu.Unlock()
		m := x.macs[ipB]
		return !m.pending && m.ok && m.until.After(time.Now())
	}) {
		t.Fatalf("the address looked up again was not renewed: %+v", x.macs[ipB])
	}

	// The neighbour that never answers is being resolved still (for 20
	// s): Close ends that.
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if pending(ghostIP) {
		t.Fatal("Close returned with a resolution under way")
	}
}

// fillFlags returns the flags word of x's fill ring, which a zero-copy
// driver sets (XDP_RING_NEED_WAKEUP) when it wants to be woken to
// refill its receive queue. In copy mode, the only one a veth pair
// offers, the kernel never sets nor reads it, so the test sets it as
// such a driver would.
func fillFlags(t *testing.T, x *XDPLink) *atomic.Uint32 {
	t.Helper()
	v := reflect.ValueOf(x.sock.Fill()).Elem().FieldByName("ring").FieldByName("flags")
	if !v.IsValid() || v.Kind() != reflect.Pointer || v.IsNil() {
		t.Fatal("xsk.FillRing has no ring.flags pointer any more: update the test")
	}
	return (*atomic.Uint32)(unsafe.Pointer(v.Pointer()))
}

// TestXDPLinkRXWakeup checks ReadBatch's wake-up of a zero-copy driver
// (need_wakeup on the fill ring): a read that finds the RX ring empty
// refills the fill ring and wakes the driver (one recvfrom, counted in
// the socket's Kicks) when the ring's flag asks for it, and makes no
// system call when it does not, nor when it received something; frames
// keep arriving either way.
func TestXDPLinkRXWakeup(t *testing.T) {
	p, x, b := xdpPairLinks(t)
	if x.ZeroCopy() || x.sock.BusyPolling() {
		t.Skip("the socket is zero-copy or busy-polls: the driver owns the flag")
	}
	ipA := netip.MustParseAddr(p.IPA.String())
	flags := fillFlags(t, x)
	payload := make([]byte, 64)
	back := []Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipA, Port), SrcPort: 50002}}
	in := make([]Packet, 4)
	for i := range in {
		in[i].Buf = make([]byte, MaxPacket+128)
	}
	read := func() int {
		t.Helper()
		n, err := x.ReadBatch(in)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, need := range []bool{false, true, false} {
		if need {
			flags.Or(unix.XDP_RING_NEED_WAKEUP)
		} else {
			flags.And(^uint32(unix.XDP_RING_NEED_WAKEUP))
		}
		k := x.sock.Kicks.Load()
		if n := read(); n != 0 {
			t.Fatalf("need_wakeup %v: read %d frames with none sent", need, n)
		}
		want := k
		if need {
			want++
		}
		if got := x.sock.Kicks.Load(); got != want {
			t.Fatalf("need_wakeup %v: an empty read made %d wake-ups, want %d", need, got-k, want-k)
		}
		// A read that receives wakes nothing, and frames arrive with the
		// flag set as without it.
		if n, err := b.WriteBatch(back); n != 1 || err != nil {
			t.Fatalf("peer write: %d, %v", n, err)
		}
		if err := x.WaitRead(context.Background(), time.Now().Add(testenv.Timeout)); err != nil {
			t.Fatal(err)
		}
		k = x.sock.Kicks.Load()
		if n := read(); n != 1 || in[0].N != len(payload) {
			t.Fatalf("need_wakeup %v: read %d frames (N %d), want the one sent", need, n, in[0].N)
		}
		if got := x.sock.Kicks.Load(); got != k {
			t.Fatalf("need_wakeup %v: a read that received made %d wake-ups", need, got-k)
		}
		// The frame read is lent to the caller (see TestXDPLinkLends)
		// until the next read; every other one is in the fill ring.
		if x.inFill != xdpFrames/2-1 {
			t.Fatalf("need_wakeup %v: %d frames in the fill ring after a read of one, want all %d but the one lent", need, x.inFill, xdpFrames/2)
		}
	}
}

// TestXDPLinkLends checks that ReadBatch copies nothing: a packet's Buf
// is its frame in the UMEM, from the IPv4 header to the end of the
// payload, with the bytes sent; the frames of a batch stay out of the
// fill ring (the kernel cannot overwrite them) until the next
// ReadBatch, which returns them all; and a frame that is not RoCEv2 is
// returned at once.
func TestXDPLinkLends(t *testing.T) {
	p, x, b := xdpPairLinks(t)
	ipA := netip.MustParseAddr(p.IPA.String())
	const k = 3
	back := make([]Packet, k)
	for i := range back {
		payload := bytes.Repeat([]byte{byte(0x40 + i)}, 64+i)
		back[i] = Packet{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipA, Port), SrcPort: 50002}
	}
	in := make([]Packet, 8)
	mine := make([][]byte, len(in))
	for i := range in {
		mine[i] = make([]byte, MaxPacket+128)
	}
	read := func() int {
		t.Helper()
		for i := range in {
			in[i] = Packet{Buf: mine[i]}
		}
		n, err := x.ReadBatch(in)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n, err := b.WriteBatch(back); n != k || err != nil {
		t.Fatalf("peer write: %d, %v", n, err)
	}
	got := 0
	for got < k {
		if err := x.WaitRead(context.Background(), time.Now().Add(testenv.Timeout)); err != nil {
			t.Fatal(err)
		}
		n := read()
		for i := 0; i < n; i++ {
			q := &in[i]
			if q.Off != 28 || q.N != back[got+i].N || !bytes.Equal(q.Buf[q.Off:q.Off+q.N], back[got+i].Buf) {
				t.Fatalf("packet %d: Off %d N %d, want 28 and the %d bytes sent", got+i, q.Off, q.N, back[got+i].N)
			}
			if len(q.Buf) != q.Off+q.N || q.Buf[0] != 0x45 {
				t.Fatalf("packet %d: Buf of %d bytes starting %#x, want the IPv4 header and payload only", got+i, len(q.Buf), q.Buf[0])
			}
			start := uintptr(unsafe.Pointer(unsafe.SliceData(x.umem.Frame(0))))
			at := uintptr(unsafe.Pointer(&q.Buf[0]))
			if at < start || at >= start+uintptr(xdpFrames*xdpFrameSize) {
				t.Fatalf("packet %d: Buf is not in the UMEM (copied)", got+i)
			}
			if &q.Buf[0] == &mine[i][0] {
				t.Fatalf("packet %d: read into the caller's buffer", got+i)
			}
		}
		if want := xdpFrames/2 - n; x.inFill != want {
			t.Fatalf("after a read of %d: %d frames in the fill ring, want %d (the batch lent)", n, x.inFill, want)
		}
		got += n
	}
	if n := read(); n != 0 {
		t.Fatalf("read %d frames with none sent", n)
	}
	if x.inFill != xdpFrames/2 {
		t.Fatalf("after the next read: %d frames in the fill ring, want all %d", x.inFill, xdpFrames/2)
	}
	// A frame that is not RoCEv2 (too short for a BTH) is dropped and its
	// frame returned at once.
	short := []Packet{{Buf: []byte{1, 2, 3, 4}, N: 4, Addr: netip.AddrPortFrom(ipA, Port), SrcPort: 50002}}
	if n, err := b.WriteBatch(short); n != 1 || err != nil {
		t.Fatalf("peer write: %d, %v", n, err)
	}
	if err := x.WaitRead(context.Background(), time.Now().Add(testenv.Timeout)); err != nil {
		t.Fatal(err)
	}
	if n := read(); n != 1 || in[0].N != -1 {
		t.Fatalf("read %d (N %d), want the short frame with N -1", n, in[0].N)
	}
	if x.inFill != xdpFrames/2 {
		t.Fatalf("after a dropped frame: %d frames in the fill ring, want all %d", x.inFill, xdpFrames/2)
	}
}
