package batch_test

import (
	"testing"
	"time"

	"github.com/weft-io/weft/batch"
	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/ntb"
)

// TestZeroAllocs checks that the per-packet paths allocate nothing: Add,
// AddBurst, Flush, Tick, Poll, Reclaim on the sender; Recv and Release on
// the receiver, for good batches and for malformed ones.
func TestZeroAllocs(t *testing.T) { bothModes(t, testZeroAllocs) }

func testZeroAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	a, b := pair(t, ntb.Config{})
	c := newCoalescer(t, a, &batch.Options{Deadline: time.Nanosecond})
	s := newSplitter(t, b, nil)
	src, _ := a.Alloc(4096, 0)
	sges := make([]fabric.SGE, 16)
	cookies := make([]uint64, 64)
	for i := range sges {
		sges[i] = fabric.SGE{Region: src, Offset: 100 * i, Length: 64 + i}
	}
	pkts := make([]batch.Packet, 64)
	drain := func(want int) {
		for got := 0; got < want; {
			n, err := s.Recv(pkts)
			if err != nil {
				t.Fatal(err)
			}
			s.Release(pkts[:n])
			got += n
		}
	}
	now := time.Now()
	cases := map[string]func(){
		"Add+Flush": func() {
			for i := range 5 {
				c.Add(sges[i], uint64(i))
			}
			c.Flush()
			c.Reclaim(cookies)
			drain(5)
		},
		"AddBurst+Tick": func() {
			c.AddBurst(sges, cookies[:16])
			now = now.Add(time.Second)
			c.Tick(now)
			c.Reclaim(cookies)
			drain(16)
		},
		"Add+Poll": func() {
			c.Add(sges[3], 3)
			for c.Open() != 0 {
				c.Poll()
			}
			c.Reclaim(cookies)
			drain(1)
		},
		"Idle": func() {
			c.Poll()
			c.Reclaim(cookies)
			s.Recv(pkts)
		},
	}
	for name, f := range cases {
		f() // warm up
		if n := testing.AllocsPerRun(200, f); n != 0 {
			t.Errorf("%s: %.1f allocations per run", name, n)
		}
	}
	// Malformed batches are dropped without allocating.
	copy(src.Bytes(), "XB\x01\x00\x01\x00\x0e\x00\x00\x00\x00\x00\x01\x00z")
	bad := []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 15}}, Flags: fabric.FlagImm, Imm: batch.Imm}}
	n := testing.AllocsPerRun(200, func() {
		a.Send(bad)
		for {
			if _, err := s.Recv(pkts); err != nil {
				break
			}
		}
	})
	if n != 0 {
		t.Errorf("malformed: %.1f allocations per run", n)
	}
}
