package roce

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// shmAddr returns a random loopback address for a ShmLink ring: rings are
// named after addresses host-wide, so tests of concurrent runs must not
// share one.
func shmAddr() netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(250))})
}

// shmAddrPair connects two endpoints over ShmLinks, with the TCP exchange
// on loopback.
func shmAddrPair(t testing.TB, query string) (a, b *Endpoint) {
	t.Helper()
	return shmAddrPairOpts(t, query, nil)
}

// shmAddrPairOpts is shmAddrPair with fabric options (nil: the defaults).
func shmAddrPairOpts(t testing.TB, query string, opts *fabric.Options) (a, b *Endpoint) {
	t.Helper()
	return loopPair(t, "link=shm&"+query, "link=shm&"+query, opts)
}

// loopPair connects two endpoints on two random loopback addresses (see
// shmAddr), a listening with the parameters qa and b dialing with qb,
// with the TCP exchange on 127.0.0.1.
func loopPair(t testing.TB, qa, qb string, opts *fabric.Options) (a, b *Endpoint) {
	t.Helper()
	return loopPairAt(t, shmAddr(), qa, qb, opts)
}

// loopPairAt is loopPair with a at the address la.
func loopPairAt(t testing.TB, la netip.Addr, qa, qb string, opts *fabric.Options) (a, b *Endpoint) {
	t.Helper()
	port := freePort(t)
	lb := shmAddr()
	for lb == la {
		lb = shmAddr()
	}
	return fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, s fabrictest.Side) (*Endpoint, error) {
		addr := fmt.Sprintf("listen:127.0.0.1:%d?local=%s&%s", port, la, qa)
		if s == fabrictest.SideB {
			addr = fmt.Sprintf("127.0.0.1:%d?local=%s&%s", port, lb, qb)
		}
		ep, err := fabric.Open(ctx, "roce", addr, opts)
		if err != nil {
			return nil, err
		}
		return ep.(*Endpoint), nil
	})
}

func TestConformanceShm(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := shmAddrPair(t, "")
		return a, b
	})
}

// The same cases with the peer in another process: real shared memory
// between two address spaces.
func TestConformanceShmProcesses(t *testing.T) {
	fabrictest.TestProcesses(t, func(t testing.TB, key string, side fabrictest.Side) fabric.Endpoint {
		local := shmAddr().String()
		return processSide(t, "weft-roce-shm-ft-"+key, side, "listen:127.0.0.1:%d?link=shm&local="+local, "127.0.0.1:%d?link=shm&local="+local)
	})
}

// BenchmarkEngineShm is BenchmarkEngine over ShmLinks: the engines of
// one host without the kernel's network stack. Run it beside
// BenchmarkEngine and BenchmarkTCP.
func BenchmarkEngineShm(b *testing.B) {
	fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
		x, y := shmAddrPair(b, "mtu=4096&keepalive=0")
		return x, y
	})
}

// BenchmarkEngineShmBlock is BenchmarkEngineShm with Spin -1: blocking
// calls sleep at once, so every message that finds its receiver idle
// goes through the link's sleep and wake-up (WaitRead, the bell).
func BenchmarkEngineShmBlock(b *testing.B) {
	fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
		x, y := shmAddrPairOpts(b, "mtu=4096&keepalive=0", &fabric.Options{Spin: -1})
		return x, y
	})
}
