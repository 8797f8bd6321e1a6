package link

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
)

var (
	testMAC   = [6]byte{2, 0, 0, 0, 0, 1}
	testLocal = netip.MustParseAddrPort("10.11.0.1:4791")
)

// roceFrame returns an Ethernet frame holding a RoCEv2 datagram of n
// payload bytes from 10.11.0.2:sport to testLocal.
func roceFrame(n int, sport uint16) []byte {
	b := make([]byte, ethernet.UDP4HdrLen+n)
	h := ethernet.UDP4{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, DstMAC: testMAC[:],
		SrcIP: netip.MustParseAddr("10.11.0.2"), DstIP: testLocal.Addr(), SrcPort: sport, DstPort: Port}
	ethernet.PutUDP4(b, &h, n)
	for i := range n {
		b[ethernet.UDP4HdrLen+i] = byte(i)
	}
	return b
}

// csum recomputes the IPv4 header checksum of frame b.
func csum(b []byte) []byte {
	ip := b[ethernet.EthHdrLen : ethernet.EthHdrLen+20]
	ip[10], ip[11] = 0, 0
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
	return b
}

// TestParseXDPFrame checks the inbound frame parser on a good frame and
// on every kind of frame it must drop.
func TestParseXDPFrame(t *testing.T) {
	buf := make([]byte, MaxPacket+128)
	good := roceFrame(40, 49152)
	off, n, src, ok := ParseXDPFrame(good, testMAC, testLocal, buf)
	if !ok || off != 28 || n != 40 || src != netip.MustParseAddrPort("10.11.0.2:49152") {
		t.Fatalf("good frame: off %d n %d src %v ok %v", off, n, src, ok)
	}
	if !bytes.Equal(buf[:off+n], good[ethernet.EthHdrLen:]) {
		t.Fatal("good frame: headers and payload not copied as they came")
	}
	opt := withOptions(good)
	if off, n, _, ok := ParseXDPFrame(opt, testMAC, testLocal, buf); !ok || off != 32 || n != 40 ||
		!bytes.Equal(buf[:off+n], opt[ethernet.EthHdrLen:]) {
		t.Fatalf("frame with IPv4 options: off %d n %d ok %v", off, n, ok)
	}
	bad := map[string]func(b []byte) []byte{
		"other dst mac":  func(b []byte) []byte { b[0] = 0xff; return b },
		"arp":            func(b []byte) []byte { b[12], b[13] = 8, 6; return b },
		"ip version":     func(b []byte) []byte { b[14] = 0x65; return b },
		"ip checksum":    func(b []byte) []byte { b[24] ^= 1; return b },
		"fragment":       func(b []byte) []byte { b[20] = 0x20; return csum(b) },
		"other dst ip":   func(b []byte) []byte { b[33]++; return csum(b) },
		"other dst port": func(b []byte) []byte { b[37]++; return b },
		"short payload":  func(b []byte) []byte { return roceFrame(15, 1) },
		"truncated":      func(b []byte) []byte { return b[:40] },
		"udp length":     func(b []byte) []byte { binary.BigEndian.PutUint16(b[38:], 200); return b },
		"tcp":            func(b []byte) []byte { b[23] = 6; return csum(b) },
	}
	for name, mut := range bad {
		f := mut(roceFrame(40, 49152))
		if _, _, _, ok := ParseXDPFrame(f, testMAC, testLocal, buf); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, _, ok := ParseXDPFrame(good, testMAC, testLocal, buf[:60]); ok {
		t.Error("a buffer too small for the datagram: accepted")
	}
}

// withOptions returns frame b with 4 bytes of IPv4 options (NOPs, IHL 6)
// inserted after the IPv4 header, the lengths and checksum fixed.
func withOptions(b []byte) []byte {
	h := ethernet.EthHdrLen + 20
	f := append(append(append([]byte(nil), b[:h]...), 1, 1, 1, 1), b[h:]...)
	f[ethernet.EthHdrLen] = 0x46
	binary.BigEndian.PutUint16(f[ethernet.EthHdrLen+2:], binary.BigEndian.Uint16(f[ethernet.EthHdrLen+2:])+4)
	ip := f[ethernet.EthHdrLen : ethernet.EthHdrLen+24]
	ip[10], ip[11] = 0, 0
	var s uint32
	for i := 0; i < 24; i += 2 {
		s += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
	return f
}

// FuzzParseXDPFrame: the parser never panics, and what it accepts is a
// datagram to the link whose copy matches the frame.
func FuzzParseXDPFrame(f *testing.F) {
	f.Add(roceFrame(40, 49152))
	f.Add(roceFrame(16, 1))
	f.Add(roceFrame(0, 1))
	f.Add([]byte{})
	f.Add(withOptions(roceFrame(40, 49152)))
	f.Fuzz(func(t *testing.T, frame []byte) {
		checkXDPFrame(t, frame)
		// Again with the IPv4 header checksum repaired (over the header's
		// own length), so that the fuzzer reaches the length, option and
		// copy paths behind it, which a random checksum almost never
		// passes.
		if len(frame) >= ethernet.EthHdrLen+20 {
			ip := frame[ethernet.EthHdrLen:]
			if ihl := int(ip[0]&0x0f) * 4; ihl >= 20 && ihl <= len(ip) {
				ip[10], ip[11] = 0, 0
				var s uint32
				for i := 0; i+1 < ihl; i += 2 {
					s += uint32(ip[i])<<8 | uint32(ip[i+1])
				}
				for s > 0xffff {
					s = s>>16 + s&0xffff
				}
				binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
				checkXDPFrame(t, frame)
			}
		}
	})
}

// checkXDPFrame parses frame: the parser must not panic, and what it
// accepts is a datagram to the link whose copy matches the frame.
func checkXDPFrame(t *testing.T, frame []byte) {
	t.Helper()
	{
		buf := make([]byte, 256)
		off, n, _, ok := ParseXDPFrame(frame, testMAC, testLocal, buf)
		if !ok {
			return
		}
		if off < 28 || n < 16 || off+n > len(buf) || off+n > len(frame)-ethernet.EthHdrLen {
			t.Fatalf("accepted with off %d n %d of a %d-byte frame", off, n, len(frame))
		}
		if [6]byte(frame[:6]) != testMAC || !bytes.Equal(buf[16:20], frame[30:34]) ||
			binary.BigEndian.Uint16(buf[off-6:]) != Port {
			t.Fatal("accepted a frame to another MAC, address or port")
		}
		if !bytes.Equal(buf[off:off+n], frame[ethernet.EthHdrLen+off:ethernet.EthHdrLen+off+n]) {
			t.Fatal("payload not copied")
		}
		if !bytes.Equal(buf[:off], frame[ethernet.EthHdrLen:ethernet.EthHdrLen+off]) {
			t.Fatal("headers not copied as they came")
		}
	}
}

// readOne waits for and reads one datagram from l.
func readOne(t *testing.T, l Link) Packet {
	t.Helper()
	p := []Packet{{Buf: make([]byte, MaxPacket+128)}}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := l.ReadBatch(p)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return p[0]
		}
		if err := l.WaitRead(context.Background(), time.Now().Add(100*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("no datagram")
	return Packet{}
}

// TestXDPLinkWire checks that an XDPLink puts on the wire the bytes the
// kernel's UDP path does for the same datagram (IPv4 header byte for
// byte: identification 0, don't-fragment, TTL 64; UDP header but for
// the checksum, which RoCEv2 lets it leave zero), as a raw-socket
// UDPLink on the peer sees them; that it reads what a UDPLink sends, with
// the real headers; and that a datagram to its port that is not RoCEv2
// is dropped and counted.
//
// It runs with the program attached in native mode (veth's, MTU 3000)
// and in generic mode (MTU 9000, too large for native XDP on veth
// without multi-buffer programs, which AttachAuto falls back from).
func TestXDPLinkWire(t *testing.T) {
	testenv.RequireAFXDP(t)
	t.Run("native", func(t *testing.T) { testXDPLinkWire(t, 3000, ethernet.AttachNative) })
	t.Run("generic", func(t *testing.T) { testXDPLinkWire(t, 9000, ethernet.AttachAuto) })
}

func testXDPLinkWire(t *testing.T, mtu int, mode ethernet.AttachMode) {
	p, err := netns.NewPair(netns.PairConfig{MTU: mtu})
	if err != nil {
		testenv.SkipOrFail(t, "veth pair: "+err.Error())
	}
	defer p.Close()
	ipA, ipB := netip.MustParseAddr(p.IPA.String()), netip.MustParseAddr(p.IPB.String())
	var b *UDPLink
	if err := p.B.Do(func() (err error) {
		b, err = ListenUDPConfig(netip.AddrPortFrom(ipB, 0), UDPConfig{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Raw() {
		t.Skip("no raw socket: cannot see the IP header")
	}
	payload := make([]byte, 300)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	// The destination QP (BTH bytes 5-7) in b's block: b's port is
	// steered by QPN.
	binary.BigEndian.PutUint32(payload[4:], b.QPNBlock()<<QPNBlockBits|1)
	send := func(l Link) Packet {
		t.Helper()
		n, err := l.WriteBatch([]Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipB, Port), SrcPort: 50001}})
		if n != 1 || err != nil {
			t.Fatalf("write: %d, %v", n, err)
		}
		return readOne(t, b)
	}
	// The kernel's UDP path from A.
	var ku *UDPLink
	if err := p.A.Do(func() (err error) {
		ku, err = ListenUDPConfig(netip.AddrPortFrom(ipA, 0), UDPConfig{NoRaw: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	kp := send(ku)
	kern := append([]byte(nil), kp.Buf[:kp.Off+kp.N]...)
	ku.Close()
	var x *XDPLink
	if err := p.A.Do(func() (err error) {
		x, err = ListenXDP(netip.AddrPortFrom(ipA, 0), XDPConfig{Attach: mode})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if mtu > 4000 && x.Program().Mode() != ethernet.AttachGeneric {
		t.Fatalf("MTU %d: attached in %v mode, want generic", mtu, x.Program().Mode())
	}
	t.Logf("XDP program attached in %v mode, socket zero-copy %v", x.Program().Mode(), x.ZeroCopy())
	xp := send(x)
	got := xp.Buf[:xp.Off+xp.N]
	if len(got) != len(kern) || kp.Off != xp.Off {
		t.Fatalf("XDP datagram of %d bytes (payload at %d), the kernel's %d (at %d)", len(got), xp.Off, len(kern), kp.Off)
	}
	if !bytes.Equal(got[:xp.Off-2], kern[:kp.Off-2]) {
		t.Fatalf("headers differ:\nxdp    %x\nkernel %x", got[:xp.Off], kern[:kp.Off])
	}
	if !bytes.Equal(got[xp.Off:], payload) || !bytes.Equal(kern[kp.Off:], payload) {
		t.Fatal("payload differs")
	}
	if s := x.Stats(); s.TX != 1 {
		t.Fatalf("stats %+v, want TX 1", s)
	}

	// B to A: the XDP link reads what a UDPLink sends.
	n, err := b.WriteBatch([]Packet{{Buf: payload, N: len(payload), Addr: netip.AddrPortFrom(ipA, Port), SrcPort: 50002}})
	if n != 1 || err != nil {
		t.Fatalf("write to the XDP link: %d, %v", n, err)
	}
	rp := readOne(t, x)
	if rp.Addr != netip.AddrPortFrom(ipB, 50002) || rp.SrcPort != 50002 || rp.Off != 28 ||
		!bytes.Equal(rp.Buf[rp.Off:rp.Off+rp.N], payload) {
		t.Fatalf("read %v port %d off %d n %d", rp.Addr, rp.SrcPort, rp.Off, rp.N)
	}
	if s := x.Stats(); s.RX != 1 || s.Dropped != 0 {
		t.Fatalf("stats %+v, want RX 1", s)
	}

	// Not RoCEv2: a 4-byte datagram to port 4791.
	if err := p.B.Do(func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ipA, Port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte{1, 2, 3, 4})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if dp := readOne(t, x); dp.N != -1 {
		t.Fatalf("a 4-byte datagram read with N %d, want -1 (for the engine to count)", dp.N)
	}
	if s := x.Stats(); s.Dropped != 1 || s.RX != 1 {
		t.Fatalf("stats %+v, want RX 1, Dropped 1", s)
	}

	// An unreachable peer fails the packet at once while the link
	// resolves it in the background, then at once from the cache once
	// the resolution failed; a packet too large for a frame fails too.
	// None is sent.
	ghost := []Packet{{Buf: payload, N: len(payload), Addr: netip.MustParseAddrPort("10.11.0.99:4791"), SrcPort: 50001}}
	writes := 0
	var lastErr error
	if !testenv.Eventually(10*time.Second, func() bool {
		n, err := x.WriteBatch(ghost)
		writes++
		if n != 0 || !errors.Is(err, errNoMAC) {
			t.Fatalf("write to an unreachable peer: %d, %v", n, err)
		}
		if writes == 1 && !strings.Contains(err.Error(), "being resolved") {
			t.Fatalf("first write to an unreachable peer: %v, want it being resolved", err)
		}
		lastErr = err
		return strings.Contains(err.Error(), "failed recently")
	}) {
		t.Fatalf("the resolution of an unreachable peer never failed: %v", lastErr)
	}
	big := make([]byte, XDPMaxPacket+1)
	if n, err := x.WriteBatch([]Packet{{Buf: big, N: len(big), Addr: netip.AddrPortFrom(ipB, Port)}}); n != 0 || !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("write of %d bytes: %d, %v", len(big), n, err)
	}
	if s := x.Stats(); s.TX != 1 || s.NoRoute != uint64(writes)+1 {
		t.Fatalf("stats %+v, want TX 1, NoRoute %d", s, writes+1)
	}
}
