package netns_test

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestPairUDP(t *testing.T) {
	testenv.RequireLinux(t)
	testenv.RequireRoot(t)
	fds := testenv.FDCount(t)
	// MACs of this run only, so that no other interface on the machine
	// can have them.
	pid := os.Getpid()
	macA := net.HardwareAddr{0x02, 0x5e, byte(pid >> 16), byte(pid >> 8), byte(pid), 1}
	macB := net.HardwareAddr{0x02, 0x5e, byte(pid >> 16), byte(pid >> 8), byte(pid), 2}
	p, err := netns.NewPair(netns.PairConfig{Queues: 2, StaticNeigh: true, MACA: macA, MACB: macB})
	require.NoError(t, err)

	lm, err := p.A.Link("veth0")
	require.NoError(t, err)
	require.Equal(t, p.MACA, lm.Attributes.Address)

	// The host namespace must not see the veth: no host interface has
	// either end's MAC address. The host may have its own veth0, so the
	// name proves nothing.
	host, err := net.Interfaces()
	require.NoError(t, err)
	for _, ifc := range host {
		if bytes.Equal(ifc.HardwareAddr, p.MACA) || bytes.Equal(ifc.HardwareAddr, p.MACB) {
			t.Errorf("host namespace sees %s (%v), an end of the pair", ifc.Name, ifc.HardwareAddr)
		}
	}

	var rx *net.UDPConn
	require.NoError(t, p.B.Do(func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: p.IPB, Port: 9999})
		return err
	}))
	defer rx.Close()
	var tx *net.UDPConn
	require.NoError(t, p.A.Do(func() error {
		var err error
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: p.IPB, Port: 9999})
		return err
	}))
	defer tx.Close()
	_, err = tx.Write([]byte("hello"))
	require.NoError(t, err)
	rx.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, from, err := rx.ReadFromUDP(buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf[:n]))
	require.True(t, from.IP.Equal(p.IPA))

	require.NoError(t, rx.Close())
	require.NoError(t, tx.Close())
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	require.Equal(t, fds, testenv.FDCount(t), "fd leak")
}

func TestNamed(t *testing.T) {
	testenv.RequireLinux(t)
	testenv.RequireRoot(t)
	name := "weft-test-" + time.Now().Format("150405.000000")
	ns, err := netns.NewNamed(name)
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(netns.RunDir, name))
	require.NoError(t, err)
	var st1, st2 unix.Stat_t
	require.NoError(t, unix.Fstat(ns.FD(), &st1))
	require.NoError(t, ns.Do(func() error { return unix.Stat("/proc/thread-self/ns/net", &st2) }))
	require.Equal(t, st1.Ino, st2.Ino)
	require.NoError(t, ns.Close())
	_, err = os.Stat(filepath.Join(netns.RunDir, name))
	require.True(t, os.IsNotExist(err))
}

// TestBridge joins two namespaces through a bridge in a third: a UDP
// datagram from one reaches the other only across the bridge.
func TestBridge(t *testing.T) {
	testenv.RequireLinux(t)
	testenv.RequireRoot(t)
	hub, err := netns.New()
	require.NoError(t, err)
	defer hub.Close()
	require.NoError(t, hub.AddBridge("br0"))
	ends := make([]*netns.NS, 2)
	for i := range ends {
		ends[i], err = netns.New()
		require.NoError(t, err)
		defer ends[i].Close()
		port := "p" + string(rune('0'+i))
		require.NoError(t, hub.AddVeth(netns.VethConfig{Name: port, Peer: "eth0", PeerNS: ends[i]}))
		require.NoError(t, hub.SetMaster(port, "br0"))
		require.NoError(t, hub.Up(port))
		require.NoError(t, ends[i].Up("eth0"))
		require.NoError(t, ends[i].AddAddr("eth0", "10.12.0."+string(rune('1'+i))+"/24"))
	}
	// Unbridged ports forward nothing: the datagram must not arrive
	// before the bridge is up.
	var rx *net.UDPConn
	require.NoError(t, ends[1].Do(func() error {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 12, 0, 2), Port: 9999})
		return err
	}))
	defer rx.Close()
	send := func() {
		require.NoError(t, ends[0].Do(func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 12, 0, 2), Port: 9999})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("hello"))
			return err
		}))
	}
	buf := make([]byte, 64)
	send()
	rx.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, _, err = rx.ReadFromUDP(buf)
	require.Error(t, err, "a datagram crossed a bridge that is down")
	require.NoError(t, hub.Up("br0"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		send() // the first may be lost to ARP while the bridge learns
		rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _, err := rx.ReadFromUDP(buf)
		if err == nil {
			require.Equal(t, "hello", string(buf[:n]))
			break
		}
		require.True(t, time.Now().Before(deadline), "nothing crossed the bridge: %v", err)
	}
}
