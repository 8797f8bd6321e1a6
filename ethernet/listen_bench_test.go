package ethernet_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// BenchmarkConnect measures connection setup: each iteration makes 64
// concurrent dials from namespace B to one listener in namespace A over
// a veth pair and accepts them all; it reports connections per second
// and the 99th percentile of the dial latency (Open or Dial called to
// returned). "tcp" does the same with Go's TCP Dial and Accept over the
// same veth pair in the same run, as the reference. Every dial enters
// the namespace the same way (a locked thread, setns) in both.
func BenchmarkConnect(b *testing.B) {
	const dials = 64
	lt := newListenTopo(b, "")
	b.Run("ethernet", func(b *testing.B) {
		l := fabrictest.Listen(b, "ethernet", lt.listen, &fabric.Options{Backlog: 2 * dials})
		addr := lt.dial(l)
		benchConnect(b, dials, func(ctx context.Context) (func(), error) {
			ep, err := fabric.Open(ctx, "ethernet", addr, nil)
			if err != nil {
				return nil, err
			}
			return func() { ep.Close() }, nil
		}, func(ctx context.Context) (func(), error) {
			ep, err := l.Accept(ctx)
			if err != nil {
				return nil, err
			}
			return func() { ep.Close() }, nil
		})
	})
	b.Run("tcp", func(b *testing.B) {
		var ln net.Listener
		if err := lt.p.A.Do(func() (err error) { ln, err = net.Listen("tcp", lt.p.IPA.String()+":0"); return }); err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		addr := ln.Addr().String()
		var d net.Dialer
		benchConnect(b, dials, func(ctx context.Context) (func(), error) {
			var c net.Conn
			err := lt.p.B.Do(func() (err error) { c, err = d.DialContext(ctx, "tcp", addr); return })
			if err != nil {
				return nil, err
			}
			return func() { c.Close() }, nil
		}, func(ctx context.Context) (func(), error) {
			c, err := ln.Accept()
			if err != nil {
				return nil, err
			}
			return func() { c.Close() }, nil
		})
	})
}

func benchConnect(b *testing.B, dials int, dial, accept func(context.Context) (func(), error)) {
	var lat []time.Duration
	var mu sync.Mutex
	var busy time.Duration
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		closers := make(chan func(), 2*dials)
		errs := make(chan error, 2*dials)
		start := time.Now()
		var wg sync.WaitGroup
		for range dials {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				c, err := dial(ctx)
				d := time.Since(t0)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				closers <- c
			}()
		}
		for range dials {
			c, err := accept(ctx)
			if err != nil {
				errs <- err
				break
			}
			closers <- c
		}
		wg.Wait()
		busy += time.Since(start)
		cancel()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		// Closing is not connection setup: keep it out of the rates.
		b.StopTimer()
		close(closers)
		var cw sync.WaitGroup
		for c := range closers {
			cw.Add(1)
			go func() { defer cw.Done(); c() }()
		}
		cw.Wait()
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/busy.Seconds(), "conns/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
}

// BenchmarkListenPair runs the message-path benchmarks over pairs made
// by Listen and Accept (they report allocations: zero per message).
func BenchmarkListenPair(b *testing.B) {
	lt := newListenTopo(b, "")
	fabrictest.Benchmark(b, func(b *testing.B) (a, z fabric.Endpoint) {
		a, z = fabrictest.ListenPairDial(b, "ethernet", lt.listen, lt.dial, nil)
		b.Cleanup(func() { a.Close(); z.Close() })
		return a, z
	})
}

// TestDataPathAllocs: Send and Recv of an accepted connection allocate
// nothing per message, beside other connections on the same queues.
func TestDataPathAllocs(t *testing.T) {
	lt := newListenTopo(t, "")
	a, b := fabrictest.ListenPairDial(t, "ethernet", lt.listen, lt.dial, nil)
	defer a.Close()
	defer b.Close()
	c, d := fabrictest.ListenPairDial(t, "ethernet", lt.listen, lt.dial, nil)
	defer c.Close()
	defer d.Close()
	ctx := context.Background()
	src, _ := b.Alloc(1500, 0)
	dst, _ := a.Alloc(1500, fabric.AccessLocalWrite)
	smsg := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}, Flags: fabric.FlagImm, Imm: 7}}
	rmsg := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(dst)}}}
	round := func() {
		if _, err := b.SendWait(ctx, smsg); err != nil {
			t.Fatal(err)
		}
		if _, err := a.RecvWait(ctx, rmsg); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		round()
	}
	if n := testing.AllocsPerRun(2000, round); n != 0 {
		t.Fatalf("%v allocations per message", n)
	}
}
