package roce

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
	"github.com/weft-io/weft/internal/netns"
	"github.com/weft-io/weft/internal/testenv"
)

// BenchmarkVeth runs the engine's message-path benchmarks and the Go TCP
// reference between two network namespaces joined by a veth pair (MTU
// 9000, so that the engines' path MTU of 4096 fits a frame), the second
// path issue 14 measures besides loopback. Needs root:
//
//	go test -run XXX -bench 'Veth/.*/(Stream|PingPong)/64' -count 3 ./roce/
func BenchmarkVeth(b *testing.B) {
	p := vethNS(b)
	for _, q := range []struct{ name, query string }{
		{"Engine", "mtu=4096&keepalive=0"},
		{"EngineNoRaw", "mtu=4096&keepalive=0&raw=0"},
		{"EngineGSO", "mtu=4096&keepalive=0&gso=1"},
	} {
		b.Run(q.name, func(b *testing.B) {
			fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
				return vethPair(b, p, q.query)
			})
		})
	}
	b.Run("TCP", func(b *testing.B) {
		for _, size := range []int{64, 65536} {
			b.Run("Stream/"+sizeName(size), func(b *testing.B) {
				c, s := vethTCP(b, p)
				benchTCPStream(b, c, s, size)
			})
		}
		b.Run("PingPong/64B", func(b *testing.B) {
			c, s := vethTCP(b, p)
			benchTCPPingPong(b, c, s, 64)
		})
	})
}

// vethNS makes two namespaces joined by a veth pair of MTU 9000, removed
// when t ends; it needs root.
func vethNS(t testing.TB) *netns.Pair {
	testenv.RequireRoot(t)
	p, err := netns.NewPair(netns.PairConfig{MTU: 9000, StaticNeigh: true})
	if err != nil {
		testenv.SkipOrFail(t, "veth pair: "+err.Error())
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// vethPair opens an RC pair of engines, one in each namespace of p, each
// made by a thread inside its namespace.
func vethPair(b testing.TB, p *netns.Pair, query string) (fabric.Endpoint, fabric.Endpoint) {
	port := freePort(b)
	x, y := fabrictest.OpenPair(b, 0, func(ctx context.Context, s fabrictest.Side) (fabric.Endpoint, error) {
		ns, addr := p.A, fmt.Sprintf("listen:%s:%d?%s", p.IPA, port, query)
		if s == fabrictest.SideB {
			ns, addr = p.B, fmt.Sprintf("%s:%d?local=%s&%s", p.IPA, port, p.IPB, query)
		}
		var ep fabric.Endpoint
		err := ns.Do(func() (err error) {
			ep, err = fabric.Open(ctx, "roce", addr, nil)
			return err
		})
		return ep, err
	})
	return x, y
}

// vethTCP opens a Go TCP connection from p's namespace B to A.
func vethTCP(b *testing.B, p *netns.Pair) (c, s net.Conn) {
	return tcpPairVia(b, func() (l net.Listener, err error) {
		err = p.A.Do(func() error {
			l, err = net.Listen("tcp", net.JoinHostPort(p.IPA.String(), "0"))
			return err
		})
		return l, err
	}, func(addr string) (c net.Conn, err error) {
		err = p.B.Do(func() error {
			c, err = net.Dial("tcp", addr)
			return err
		})
		return c, err
	})
}

// TestConformanceVeth runs the conformance suite between engines in two
// network namespaces of one process, joined by a veth pair, each engine
// made by a thread inside its namespace (the way a program that manages
// namespaces makes them) and driven by any thread afterwards. Every
// queue pair sends from a UDP source port of its own, through a socket
// the link makes on first use: made in the sending thread's namespace
// instead of the link's, it could not bind there, the link sent from
// port 4791 instead, and the peer dropped every datagram for its ICRC.
func TestConformanceVeth(t *testing.T) {
	p := vethNS(t)
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		return vethPair(t, p, "mtu=4096")
	})
}
