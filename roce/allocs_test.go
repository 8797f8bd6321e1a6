package roce

import (
	"context"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// TestZeroAllocs checks that the RC message paths allocate nothing, on
// either engine: posting sends and RDMA writes, and receiving by copy and
// as views, for a single message and for a burst. The benchmarks report
// allocations per message, where one allocation per burst rounds down to
// zero; here every send, burst or not, must cost none.
func TestZeroAllocs(t *testing.T) {
	x, y := rcPair(t, "keepalive=0")
	const burst = 8
	src, _ := x.Alloc(1024, 0)
	dst, _ := y.Alloc(1024*burst, fabric.AccessLocalWrite|fabric.AccessRemoteWrite)
	sm := make([]fabric.Message, burst)
	rm := make([]fabric.Message, burst)
	for i := range sm {
		sm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: src, Length: 64 + 100*i}}, Flags: fabric.FlagImm, Imm: uint32(i)}
		rm[i] = fabric.Message{SGEs: []fabric.SGE{{Region: dst, Offset: 1024 * i, Length: 1024}}}
	}
	wm := []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 512}}, Remote: dst.Remote().Slice(0, 512), Flags: fabric.FlagSignal, Context: 9}}
	views := make([]fabric.View, burst)
	comps := make([]fabric.Completion, 4)
	ctx := context.Background()
	send := func(k int) {
		for sent := 0; sent < k; {
			n, err := x.SendWait(ctx, sm[sent:k])
			if err != nil {
				t.Fatalf("SendWait: %v", err)
			}
			sent += n
		}
	}
	recvs := map[string]func(k int) int{
		"Recv": func(k int) int { n, _ := y.Recv(rm[:k]); return n },
		"RecvWait": func(k int) int {
			n, err := y.RecvWait(ctx, rm[:k])
			if err != nil {
				t.Fatalf("RecvWait: %v", err)
			}
			return n
		},
		"RecvViews": func(k int) int {
			n, _ := y.RecvViews(views[:k])
			y.ReleaseViews(n)
			return n
		},
		"RecvViewsWait": func(k int) int {
			n, err := y.RecvViewsWait(ctx, views[:k])
			if err != nil {
				t.Fatalf("RecvViewsWait: %v", err)
			}
			y.ReleaseViews(n)
			return n
		},
	}
	for _, k := range []int{1, burst} {
		for name, recv := range recvs {
			run := func() {
				send(k)
				for got := 0; got < k; {
					got += recv(k - got)
				}
			}
			run() // warm up
			if a := testing.AllocsPerRun(200, run); a != 0 {
				t.Errorf("%d × Send + %s: %v allocations per run", k, name, a)
			}
		}
	}
	write := func() {
		if n, err := x.Write(wm); n != 1 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		for {
			n, err := x.CQ().Wait(ctx, comps)
			if err != nil {
				t.Fatalf("waiting for the write: %v", err)
			}
			if n > 0 && comps[n-1].Context == 9 {
				break
			}
		}
	}
	write()
	if a := testing.AllocsPerRun(200, write); a != 0 {
		t.Errorf("Write + completion: %v allocations per run", a)
	}
}
