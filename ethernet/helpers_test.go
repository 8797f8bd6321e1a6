package ethernet_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
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
