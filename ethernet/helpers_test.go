package ethernet_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
	"golang.org/x/sys/unix"
)

func newPair(t testing.TB, c netns.PairConfig) *netns.Pair {
	t.Helper()
	testenv.RequireAFXDP(t)
	c.StaticNeigh = true
	p, err := netns.NewPair(c)
	if err != nil {
		testenv.Skip(t, "cannot create namespaces and veth pair: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func openPort(t testing.TB, ns *netns.NS, ifname string, cfg *ethernet.Config) *ethernet.Port {
	t.Helper()
	var port *ethernet.Port
	err := ns.Do(func() error {
		var err error
		port, err = ethernet.Open(ifname, cfg)
		return err
	})
	require.NoError(t, err)
	t.Cleanup(func() { port.Close() })
	return port
}

func listenUDP(t testing.TB, ns *netns.NS, ip net.IP, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	require.NoError(t, ns.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: ip, Port: port})
		return err
	}))
	t.Cleanup(func() { c.Close() })
	return c
}

func addr4(ip net.IP) netip.Addr { a, _ := netip.AddrFromSlice(ip.To4()); return a }

// recvFrames waits until want frames arrived on q or d passed.
func recvFrames(t testing.TB, q *ethernet.Queue, want int, d time.Duration, fn func(b []byte)) int {
	t.Helper()
	frames := make([]ethernet.Frame, 64)
	got := 0
	deadline := time.Now().Add(d)
	for got < want && time.Now().Before(deadline) {
		n, err := q.Recv(frames)
		require.NoError(t, err)
		for i := 0; i < n; i++ {
			if fn != nil {
				fn(q.Data(frames[i]))
			}
		}
		q.Release(frames[:n])
		got += n
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return got
}

// rawPeer is a hostile peer: an AF_PACKET socket in namespace B of a
// veth pair that writes Weft's wire format by hand (raw Ethernet, or
// UDP/IPv4 with udp set) to an endpoint in namespace A, and reads what
// the endpoint sends. It forges what a real endpoint never sends.
type rawPeer struct {
	t       testing.TB
	p       *netns.Pair
	fd      int
	udp     bool
	session uint32 // its connection id
	nonce   uint64 // its handshake nonce
	// What it learned from the endpoint's packets.
	peerSession uint32
	peerNonce   uint64
	buf         []byte
}

// newRawPeer opens the peer's socket on p's B end.
func newRawPeer(t testing.TB, p *netns.Pair, udp bool) *rawPeer {
	t.Helper()
	rp := &rawPeer{t: t, p: p, udp: udp, session: 0x5eed0001, nonce: 0x0ddba11cafe, buf: make([]byte, 9000)}
	const ethPAll = 0x0300 // htons(ETH_P_ALL)
	require.NoError(t, p.B.Do(func() error {
		idx, err := p.B.Index(p.NameB)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, ethPAll)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: ethPAll, Ifindex: idx}); err != nil {
			unix.Close(fd)
			return err
		}
		rp.fd = fd
		return nil
	}))
	t.Cleanup(func() { unix.Close(rp.fd) })
	return rp
}

// frameFrom returns pk in a frame from the given source MAC (and with
// UDP framing, source IP and port) to the endpoint in A.
func (rp *rawPeer) frameFrom(src net.HardwareAddr, ip netip.Addr, port uint16, pk ethernet.Packet) []byte {
	if !rp.udp {
		b := make([]byte, ethernet.EthHdrLen, 128)
		ethernet.PutEthernet(b, rp.p.MACA, src, ethernet.EtherTypeWeft)
		return pk.Append(b)
	}
	w := pk.Append(nil)
	b := make([]byte, ethernet.UDP4HdrLen+len(w))
	ethernet.PutUDP4(b, &ethernet.UDP4{SrcMAC: src, DstMAC: rp.p.MACA, SrcIP: ip, DstIP: addr4(rp.p.IPA),
		SrcPort: port, DstPort: ethernet.DefaultUDPPort}, len(w))
	copy(b[ethernet.UDP4HdrLen:], w)
	return b
}

// frame returns pk in a frame from the peer's own address.
func (rp *rawPeer) frame(pk ethernet.Packet) []byte {
	return rp.frameFrom(rp.p.MACB, addr4(rp.p.IPB), ethernet.DefaultUDPPort, pk)
}

// sendFrame sends a frame as it is.
func (rp *rawPeer) sendFrame(b []byte) {
	rp.t.Helper()
	idx, err := rp.p.B.Index(rp.p.NameB)
	require.NoError(rp.t, err)
	require.NoError(rp.t, unix.Sendto(rp.fd, b, 0, &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6}), "sending a %d-byte frame", len(b))
}

// send sends pk from the peer's own address.
func (rp *rawPeer) send(pk ethernet.Packet) { rp.t.Helper(); rp.sendFrame(rp.frame(pk)) }

// pkt returns a packet of type typ from the peer's connection to the
// endpoint's, with its handshake body if it has one: the fields a real
// peer would fill, for a test to spoil.
func (rp *rawPeer) pkt(typ uint8) ethernet.Packet {
	pk := ethernet.Packet{Type: typ, Session: rp.session, Dst: rp.peerSession, Wnd: 64}
	if pk.Handshake() {
		pk.Nonce, pk.Echo = rp.nonce, rp.peerNonce
	}
	return pk
}

// recv waits up to d for a packet from the endpoint that match accepts
// and fails the test, naming what, if none comes.
func (rp *rawPeer) recv(what string, d time.Duration, match func(ethernet.Packet) bool) ethernet.Packet {
	rp.t.Helper()
	pk, ok := rp.next(d, match)
	if !ok {
		rp.t.Fatalf("rawPeer: no %s from the endpoint within %v", what, d)
	}
	return pk
}

// next returns the next packet from the endpoint that match accepts,
// waiting up to d; false if none came.
func (rp *rawPeer) next(d time.Duration, match func(ethernet.Packet) bool) (ethernet.Packet, bool) {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return ethernet.Packet{}, false
		}
		pfd := []unix.PollFd{{Fd: int32(rp.fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, int(left/time.Millisecond)+1); err != nil && err != unix.EINTR {
			rp.t.Fatalf("rawPeer: poll: %v", err)
		} else if n == 0 {
			continue
		}
		n, _, err := unix.Recvfrom(rp.fd, rp.buf, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		require.NoError(rp.t, err)
		pk, ok := rp.parse(rp.buf[:n])
		if ok && (match == nil || match(pk)) {
			pk.Payload = append([]byte(nil), pk.Payload...)
			return pk, true
		}
	}
}

// drain discards what the endpoint sent so far.
func (rp *rawPeer) drain() {
	for {
		if _, _, err := unix.Recvfrom(rp.fd, rp.buf, unix.MSG_DONTWAIT); err != nil {
			return
		}
	}
}

// parse returns the Weft packet in a frame from the endpoint in A, if
// it is one.
func (rp *rawPeer) parse(b []byte) (ethernet.Packet, bool) {
	if len(b) < ethernet.EthHdrLen || !bytes.Equal(b[6:12], rp.p.MACA) {
		return ethernet.Packet{}, false
	}
	if !rp.udp {
		if binary.BigEndian.Uint16(b[12:]) != ethernet.EtherTypeWeft {
			return ethernet.Packet{}, false
		}
		return ethernet.ParsePacket(b[ethernet.EthHdrLen:])
	}
	var h ethernet.UDP4
	w, ok := ethernet.ParseUDP4(b, &h)
	if !ok || h.DstPort != ethernet.DefaultUDPPort {
		return ethernet.Packet{}, false
	}
	return ethernet.ParsePacket(w)
}

// isType matches packets of type typ.
func isType(typ uint8) func(ethernet.Packet) bool {
	return func(pk ethernet.Packet) bool { return pk.Type == typ }
}

// isData matches the data packet psn.
func isData(psn uint32) func(ethernet.Packet) bool {
	return func(pk ethernet.Packet) bool { return pk.Type == ethernet.PtData && pk.PSN == psn }
}

// dialRaw dials the raw peer from namespace A (opts: more address
// options, "&window=16") and answers the endpoint's hello as a listener
// would. It returns the endpoint, connected.
func (rp *rawPeer) dialRaw(opts string) fabric.Endpoint {
	rp.t.Helper()
	d := rp.startDial(opts)
	rp.learn(d.hello(rp))
	rp.send(rp.pkt(ethernet.PtHelloAck))
	return d.wait(rp.t)
}

// hello waits for the dialer's hello at the raw peer.
func (d *pendingDial) hello(rp *rawPeer) ethernet.Packet {
	rp.t.Helper()
	pk, ok := rp.next(5*time.Second, isType(ethernet.PtHello))
	if !ok {
		if d.done() {
			rp.t.Fatalf("rawPeer: no hello: the dial returned %v", d.res.err)
		}
		rp.t.Fatalf("rawPeer: no hello from the dialer within 5s")
	}
	return pk
}

// pendingDial is a dial of the raw peer in progress.
type pendingDial struct {
	ch  chan dialResult
	res *dialResult
}

type dialResult struct {
	ep  fabric.Endpoint
	err error
}

// startDial starts a dial of the raw peer from namespace A; the test's
// cleanup closes the endpoint.
func (rp *rawPeer) startDial(opts string) *pendingDial {
	addr := fmt.Sprintf("%s?peer=%s&netns=%s%s", rp.p.NameA, rp.p.MACB, rp.p.A.Name(), opts)
	if rp.udp {
		addr = fmt.Sprintf("%s?udp=%s&peer=%s&netns=%s%s", rp.p.NameA, rp.p.IPB, rp.p.MACB, rp.p.A.Name(), opts)
	}
	d := &pendingDial{ch: make(chan dialResult, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	go func() {
		ep, err := fabric.Open(ctx, "ethernet", addr, nil)
		d.ch <- dialResult{ep, err}
	}()
	rp.t.Cleanup(func() {
		cancel()
		if d.res == nil {
			r := <-d.ch
			d.res = &r
		}
		if d.res.ep != nil {
			d.res.ep.Close()
		}
	})
	return d
}

// done reports whether the dial has returned, without waiting.
func (d *pendingDial) done() bool {
	if d.res != nil {
		return true
	}
	select {
	case r := <-d.ch:
		d.res = &r
		return true
	default:
		return false
	}
}

// result waits up to 10s for the dial to return.
func (d *pendingDial) result(t testing.TB) dialResult {
	t.Helper()
	if d.res == nil {
		select {
		case r := <-d.ch:
			d.res = &r
		case <-time.After(10 * time.Second):
			t.Fatalf("the dial of the raw peer did not return within 10s")
		}
	}
	return *d.res
}

// wait waits for the dial to return and requires it to succeed.
func (d *pendingDial) wait(t testing.TB) fabric.Endpoint {
	t.Helper()
	r := d.result(t)
	require.NoError(t, r.err, "the dial of the raw peer")
	return r.ep
}

// learn takes the endpoint's connection id and nonce from its hello.
func (rp *rawPeer) learn(hello ethernet.Packet) {
	rp.peerSession, rp.peerNonce = hello.Session, hello.Nonce
}

// barrier sends a packet the connected endpoint must refuse and count
// (a hello from another connection id), and waits until it has: every
// frame the peer sent before it has then been processed. It returns the
// endpoint's stats as of then, the barrier's own drop taken off. The
// caller must first wait for any frame it sent that the endpoint counts
// as malformed too: the barrier takes the first new count for its own,
// and one of those, still queued, would end it early.
func (rp *rawPeer) barrier(ep fabric.Endpoint) fabric.Stats {
	rp.t.Helper()
	before := ep.Stats().Drops[fabric.DropMalformed]
	pk := rp.pkt(ethernet.PtHello)
	pk.Session ^= 0xbabe0000
	pk.Echo = 0
	rp.send(pk)
	var s fabric.Stats
	require.Eventually(rp.t, func() bool {
		s = ep.Stats()
		return s.Drops[fabric.DropMalformed] > before
	}, 5*time.Second, time.Millisecond, "barrier: the endpoint never counted the barrier's hello from a wrong connection id as malformed")
	s.Drops[fabric.DropMalformed]--
	return s
}

// guardHeap fails the test process (a panic: the goroutine that grows
// the heap cannot be stopped) if the heap passes limit bytes while the
// test runs: a forged packet must not make the endpoint allocate without
// bound.
func guardHeap(t testing.TB, limit uint64, what string) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > limit {
				panic(fmt.Sprintf("%s: %s: the heap grew to %d bytes (limit %d)", t.Name(), what, v, limit))
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// newRawTopo returns a veth pair between two named namespaces and a raw
// peer on its B end (udp: with UDP/IPv4 framing).
func newRawTopo(t testing.TB, udp bool) (*netns.Pair, *rawPeer) {
	t.Helper()
	p := newPair(t, netns.PairConfig{NameNS: fmt.Sprintf("wr%d-%d", os.Getpid(), nsSeq.Add(1))})
	return p, newRawPeer(t, p, udp)
}
