package ntb

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/weft-io/weft/fabric"
	"github.com/weft-io/weft/fabric/fabrictest"
)

// dmaPair opens a bridge whose side b translates window 0 onto its whole
// memory, and returns a's engine and b's memory (what a's writes reach).
func dmaPair(t testing.TB, c EmuDMAConfig) (*ShmDevice, DMAEngine, []byte) {
	a, b := openPair(t.(*testing.T), ShmConfig{MemSize: 1 << 20})
	if err := b.MWSetTrans(0, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := a.ConfigureDMA(c); err != nil {
		t.Fatal(err)
	}
	eng, err := a.DMA()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ConfigureDMA(c); !errors.Is(err, fabric.ErrInvalid) {
		t.Fatalf("ConfigureDMA after start: %v", err)
	}
	return a, eng, b.Memory()
}

func drain(t *testing.T, eng DMAEngine, want int) map[uint64]DMACompletion {
	t.Helper()
	got := map[uint64]DMACompletion{}
	out := make([]DMACompletion, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for len(got) < want {
		n, err := eng.Wait(ctx, out)
		if err != nil {
			t.Fatalf("Wait after %d of %d: %v", len(got), want, err)
		}
		for _, c := range out[:n] {
			if _, dup := got[c.Cookie]; dup {
				t.Fatalf("cookie %d completed twice", c.Cookie)
			}
			got[c.Cookie] = c
		}
	}
	if n := eng.Poll(out); n != 0 {
		t.Fatalf("%d completions more than submitted", n)
	}
	return got
}

func TestDMAEngine(t *testing.T) {
	a, eng, peer := dmaPair(t, EmuDMAConfig{Channels: 3, Depth: 16})
	if eng.Channels() != 3 || eng.Depth() != 16 {
		t.Fatalf("channels %d depth %d", eng.Channels(), eng.Depth())
	}
	src := make([]byte, 10000)
	for i := range src {
		src[i] = byte(i*31 + 7)
	}
	descs := []DMADesc{
		{Op: DMAWrite, Local: src[:4000], Offset: 0, Cookie: 1},
		{Op: DMAWrite, Local: src[4000:], Offset: 4000, Cookie: 2},
		{Op: DMAWrite, Local: src[:1], Offset: 1<<20 - 1, Cookie: 3}, // the last byte
	}
	if n, err := eng.Submit(descs); n != 3 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	got := drain(t, eng, 3)
	if got[1].Len != 4000 || got[2].Len != 6000 || got[3].Status != fabric.StatusOK {
		t.Fatalf("completions %+v", got)
	}
	if !bytes.Equal(peer[:10000], src) || peer[1<<20-1] != src[0] {
		t.Fatal("the peer's memory does not hold what was written")
	}
	// Read it back.
	dst := make([]byte, 10000)
	if n, err := eng.Submit([]DMADesc{{Op: DMARead, Local: dst, Cookie: 9}}); n != 1 || err != nil {
		t.Fatalf("read Submit = %d, %v", n, err)
	}
	drain(t, eng, 1)
	if !bytes.Equal(dst, src) {
		t.Fatal("read back differs")
	}

	// Out of bounds: refused before any copy; the ones before it run.
	clear(peer[:16])
	bad := []DMADesc{
		{Op: DMAWrite, Local: src[:8], Offset: 0, Cookie: 20},
		{Op: DMAWrite, Local: src[:8], Offset: 1<<20 - 4, Cookie: 21}, // crosses the end
		{Op: DMAWrite, Local: src[:8], Offset: 8, Cookie: 22},
	}
	n, err := eng.Submit(bad)
	if n != 1 || !errors.Is(err, fabric.ErrBounds) {
		t.Fatalf("Submit out of bounds = %d, %v", n, err)
	}
	drain(t, eng, 1)
	if !bytes.Equal(peer[:8], src[:8]) || !bytes.Equal(peer[8:16], make([]byte, 8)) || peer[1<<20-4] != 0 {
		t.Fatal("a refused descriptor copied, or the accepted one did not")
	}
	for i, d := range []DMADesc{
		{Op: DMAWrite, Local: src[:8], Offset: 1 << 62}, // offset overflow
		{Op: DMAWrite, Local: src[:8], Window: 1},       // no translation
		{Op: DMAWrite, Local: src[:8], Window: 9},       // no such window
		{Op: DMAOp(7), Local: src[:8]},                  // no such op
	} {
		want := fabric.ErrInvalid
		if i == 0 {
			want = fabric.ErrBounds
		}
		if n, err := eng.Submit([]DMADesc{d}); n != 0 || !errors.Is(err, want) {
			t.Errorf("Submit(%+v) = %d, %v, want %v", d, n, err, want)
		}
	}

	// Backpressure: depth 16 in flight, then the queue is full.
	many := make([]DMADesc, 40)
	for i := range many {
		many[i] = DMADesc{Op: DMAWrite, Local: src[:64], Offset: uint64(64 * i), Cookie: uint64(100 + i)}
	}
	n, err = eng.Submit(many)
	if err != nil || n != 16 {
		t.Fatalf("Submit past the depth = %d, %v, want 16", n, err)
	}
	drain(t, eng, 16)

	a.Close()
	if _, err := eng.Submit(many[:1]); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	if _, err := a.DMA(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("DMA after Close: %v", err)
	}
}

// TestTransportDMA runs sends and RMA through the engine (threshold 1:
// every copy) and checks the bytes, and that DMA-sized copies allocate
// nothing.
func TestTransportDMA(t *testing.T) {
	a, b := pair(t, ShmConfig{}, Config{DMAThreshold: 1})
	if a.t.dma.eng == nil {
		t.Fatal("the transport did not take the device's engine")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, _ := a.Alloc(256<<10, fabric.AccessLocalWrite)
	dst, _ := b.Alloc(256<<10, fabric.AccessLocalWrite|fabric.AccessRemoteWrite|fabric.AccessRemoteRead)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i * 13)
	}
	w := []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 200 << 10}, {Region: src, Offset: 200 << 10, Length: 56 << 10}},
		Remote: dst.Remote(), Flags: fabric.FlagSignal}}
	if n, err := a.Write(w); n != 1 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	out := make([]fabric.Completion, 4)
	if k, err := a.CQ().Wait(ctx, out); k != 1 || err != nil || out[0].Status != fabric.StatusOK {
		t.Fatalf("completion %d %v %+v", k, err, out[0])
	}
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("RMA write through DMA: the target differs")
	}
	// A send through the engine.
	msg := []fabric.Message{{SGEs: []fabric.SGE{{Region: src, Length: 60000}}}}
	if n, err := a.SendWait(ctx, msg); n != 1 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	rb, _ := b.Alloc(65536, fabric.AccessLocalWrite)
	rm := []fabric.Message{{SGEs: []fabric.SGE{{Region: rb, Length: 65536}}}}
	if n, err := b.RecvWait(ctx, rm); n != 1 || err != nil || rm[0].Len != 60000 {
		t.Fatalf("Recv = %d, %v", n, err)
	}
	if !bytes.Equal(rb.Bytes()[:60000], src.Bytes()[:60000]) {
		t.Fatal("send through DMA: payload differs")
	}
	allocs := testing.AllocsPerRun(50, func() {
		a.Write(w)
		a.CQ().Poll(out)
	})
	if allocs != 0 {
		t.Fatalf("RMA write through DMA allocates %.1f per call", allocs)
	}
}

// TestConformanceDMA runs the suite with every copy through the emulated
// engine.
func TestConformanceDMA(t *testing.T) {
	fabrictest.TestPair(t, func(t *testing.T) (fabric.Endpoint, fabric.Endpoint) {
		a, b := pair(t, ShmConfig{}, Config{DMAThreshold: 1})
		return a, b
	})
}

// TestDMAAddress: dma= and dmachan= in an address turn the engine on for
// endpoints opened through the registry.
func TestDMAAddress(t *testing.T) {
	path := t.TempDir() + "/bridge?dma=4K&dmachan=2"
	a, b := fabrictest.OpenPair(t, 20*time.Second, func(ctx context.Context, _ fabrictest.Side) (fabric.Endpoint, error) {
		return fabric.Open(ctx, "ntb", path, nil)
	})
	ea := a.(*Endpoint)
	if ea.t.dma.eng == nil || ea.t.dma.threshold != 4096 || ea.t.dma.eng.Channels() != 2 {
		t.Fatalf("engine %v threshold %d", ea.t.dma.eng, ea.t.dma.threshold)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, _ := a.Alloc(20000, 0)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i * 5)
	}
	if n, err := a.SendWait(ctx, []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(src)}}}); n != 1 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	dst, _ := b.Alloc(20000, fabric.AccessLocalWrite)
	rm := []fabric.Message{{SGEs: []fabric.SGE{fabric.SGEOf(dst)}}}
	if n, err := b.RecvWait(ctx, rm); n != 1 || err != nil || !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatalf("Recv = %d, %v (payload equal %v)", n, err, bytes.Equal(dst.Bytes(), src.Bytes()))
	}
}

// TestTransportDMAChannels: a transport with DMAChannels 0 takes the
// device's engine as configured; a positive count sets it.
func TestTransportDMAChannels(t *testing.T) {
	for _, c := range []struct{ dev, cfg, want int }{{3, 0, 3}, {3, 2, 2}, {0, 0, 1}} {
		a, b := openPair(t, ShmConfig{})
		if c.dev > 0 {
			if err := a.ConfigureDMA(EmuDMAConfig{Channels: c.dev}); err != nil {
				t.Fatal(err)
			}
		}
		tr, err := newTransport(a, Config{DMAThreshold: 1, DMAChannels: c.cfg})
		if err != nil {
			t.Fatal(err)
		}
		if tr.dma.eng == nil || tr.dma.eng.Channels() != c.want {
			t.Errorf("device set to %d channels, transport to %d: the engine has %v, want %d", c.dev, c.cfg, tr.dma.eng, c.want)
		}
		tr.Close()
		b.Close()
	}
}
