package ethernet_test

import (
	"context"
	"testing"
	"time"

	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/internal/netns"
	"golang.org/x/sys/unix"
)

// BenchmarkQueueBurst sends and receives bursts of 64 raw 60-byte
// frames through a veth pair with the Port/Queue API, on one goroutine.
// It reports packets per second and allocations (zero per packet).
func BenchmarkQueueBurst(b *testing.B) {
	p := newPair(b, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	qa := openPort(b, p.A, p.NameA, &ethernet.Config{}).Queue(0)
	qb := openPort(b, p.B, p.NameB, &ethernet.Config{Filter: f}).Queue(0)
	tx := make([]ethernet.Frame, 64)
	rx := make([]ethernet.Frame, 64)
	n := qa.Alloc(tx)
	for i := 0; i < n; i++ {
		ethernet.PutEthernet(qa.Buffer(tx[i]), p.MACB, p.MACA, ethernet.EtherTypeWeft)
	}
	qa.Release(tx[:n])
	// Every frame of A's pool carries the header from now on.
	all := make([]ethernet.Frame, 4096)
	m := qa.Alloc(all)
	for i := 0; i < m; i++ {
		ethernet.PutEthernet(qa.Buffer(all[i]), p.MACB, p.MACA, ethernet.EtherTypeWeft)
	}
	qa.Release(all[:m])
	b.ReportAllocs()
	b.ResetTimer()
	got := 0
	for got < b.N {
		k := qa.Alloc(tx[:min(64, b.N-got)])
		for i := 0; i < k; i++ {
			tx[i].Len = 60
		}
		s, _ := qa.Send(tx[:k])
		if s < k {
			qa.Release(tx[s:k])
		}
		r, _ := qb.Recv(rx)
		qb.Release(rx[:r])
		got += r
		if s == 0 && r == 0 {
			qa.Flush()
		}
	}
	b.ReportMetric(float64(got)/b.Elapsed().Seconds()/1e6, "Mpps")
}

// BenchmarkQueueWake bounces one frame between two queues over a veth
// pair; each side blocks for it without spinning (Spin < 0), so every
// receive sleeps and is woken by the frame: it measures the round trip
// of two wake-ups, and the allocations of the blocking path (none with
// context.Background or PollFor; "RecvWait/cancel" uses a context that
// can be cancelled). The echo side always uses RecvWait with
// context.Background.
func BenchmarkQueueWake(b *testing.B) {
	p := newPair(b, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	cfg := &ethernet.Config{Filter: f, Spin: -1, Frames: 256, RingSize: 64}
	qa := openPort(b, p.A, p.NameA, cfg).Queue(0)
	qb := openPort(b, p.B, p.NameB, cfg).Queue(0)
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		rx := make([]ethernet.Frame, 4)
		tx := make([]ethernet.Frame, 4)
		for {
			n, err := qb.RecvWait(context.Background(), rx)
			if err != nil {
				return
			}
			qb.Release(rx[:n])
			// Received frames return to the pool: write the header
			// each time.
			k := qb.Alloc(tx[:n])
			for i := 0; i < k; i++ {
				ethernet.PutEthernet(qb.Buffer(tx[i]), p.MACA, p.MACB, ethernet.EtherTypeWeft)
				tx[i].Len = 60
			}
			s, _ := qb.Send(tx[:k])
			qb.Release(tx[s:k])
		}
	}()
	b.Cleanup(func() {
		qb.Socket().Close()
		<-echoDone
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waits := []struct {
		name string
		recv func(rx []ethernet.Frame) (int, error)
	}{
		{"RecvWait/background", func(rx []ethernet.Frame) (int, error) { return qa.RecvWait(context.Background(), rx) }},
		{"RecvWait/cancel", func(rx []ethernet.Frame) (int, error) { return qa.RecvWait(ctx, rx) }},
		{"PollFor", func(rx []ethernet.Frame) (int, error) {
			for {
				n, err := qa.Recv(rx)
				if n > 0 || err != nil {
					return n, err
				}
				if _, err := qa.Socket().PollFor(unix.POLLIN, time.Second); err != nil {
					return 0, err
				}
			}
		}},
	}
	for _, w := range waits {
		b.Run(w.name, func(b *testing.B) {
			tx := make([]ethernet.Frame, 1)
			rx := make([]ethernet.Frame, 4)
			b.ReportAllocs()
			for b.Loop() {
				if qa.Alloc(tx) != 1 {
					qa.Flush()
					continue
				}
				ethernet.PutEthernet(qa.Buffer(tx[0]), p.MACB, p.MACA, ethernet.EtherTypeWeft)
				tx[0].Len = 60
				if s, err := qa.Send(tx); s != 1 || err != nil {
					b.Fatalf("send: %d, %v", s, err)
				}
				n, err := w.recv(rx)
				if err != nil {
					b.Fatal(err)
				}
				qa.Release(rx[:n])
			}
		})
	}
}
