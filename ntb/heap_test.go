package ntb

import (
	"errors"
	"testing"

	"github.com/weft-io/weft/fabric"
)

// TestHeapRelease: regions freed in any order give the RMA heap back in
// one piece (freed neighbours merge), including when the heap was full.
func TestHeapRelease(t *testing.T) {
	a, _ := pair(t, ShmConfig{}, ring8K)
	tr := a.t
	total := tr.heapFree()
	q := total / 4 &^ (heapAlign - 1)
	sizes := []int{q, q, q, total - 3*q}
	rs := make([]*fabric.Region, len(sizes))
	for i, n := range sizes {
		r, err := tr.Alloc(n, fabric.AccessRemoteWrite)
		if err != nil {
			t.Fatalf("Alloc %d of %d: %v", n, total, err)
		}
		rs[i] = r
	}
	if f := tr.heapFree(); f != 0 {
		t.Fatalf("%d bytes free with the heap handed out", f)
	}
	if _, err := tr.Alloc(heapAlign, fabric.AccessRemoteWrite); err == nil {
		t.Fatal("Alloc from a full heap")
	}
	// The last region first (into an empty free list), then the middle
	// ones, then the first: every release merges with a neighbour.
	for _, i := range []int{3, 1, 2, 0} {
		if err := rs[i].Close(); err != nil {
			t.Fatal(err)
		}
	}
	if f := tr.heapFree(); f != total {
		t.Fatalf("%d bytes free after every region was closed, want %d", f, total)
	}
	r, err := tr.Alloc(total, fabric.AccessRemoteWrite)
	if err != nil {
		t.Fatalf("the whole heap in one piece after the releases: %v", err)
	}
	r.Close()
	tr.Close()
	if _, err := tr.Alloc(64, fabric.AccessRemoteWrite); !errors.Is(err, fabric.ErrClosed) {
		t.Fatalf("Alloc on a closed transport: %v, want ErrClosed", err)
	}
}

// TestWindowFitsRings: the inbound window holds the control pages and
// every ring: exactly that much is taken (with no RMA heap), a page less
// is refused, and so is a window larger than the device's memory.
func TestWindowFitsRings(t *testing.T) {
	for _, c := range []struct {
		win int
		ok  bool
	}{
		{ringsOff + 2*8192, true},
		{ringsOff + 2*8192 - 4096, false},
		{ringsOff + 8192, false},
		{1 << 20, true},
		{1<<20 + 4096, false},
	} {
		a, _ := openPair(t, ShmConfig{MemSize: 1 << 20})
		tr, err := newTransport(a, Config{Queues: 2, RingSize: 8192, MaxMsgSize: 4032, WindowSize: c.win})
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, fabric.ErrInvalid)) {
			t.Errorf("a window of %d bytes for two 8 KiB rings: %v, want ok=%v", c.win, err, c.ok)
		}
		if err == nil {
			if free := tr.heapFree(); free != c.win-ringsOff-2*8192 {
				t.Errorf("a window of %d bytes has %d bytes of heap", c.win, free)
			}
			tr.Close()
		}
	}
}
