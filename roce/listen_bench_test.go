package roce

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
)

// benchDials is the number of concurrent dials per round of
// BenchmarkListen.
const benchDials = 64

// BenchmarkListen measures connection setup: each round, benchDials
// clients dial one listener at once and it accepts them all. It reports
// connections per second and the 99th percentile of a dial's latency
// (until the dialer's endpoint is ready), for the roce engine and, as the
// reference measured in the same run, Go's TCP Dial and Accept on
// loopback.
func BenchmarkListen(b *testing.B) {
	b.Run("roce", func(b *testing.B) {
		host, peer := testHosts()
		ctx := context.Background()
		l, err := fabric.Listen(ctx, "roce", host+":0", &fabric.Options{Backlog: 2 * benchDials})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		// Keep the dialers' engine up between rounds.
		_, release, err := acquireEngine(netip.AddrPortFrom(netip.MustParseAddr(peer), 0), false, false, false)
		if err != nil {
			b.Fatal(err)
		}
		defer release()
		addr := l.Addr() + "?local=" + peer
		benchRounds(b, func() (func() error, func() (func(), error)) {
			var ep fabric.Endpoint
			dial := func() error {
				var err error
				ep, err = fabric.Open(ctx, "roce", addr, nil)
				return err
			}
			accept := func() (func(), error) {
				a, err := l.Accept(ctx)
				if err != nil {
					return nil, err
				}
				return func() { a.Close(); ep.Close() }, nil
			}
			return dial, accept
		})
	})
	b.Run("tcp", func(b *testing.B) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		addr := l.Addr().String()
		benchRounds(b, func() (func() error, func() (func(), error)) {
			var c net.Conn
			dial := func() error {
				var err error
				c, err = net.Dial("tcp", addr)
				return err
			}
			accept := func() (func(), error) {
				a, err := l.Accept()
				if err != nil {
					return nil, err
				}
				return func() { a.Close(); c.Close() }, nil
			}
			return dial, accept
		})
	})
}

// benchRounds runs b.N rounds of benchDials concurrent dials and as many
// accepts; conn returns, for one connection, its dial and an accept that
// returns how to close the pair. Closing is not timed.
func benchRounds(b *testing.B, conn func() (dial func() error, accept func() (func(), error))) {
	lat := make([]time.Duration, 0, b.N*benchDials)
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		dials := make([]func() error, benchDials)
		accepts := make([]func() (func(), error), benchDials)
		for i := range dials {
			dials[i], accepts[i] = conn()
		}
		times := make([]time.Duration, benchDials)
		errs := make(chan error, benchDials)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range dials {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				if err := dials[i](); err != nil {
					errs <- err
				}
				times[i] = time.Since(t0)
			}()
		}
		closers := make([]func(), 0, benchDials)
		for i := range accepts {
			c, err := accepts[i]()
			if err != nil {
				b.Fatal(err)
			}
			closers = append(closers, c)
		}
		wg.Wait()
		total += time.Since(start)
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		lat = append(lat, times...)
		b.StopTimer()
		// Accepts are in arrival order, dials in launch order: close
		// every pair once all are up.
		for _, c := range closers {
			c()
		}
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/total.Seconds(), "conns/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
}
