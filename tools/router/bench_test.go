package main

import (
	"context"
	"sync"
	"testing"
	"time"
)

// meshPair opens nodes 0 and 1 of a 2-node back-plane bp in this process.
func meshPair(tb testing.TB, bp string) (*Backplane, *Backplane) {
	dir := tb.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var bps [2]*Backplane
	var errs [2]error
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bps[i], errs[i] = openBackplane(ctx, NodeConfig{Rank: i, Nodes: 2, Backplane: bp, Dir: dir, Settings: DefaultSettings}, nil)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("node %d: %v", i, err)
		}
		tb.Cleanup(func() { bps[i].Close() })
	}
	bps[0].ctx, bps[1].ctx = context.Background(), context.Background()
	return bps[0], bps[1]
}

// BenchmarkForward measures the forwarding loop of an ingress node whose
// packets all belong to the other node: validation, FIB lookup, TTL and
// checksum, staging and hand-off over the back-plane, and the peer taking
// them off it, per packet and with allocations per packet (the goal is 0).
// The AF_XDP ports are left out, so it needs no privileges; they are
// measured by the router itself.
func BenchmarkForward(b *testing.B) {
	for _, bp := range []string{"ntb", "ntb+batch"} {
		b.Run(bp, func(b *testing.B) { benchForward(b, bp) })
	}
}

func benchForward(b *testing.B, bp string) {
	fib, err := GenFIB(100000, 2, nil)
	if err != nil {
		b.Fatal(err)
	}
	dsts := make([][4]byte, 4096)
	GenFIB(100000, 2, dsts)
	var frames [][]byte
	for _, d := range dsts {
		if r, _ := fib.Lookup(d); r.Owner == 1 {
			frames = append(frames, frame(64, d, 255))
		}
		if len(frames) == 256 {
			break
		}
	}
	a, peer := meshPair(b, bp)
	f := &Forwarder{fib: fib, rank: 0, bp: a, links: a.links}
	got := 0
	count := func([]byte) { got++ }
	b.ReportAllocs()
	b.SetBytes(64)
	b.ResetTimer()
	sent := 0
	for i := 0; sent < b.N; i++ {
		for k := range 32 {
			fr := frames[(i*32+k)%len(frames)]
			if fr[22] < 2 {
				fr[22] = 255
				resum(fr)
			}
			f.handle(fr)
		}
		sent += 32
		now := time.Now()
		a.Flush(a.links[1], now)
		for {
			n, _ := peer.links[0].Receive(count)
			if n == 0 {
				break
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for got < sent-int(f.st.BPDrop) && time.Now().Before(deadline) {
		a.Flush(a.links[1], time.Now())
		peer.links[0].Receive(count)
	}
	b.StopTimer()
	if f.c[Forward] != uint64(sent) || got != sent-int(f.st.BPDrop) {
		b.Fatalf("forwarded %d of %d, delivered %d, back-plane drops %d", f.c[Forward], sent, got, f.st.BPDrop)
	}
	b.ReportMetric(float64(f.st.BPDrop)/float64(sent), "drops/op")
}
