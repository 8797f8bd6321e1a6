package ethernet_test

import (
	"testing"

	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/internal/netns"
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
