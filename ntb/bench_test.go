package ntb

import (
	"context"
	"testing"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

func BenchmarkEndpoint(b *testing.B) {
	fabrictest.Benchmark(b, func(b *testing.B) (fabric.Endpoint, fabric.Endpoint) {
		x, y := pair(b, ShmConfig{}, Config{})
		return x, y
	})
}

// BenchmarkLoop sends a burst and receives it on the same goroutine: the
// software cost per message without any cross-core traffic.
func BenchmarkLoop(b *testing.B) {
	x, y := pair(b, ShmConfig{}, Config{})
	src, _ := x.Alloc(64, 0)
	dst, _ := y.Alloc(64*32, fabric.AccessLocalWrite)
	sm := make([]fabric.Message, 32)
	rm := make([]fabric.Message, 32)
	for i := range sm {
		sm[i] = fabric.Message{SGEs: []fabric.SGE{fabric.SGEOf(src)}}
		rm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: 64 * i, Length: 64}}}
	}
	b.ReportAllocs()
	msgs := 0
	for b.Loop() {
		n, err := x.Send(sm)
		if err != nil {
			b.Fatal(err)
		}
		for got := 0; got < n; {
			k, err := y.Recv(rm[:n-got])
			if err != nil {
				b.Fatal(err)
			}
			got += k
		}
		msgs += n
	}
	// Send may take fewer than the burst: count what went through.
	b.ReportMetric(float64(msgs)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
}

// TestZeroAllocs checks that the message paths, copying and zero-copy,
// allocate nothing per burst.
func TestZeroAllocs(t *testing.T) {
	x, y := pair(t, ShmConfig{}, Config{})
	src, _ := x.Alloc(1024, 0)
	dst, _ := y.Alloc(1024*8, fabric.AccessLocalWrite)
	sm := make([]fabric.Message, 8)
	rm := make([]fabric.Message, 8)
	for i := range sm {
		sm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Length: 64 + 100*i}}, Flags: fabric.FlagImm, Imm: uint32(i)}
		rm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: 1024 * i, Length: 1024}}}
	}
	views := make([]fabric.View, 8)
	ctx := context.Background()
	burst := func(recv func() int) {
		n, err := x.Send(sm)
		if err != nil || n != len(sm) {
			t.Fatalf("Send = %d, %v", n, err)
		}
		for got := 0; got < n; {
			got += recv()
		}
	}
	for name, recv := range map[string]func() int{
		"Recv":     func() int { k, _ := y.Recv(rm); return k },
		"RecvWait": func() int { k, _ := y.RecvWait(ctx, rm); return k },
		"RecvViews": func() int {
			k, _ := y.RecvViews(views)
			y.ReleaseViews(k)
			return k
		},
		"RecvViewsWait": func() int {
			k, _ := y.RecvViewsWait(ctx, views)
			y.ReleaseViews(k)
			return k
		},
	} {
		if a := testing.AllocsPerRun(200, func() { burst(recv) }); a != 0 {
			t.Errorf("Send + %s: %v allocations per burst", name, a)
		}
	}
}
