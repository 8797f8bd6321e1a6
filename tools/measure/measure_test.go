package measure

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"
)

// TestHist is tools/perf's histogram test.
func TestHist(t *testing.T) {
	var h Hist
	for v := int64(1); v <= 100000; v++ {
		h.Add(v)
	}
	h.Add(-5)
	for _, q := range []float64{0.5, 0.99, 0.999} {
		got, want := h.Quantile(q), q*100001
		if math.Abs(got-want)/want > 0.04 {
			t.Errorf("q%.3f = %.0f, want %.0f within 4%%", q, got, want)
		}
	}
	if h.Neg() != 1 || h.Max() != 100000 || h.N() != 100001 {
		t.Fatalf("%+v", h.N())
	}
	var m Hist
	m.Merge(&h)
	m.Merge(&h)
	if m.N() != 2*h.N() || m.Quantile(0.5) != h.Quantile(0.5) || m.Max() != h.Max() {
		t.Fatal("merge")
	}
	for v := int64(0); v < 1<<20; v = v*5/4 + 1 {
		if b := bucketOf(v); bucketMid(b) < float64(v)*0.96-1 || bucketMid(b) > float64(v)*1.04+1 {
			t.Fatalf("value %d in bucket %d (mid %.1f)", v, b, bucketMid(b))
		}
	}
	m.Reset()
	if m.N() != 0 || m.Quantile(0.5) != 0 {
		t.Fatal("reset")
	}
}

// TestHistRouter is tools/router's histogram test (its sink's latencies).
func TestHistRouter(t *testing.T) {
	var h Hist
	for i := int64(1); i <= 100000; i++ {
		h.Add(i * 10)
	}
	for _, q := range []struct{ q, want float64 }{{0.5, 500000}, {0.99, 990000}} {
		if got := h.Quantile(q.q); got < q.want*0.94 || got > q.want*1.06 {
			t.Errorf("q%.2f = %.0f, want %.0f ± 6%%", q.q, got, q.want)
		}
	}
}

func TestClock(t *testing.T) {
	if err := InitClock(); err != nil {
		t.Fatal(err)
	}
	a := MonoNow()
	time.Sleep(time.Millisecond)
	b := Mono(time.Now())
	if d := b - a; d < int64(time.Millisecond) || d > int64(time.Second) {
		t.Fatalf("1 ms sleep measured as %d ns", d)
	}
	if ClockErr() < 0 || ClockErr() > 10*time.Millisecond {
		t.Fatalf("clock error %v", ClockErr())
	}
}

func TestCPU(t *testing.T) {
	s := StartShare()
	m := NewCPUMeter(map[string]int{"self": os.Getpid()})
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	if sh := s.End(); sh <= 0 || sh > float64(max(CountCPUs(), 1))+0.5 {
		t.Errorf("spinning share %.2f", sh)
	}
	got := m.Done(map[string]time.Duration{"extra": 25 * time.Millisecond})
	if _, ok := got["self"]; !ok || got["extra"] <= 0 || got["extra"] > 1 {
		t.Errorf("Done = %v", got)
	}
	if CountCPUs() < 1 {
		t.Errorf("CountCPUs = %d", CountCPUs())
	}
}

func TestTicks125(t *testing.T) {
	for _, r := range [][2]float64{{0.1, 1000}, {30, 45}, {1.1, 1.3}} {
		ts := Ticks125{}.Ticks(r[0], r[1])
		labelled := 0
		for _, tk := range ts {
			if tk.Label != "" {
				labelled++
			}
		}
		if labelled < 2 {
			t.Errorf("[%g, %g]: %d labelled ticks: %v", r[0], r[1], labelled, ts)
		}
	}
}

func TestWritePNG(t *testing.T) {
	xy := plotter.XYs{{X: 64, Y: 1.5}, {X: 1500, Y: 0.4}, {X: 256, Y: 0}}
	ok := Panel{Title: "rate", X: Axis{Label: "size (bytes)", Log: true, Ticks: []float64{64, 256, 1500}},
		Y: Axis{Label: "Mpkt/s", Log: true}, Lines: []Line{{Name: "a", XY: xy}, {Name: "b", XY: xy[:2], Dashes: Dashes(1)}}}
	lin := ok
	lin.Y.Log = false
	path := filepath.Join(t.TempDir(), "f.png")
	if err := (Figure{Panels: []Panel{ok, lin, ok}}).WritePNG(path); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
		t.Fatalf("not a PNG: %v", err)
	}
	// A panel whose lines have nothing to draw (a run whose every point
	// failed), or one point, on log axes.
	empty, one := ok, ok
	empty.Lines = []Line{{Name: "a", XY: plotter.XYs{{X: 64, Y: 0}}}, {Name: "b"}}
	one.Lines = []Line{{Name: "a", XY: xy[:1]}}
	if err := (Figure{Panels: []Panel{empty, one}}).WritePNG(path); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*Panel){
		func(p *Panel) { p.Title = "" },
		func(p *Panel) { p.X.Label = "" },
		func(p *Panel) { p.Y.Label = "" },
		func(p *Panel) { p.Lines = []Line{{XY: xy}} },
	} {
		p := ok
		p.Lines = append([]Line(nil), ok.Lines...)
		bad(&p)
		if err := (Figure{Panels: []Panel{p}}).WritePNG(path); err == nil {
			t.Errorf("%+v: drawn without a title, label or name", p)
		}
	}
}
