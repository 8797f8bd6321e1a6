package ethernet_test

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/testenv"
)

func udp4Frame(dport uint16, ihl int, frag uint16) []byte {
	b := make([]byte, 128)
	h := ethernet.UDP4{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		SrcIP: netip.MustParseAddr("10.0.0.1"), DstIP: netip.MustParseAddr("10.0.0.2"), SrcPort: 1, DstPort: dport}
	ethernet.PutUDP4(b, &h, 16)
	if ihl > 5 {
		// Move the UDP header behind IP options.
		opt := (ihl - 5) * 4
		copy(b[34+opt:], b[34:34+8+16])
		for i := 34; i < 34+opt; i++ {
			b[i] = 1 // NOP
		}
		b[14] = 0x40 | byte(ihl)
		b = b[:14+ihl*4+8+16]
	} else {
		b = b[:ethernet.UDP4HdrLen+16]
	}
	binary.BigEndian.PutUint16(b[20:], frag)
	return b
}

func udp6Frame(dport uint16) []byte {
	b := make([]byte, 14+40+8+8)
	ethernet.PutEthernet(b, net.HardwareAddr{2, 0, 0, 0, 0, 2}, net.HardwareAddr{2, 0, 0, 0, 0, 1}, ethernet.EtherTypeIPv6)
	b[14] = 0x60
	b[20] = 17
	binary.BigEndian.PutUint16(b[56:], dport)
	return b
}

// TestFilterProgram runs the generated XDP program on crafted frames
// with BPF_PROG_TEST_RUN.
func TestFilterProgram(t *testing.T) {
	testenv.RequireRoot(t)
	raw := make([]byte, 60)
	ethernet.PutEthernet(raw, net.HardwareAddr{2, 0, 0, 0, 0, 2}, net.HardwareAddr{2, 0, 0, 0, 0, 1}, ethernet.EtherTypeWeft)
	arp := make([]byte, 60)
	ethernet.PutEthernet(arp, net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, net.HardwareAddr{2, 0, 0, 0, 0, 1}, 0x0806)
	ports := ethernet.Filter{UDPPorts: []uint16{4789, 9000}}
	et := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	// UDPDst: IPv4 datagrams to that address only (udp4Frame's is
	// 10.0.0.2; high's ends in 200, the top bit of a little-endian
	// 32-bit load, which a sign-extended comparison would miss).
	dst := ethernet.Filter{UDPPorts: []uint16{9000}, UDPDst: netip.MustParseAddr("10.0.0.2")}
	high := udp4Frame(9000, 5, 0)
	copy(high[30:34], []byte{10, 1, 2, 200})
	cases := []struct {
		name  string
		f     ethernet.Filter
		frame []byte
		want  bool
	}{
		{"udp port match", ports, udp4Frame(9000, 5, 0x4000), true},
		{"udp second port", ports, udp4Frame(4789, 5, 0), true},
		{"udp other port", ports, udp4Frame(53, 5, 0), false},
		{"udp with ip options", ports, udp4Frame(9000, 7, 0), true},
		{"non-first fragment", ports, udp4Frame(9000, 5, 0x0010), false},
		{"first fragment", ports, udp4Frame(9000, 5, 0x2000), true},
		{"udp ipv6", ports, udp6Frame(9000), true},
		{"udp ipv6 other port", ports, udp6Frame(80), false},
		{"arp with port filter", ports, arp, false},
		{"truncated ip", ports, udp4Frame(9000, 5, 0)[:30], false},
		{"ethertype match", et, raw, true},
		{"ethertype other", et, arp, false},
		{"ethertype udp", et, udp4Frame(9000, 5, 0), false},
		{"ethernet header only", ports, udp4Frame(9000, 5, 0)[:14], false},
		{"udp to the address", dst, udp4Frame(9000, 5, 0), true},
		{"udp with options to the address", dst, udp4Frame(9000, 7, 0), true},
		{"udp to another address", ethernet.Filter{UDPPorts: []uint16{9000}, UDPDst: netip.MustParseAddr("10.0.0.3")}, udp4Frame(9000, 5, 0), false},
		{"udp to the address, other port", dst, udp4Frame(53, 5, 0), false},
		{"udp ipv6 with an address", dst, udp6Frame(9000), false},
		{"udp to a high address", ethernet.Filter{UDPPorts: []uint16{9000}, UDPDst: netip.MustParseAddr("10.1.2.200")}, high, true},
		{"udp to another high address", ethernet.Filter{UDPPorts: []uint16{9000}, UDPDst: netip.MustParseAddr("10.1.2.201")}, high, false},
		{"all", ethernet.Filter{All: true}, arp, true},
		{"none", ethernet.Filter{}, raw, false},
	}
	for _, c := range cases {
		got, err := ethernet.FilterMatches(c.f, c.frame)
		if err != nil {
			testenv.SkipOn(t, err)
		}
		require.Equal(t, c.want, got, c.name)
	}
	_, err := ethernet.FilterMatches(ethernet.Filter{UDPPorts: make([]uint16, 100)}, raw)
	require.Error(t, err)
	_, err = ethernet.FilterMatches(ethernet.Filter{UDPPorts: []uint16{1}, UDPDst: netip.MustParseAddr("fd00::1")}, raw)
	require.ErrorIs(t, err, fabric.ErrInvalid)
	require.Equal(t, "udp=9000,dst=10.0.0.2", dst.String())
}

func TestParseAddr(t *testing.T) {
	c, err := ethernet.ParseAddr("veth0")
	require.NoError(t, err)
	require.Equal(t, "veth0", c.Interface)
	c, err = ethernet.ParseAddr("eth1:udp=10.0.0.2:5000,local=10.0.0.1,bind=copy,xdp=generic,busypoll=50us,budget=64,window=256,maxmsg=1M,timeout=2s,ethertype=0x88b6")
	require.NoError(t, err)
	require.True(t, c.UDP)
	require.Equal(t, netip.MustParseAddr("10.0.0.2"), c.PeerIP)
	require.Equal(t, uint16(5000), c.PeerPort)
	require.Equal(t, netip.MustParseAddr("10.0.0.1"), c.LocalIP)
	require.Equal(t, 256, c.Window)
	require.Equal(t, 1<<20, c.MaxMsgSize)
	require.Equal(t, 64, c.BusyPoll.Budget)
	require.Equal(t, uint16(0x88b6), c.EtherType)
	for _, bad := range []string{"", ":queue=1", "eth0:queue=x", "eth0:peer=zz", "eth0:nope=1", "eth0:queue", "eth0:xdp=fast", "eth0:ethertype=5", "eth0:netns=a/b"} {
		_, err := ethernet.ParseAddr(bad)
		require.Error(t, err, bad)
	}
	// local= alone is a UDP listener's address; a dial needs udp=.
	c, err = ethernet.ParseAddr("eth0:local=10.0.0.1,netns=n1")
	require.NoError(t, err)
	require.True(t, c.UDP)
	require.Equal(t, "n1", c.Netns)
	_, err = fabric.Open(context.Background(), "ethernet", "eth0:local=10.0.0.1", nil)
	require.ErrorIs(t, err, fabric.ErrInvalid)
	_, err = fabric.Listen(context.Background(), "ethernet", "eth0:peer=02:00:00:00:00:01", nil)
	require.ErrorIs(t, err, fabric.ErrInvalid)
	_, err = fabric.Listen(context.Background(), "ethernet", "eth0:netns=weft-no-such-ns", nil)
	require.ErrorIs(t, err, fabric.ErrInvalid)
}

// The query form is the canonical one and parses to what the older form
// does; every malformed value and unknown key is an error matching
// fabric.ErrInvalid that names the key.
func TestParseAddrQuery(t *testing.T) {
	old, err := ethernet.ParseAddr("eth1:udp=10.0.0.2:5000,local=10.0.0.1,bind=copy,xdp=generic,busypoll=50us,budget=64,window=256,maxmsg=1M,timeout=2s,ethertype=0x88b6,queue=3,netns=n1")
	require.NoError(t, err)
	c, err := ethernet.ParseAddr("eth1?udp=10.0.0.2:5000&local=10.0.0.1&bind=copy&xdp=generic&busypoll=50us&budget=64&window=256&maxmsg=1M&timeout=2s&ethertype=0x88b6&queue=3&netns=n1")
	require.NoError(t, err)
	require.Equal(t, old, c)
	require.Equal(t, 3, c.Queue)
	require.True(t, c.BusyPoll.Prefer)
	c, err = ethernet.ParseAddr("eth0?peer=02:00:00:00:00:02")
	require.NoError(t, err)
	require.Equal(t, "02:00:00:00:00:02", c.PeerMAC.String())
	for _, bad := range []struct{ addr, key string }{
		{"eth0?queue=x", "queue"}, {"eth0?queue=-1", "queue"}, {"eth0?peer=zz", "peer"}, {"eth0?udp=fd00::1", "udp"},
		{"eth0?local=x", "local"}, {"eth0?netns=a/b", "netns"}, {"eth0?ethertype=5", "ethertype"},
		{"eth0?xdp=fast", "xdp"}, {"eth0?bind=dma", "bind"}, {"eth0?busypoll=-1s", "busypoll"},
		{"eth0?timeout=soon", "timeout"}, {"eth0?budget=-1", "budget"}, {"eth0?window=4G", "window"},
		{"eth0?maxmsg=1T", "maxmsg"}, {"eth0?listener=2", "listener"}, {"eth0?nope=1", "nope"}, {"eth0:queue=1,nope=1", "nope"}, {"eth0:queue", "queue"},
	} {
		_, err := ethernet.ParseAddr(bad.addr)
		require.ErrorIs(t, err, fabric.ErrInvalid, bad.addr)
		require.Contains(t, err.Error(), bad.key, bad.addr)
	}
	for _, bad := range []string{"?queue=1", "eth0:queue=1?x=1", "eth0?%zz"} {
		_, err := ethernet.ParseAddr(bad)
		require.ErrorIs(t, err, fabric.ErrInvalid, bad)
	}
}

func TestParseUDP4(t *testing.T) {
	f := udp4Frame(9000, 5, 0x4000)
	var h ethernet.UDP4
	p, ok := ethernet.ParseUDP4(f, &h)
	require.True(t, ok)
	require.Len(t, p, 16)
	require.Equal(t, uint16(9000), h.DstPort)
	require.Equal(t, netip.MustParseAddr("10.0.0.1"), h.SrcIP)
	f[24] ^= 0xff // corrupt the header checksum
	_, ok = ethernet.ParseUDP4(f, nil)
	require.False(t, ok)
	_, ok = ethernet.ParseUDP4(f[:20], nil)
	require.False(t, ok)

	// Each header field at and past its bound, the checksum kept right.
	for _, c := range []struct {
		name string
		mod  func(f []byte) []byte
		ok   bool
	}{
		{"as built", func(f []byte) []byte { return f }, true},
		{"IP version 6", func(f []byte) []byte { f[14] = 0x65; return f }, false},
		{"IHL 4", func(f []byte) []byte { f[14] = 0x44; return f }, false},
		{"not UDP", func(f []byte) []byte { f[23] = 6; return f }, false},
		{"a later fragment", func(f []byte) []byte { f[21] = 1; return f }, false},
		{"a first fragment", func(f []byte) []byte { f[20] |= 0x20; return f }, false},
		{"total length = headers", func(f []byte) []byte { binary.BigEndian.PutUint16(f[16:], 28); f[38], f[39] = 0, 8; return f }, true},
		{"total length < headers", func(f []byte) []byte { binary.BigEndian.PutUint16(f[16:], 27); return f }, false},
		{"total length past the frame", func(f []byte) []byte { binary.BigEndian.PutUint16(f[16:], uint16(len(f)-13)); return f }, false},
		{"total length = the frame", func(f []byte) []byte { binary.BigEndian.PutUint16(f[16:], uint16(len(f)-14)); return f }, true},
		{"UDP length 7", func(f []byte) []byte { f[38], f[39] = 0, 7; return f }, false},
		{"UDP length 8", func(f []byte) []byte { f[38], f[39] = 0, 8; return f }, true},
		{"UDP length past IP", func(f []byte) []byte { f[38], f[39] = 0, 8+16+1; return f }, false},
		{"frame one byte short of its headers", func(f []byte) []byte { return f[:ethernet.UDP4HdrLen-1] }, false},
		{"not IPv4", func(f []byte) []byte { f[12], f[13] = 0x86, 0xdd; return f }, false},
	} {
		f := c.mod(udp4Frame(9000, 5, 0x4000))
		if len(f) > 24 {
			ip := f[14:34]
			ip[10], ip[11] = 0, 0
			var s uint32
			for i := 0; i < 20; i += 2 {
				s += uint32(ip[i])<<8 | uint32(ip[i+1])
			}
			for s > 0xffff {
				s = s>>16 + s&0xffff
			}
			binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
		}
		_, ok := ethernet.ParseUDP4(f, nil)
		require.Equal(t, c.ok, ok, c.name)
	}
}

// TestBadAddrs: every address that cannot be valid fails through
// fabric.Open and fabric.Listen at once, with a nil interface and an
// error matching fabric.ErrInvalid that names the key, or the interface
// name at fault (malformed, or naming no interface).
func TestBadAddrs(t *testing.T) {
	testenv.RequireRoot(t)
	cases := fabrictest.BadAddrs("lo", "queue", "peer", "listener", "udp", "local", "ethertype", "xdp", "bind",
		"busypoll", "budget", "window", "maxmsg", "timeout")
	cases = append(cases,
		fabrictest.BadAddr{Addr: "weftnosuchif0", Name: "no such interface"},
		fabrictest.BadAddr{Addr: "lo\x00", Name: "interface name"},
		fabrictest.BadAddr{Addr: "\x00", Name: "interface name"},
		fabrictest.BadAddr{Addr: "a/b", Name: "interface name"},
		fabrictest.BadAddr{Addr: "a b", Name: "interface name"},
		fabrictest.BadAddr{Addr: "..", Name: "interface name"},
		fabrictest.BadAddr{Addr: "abcdefghijklmnop", Name: "interface name"},
		fabrictest.BadAddr{Addr: "lo?queue=-1", Name: "queue"},
		fabrictest.BadAddr{Addr: "lo?ethertype=0x5ff", Name: "ethertype"},
		fabrictest.BadAddr{Addr: "lo?netns=a/b", Name: "netns"},
		fabrictest.BadAddr{Addr: "lo?netns=weftnosuchns", Name: "weftnosuchns"},
		fabrictest.BadAddr{Addr: "lo:queue", Name: "queue"},
	)
	fabrictest.TestBadAddrs(t, "ethernet", cases)
}
