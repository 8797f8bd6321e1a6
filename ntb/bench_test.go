package ntb

import (
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
	for b.Loop() {
		n, _ := x.Send(sm)
		for got := 0; got < n; {
			k, _ := y.Recv(rm[:n-got])
			got += k
		}
	}
	b.ReportMetric(float64(b.N*32)/b.Elapsed().Seconds()/1e6, "Mmsg/s")
}
