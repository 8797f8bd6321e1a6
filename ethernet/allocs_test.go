package ethernet_test

import (
	"context"
	"testing"

	"github.com/weft-io/weft/ethernet"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/internal/netns"
)

// TestZeroAllocsQueue checks that the raw burst path allocates nothing:
// Alloc, Send, Recv and Release of a single frame and of a burst of 64,
// through a veth pair. BenchmarkQueueBurst reports allocations per frame,
// where one allocation per burst rounds down to zero; here none is allowed.
func TestZeroAllocsQueue(t *testing.T) {
	p := newPair(t, netns.PairConfig{})
	f := ethernet.Filter{EtherTypes: []uint16{ethernet.EtherTypeWeft}}
	qa := openPort(t, p.A, p.NameA, &ethernet.Config{}).Queue(0)
	qb := openPort(t, p.B, p.NameB, &ethernet.Config{Filter: f}).Queue(0)
	// Every frame of A's pool carries the header from now on.
	all := make([]ethernet.Frame, 4096)
	m := qa.Alloc(all)
	for i := 0; i < m; i++ {
		ethernet.PutEthernet(qa.Buffer(all[i]), p.MACB, p.MACA, ethernet.EtherTypeWeft)
	}
	qa.Release(all[:m])
	tx := make([]ethernet.Frame, 64)
	rx := make([]ethernet.Frame, 64)
	ctx := context.Background()
	for _, k := range []int{1, 64} {
		run := func() {
			n := qa.Alloc(tx[:k])
			for i := 0; i < n; i++ {
				tx[i].Len = 60
			}
			s, err := qa.Send(tx[:n])
			if err != nil {
				t.Fatalf("Send: %v", err)
			}
			qa.Release(tx[s:n])
			for got := 0; got < s; {
				r, err := qb.RecvWait(ctx, rx)
				if err != nil {
					t.Fatalf("RecvWait: %v", err)
				}
				qb.Release(rx[:r])
				got += r
			}
		}
		run() // warm up
		if a := testing.AllocsPerRun(200, run); a != 0 {
			t.Errorf("bursts of %d: %v allocations per burst", k, a)
		}
	}
}

// TestZeroAllocsEndpoint checks that the reliable endpoint's message
// paths allocate nothing, for a single message and for a burst, received
// by copy and by busy polling or waiting.
func TestZeroAllocsEndpoint(t *testing.T) {
	x, y := dialPair(t, netns.PairConfig{}, "%s", "%s")
	const burst = 8
	src, _ := x.Alloc(1024, 0)
	dst, _ := y.Alloc(1024*burst, fabric.AccessLocalWrite)
	sm := make([]fabric.Message, burst)
	rm := make([]fabric.Message, burst)
	for i := range sm {
		sm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Length: 64 + 100*i}}, Flags: fabric.FlagImm, Imm: uint32(i)}
		rm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: 1024 * i, Length: 1024}}}
	}
	ctx := context.Background()
	recvs := map[string]func(k int) int{
		"Recv": func(k int) int { n, _ := y.Recv(rm[:k]); return n },
		"RecvWait": func(k int) int {
			n, err := y.RecvWait(ctx, rm[:k])
			if err != nil {
				t.Fatalf("RecvWait: %v", err)
			}
			return n
		},
	}
	for _, k := range []int{1, burst} {
		for name, recv := range recvs {
			run := func() {
				for sent := 0; sent < k; {
					n, err := x.SendWait(ctx, sm[sent:k])
					if err != nil {
						t.Fatalf("SendWait: %v", err)
					}
					sent += n
				}
				for got := 0; got < k; {
					got += recv(k - got)
				}
			}
			run() // warm up
			if a := testing.AllocsPerRun(200, run); a != 0 {
				t.Errorf("%d × SendWait + %s: %v allocations per run", k, name, a)
			}
		}
	}
}
