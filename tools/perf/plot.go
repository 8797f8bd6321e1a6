package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// ticks125 marks a log axis at 1, 2 and 5 times the powers of ten.
type ticks125 struct{}

// Ticks implements plot.Ticker.
func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := m * d; v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ts
}

func writeJSON(rep SweepReport) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

var modeColors = map[string]color.Color{
	"unbatched": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"burst":     color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	"batched":   color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

var backendDashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)}, {vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)}}

// writePlot draws the sweep as a PNG: packet rate, bandwidth and the
// latency median and p99 against packet size, one line per backend and
// mode (colour: mode; dash: backend). With clean it plots the medians of
// the clean runs (falling back to all runs for a point without any).
func writePlot(path string, rep SweepReport, clean bool) error {
	pts := rep.Points
	which := "all runs"
	if clean && len(rep.CleanPoints) == len(rep.Points) {
		which = fmt.Sprintf("clean runs (CPU share >= %.2f)", rep.CleanShare)
		pts = make([]Point, len(rep.Points))
		for i, p := range rep.CleanPoints {
			pts[i] = p
			if p.Runs == 0 {
				pts[i] = rep.Points[i]
			}
		}
	}
	type series struct {
		backend, mode string
		pts           []Point
	}
	var ss []*series
	index := map[string]*series{}
	var backends []string
	for _, p := range pts {
		k := p.Backend + "/" + p.Mode
		s := index[k]
		if s == nil {
			s = &series{backend: p.Backend, mode: p.Mode}
			index[k] = s
			ss = append(ss, s)
		}
		s.pts = append(s.pts, p)
		seen := false
		for _, b := range backends {
			seen = seen || b == p.Backend
		}
		if !seen {
			backends = append(backends, p.Backend)
		}
	}
	var sizes []float64
	if len(ss) > 0 {
		for _, p := range ss[0].pts {
			sizes = append(sizes, float64(p.Size))
		}
	}
	ticks := plot.ConstantTicks(nil)
	for _, s := range sizes {
		ticks = append(ticks, plot.Tick{Value: s, Label: strconv.Itoa(int(s))})
	}
	latRate := 0.0
	if len(rep.Points) > 0 {
		latRate = rep.Points[0].LatRate
	}
	suffix := ", median of " + which
	panels := []struct {
		title, ylabel string
		f             func(Point) float64
		legend, log   bool
	}{
		{"Packet rate (throughput phase)", "Mpkt/s", func(p Point) float64 { return p.PktPerSec / 1e6 }, true, false},
		{"Bandwidth of packet bytes (throughput phase)", "Gb/s", func(p Point) float64 { return p.Gbps }, false, false},
		{fmt.Sprintf("Latency median at %.0f kpkt/s", latRate/1e3), "µs, end to end (log)", func(p Point) float64 { return max(p.LatP50us, 0.1) }, false, true},
		{fmt.Sprintf("Latency p99 at %.0f kpkt/s", latRate/1e3), "µs, end to end (log)", func(p Point) float64 { return max(p.LatP99us, 0.1) }, false, true},
	}
	plots := make([][]*plot.Plot, 2)
	for i, pn := range panels {
		pl := plot.New()
		pl.Title.Text = pn.title
		if i == 0 {
			pl.Title.Text += suffix
		}
		pl.X.Label.Text = "packet size (bytes)"
		pl.Y.Label.Text = pn.ylabel
		pl.X.Scale = plot.LogScale{}
		pl.X.Tick.Marker = ticks
		pl.Y.Min = 0
		if pn.log {
			pl.Y.Scale = plot.LogScale{}
			pl.Y.Tick.Marker = ticks125{}
			pl.Y.Min = 0.1
		}
		pl.Add(plotter.NewGrid())
		for _, s := range ss {
			xys := make(plotter.XYs, len(s.pts))
			for j, p := range s.pts {
				xys[j] = plotter.XY{X: float64(p.Size), Y: pn.f(p)}
			}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			c := modeColors[s.mode]
			line.Color, points.Color = c, c
			line.Width = vg.Points(1.5)
			for bi, b := range backends {
				if b == s.backend {
					line.Dashes = backendDashes[bi%len(backendDashes)]
				}
			}
			points.Shape = draw.CircleGlyph{}
			points.Radius = vg.Points(2.5)
			pl.Add(line, points)
			if pn.legend {
				pl.Legend.Add(s.backend+" "+s.mode, line, points)
			}
		}
		if pn.legend {
			pl.Legend.Top = true
			pl.Legend.Left = false
		}
		plots[i/2] = append(plots[i/2], pl)
	}
	img := vgimg.New(vg.Points(1100), vg.Points(800))
	dc := draw.New(img)
	t := draw.Tiles{Rows: 2, Cols: 2, PadX: vg.Points(20), PadY: vg.Points(20),
		PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	canvases := plot.Align(plots, t, dc)
	for r := range plots {
		for c := range plots[r] {
			plots[r][c].Draw(canvases[r][c])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
