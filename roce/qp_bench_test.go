package roce

import (
	"net/netip"
	"testing"
)

// BenchmarkCreateQP measures what a queue pair costs to create and
// destroy with the default configuration (the one the listener and the
// multi-peer endpoint use): B/op is the memory a QP allocates, QPs/s the
// creation rate without the network exchange. Compare with BenchmarkListen
// for the whole connection setup.
func BenchmarkCreateQP(b *testing.B) {
	e, err := NewEngine(EngineConfig{Link: discardLink{netip.MustParseAddrPort("127.0.0.1:4791")}})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	pd := e.AllocPD()
	b.ReportAllocs()
	for b.Loop() {
		qp, err := pd.CreateQP(QPConfig{})
		if err != nil {
			b.Fatal(err)
		}
		qp.Destroy()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "QPs/s")
}
