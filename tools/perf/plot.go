package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"slices"

	"github.com/weft-io/weft/tools/measure"
	"gonum.org/v1/plot/plotter"
)

func writeJSON(rep SweepReport) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// modeColors colour the lines by mode; measure.Dashes tells the backends
// apart.
var modeColors = map[string]color.Color{
	"unbatched": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"burst":     color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	"batched":   color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
}

// writePlot draws the sweep as a PNG (through tools/measure): packet
// rate, bandwidth and the latency median and p99 against packet size,
// one line per backend and mode (colour: mode; dash: backend), each named
// in every panel's legend. With clean it plots the medians of the clean
// runs (falling back to all runs for a point without any).
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
		if !slices.Contains(backends, p.Backend) {
			backends = append(backends, p.Backend)
		}
	}
	var sizes []float64
	if len(ss) > 0 {
		for _, p := range ss[0].pts {
			sizes = append(sizes, float64(p.Size))
		}
	}
	latRate := 0.0
	if len(rep.Points) > 0 {
		latRate = rep.Points[0].LatRate
	}
	suffix := ", median of " + which
	x := measure.Axis{Label: "packet size (bytes, log)", Log: true, Ticks: sizes}
	panels := []struct {
		title, ylabel string
		f             func(Point) float64
		log           bool
	}{
		{"Packet rate (throughput phase)" + suffix, "packet rate (Mpkt/s)", func(p Point) float64 { return p.PktPerSec / 1e6 }, false},
		{"Bandwidth of packet bytes (throughput phase)", "bandwidth (Gb/s)", func(p Point) float64 { return p.Gbps }, false},
		{fmt.Sprintf("Latency median at %.0f kpkt/s", latRate/1e3), "latency, end to end (µs, log)", func(p Point) float64 { return max(p.LatP50us, 0.1) }, true},
		{fmt.Sprintf("Latency p99 at %.0f kpkt/s", latRate/1e3), "latency, end to end (µs, log)", func(p Point) float64 { return max(p.LatP99us, 0.1) }, true},
	}
	fig := measure.Figure{Cols: 2}
	for _, pn := range panels {
		p := measure.Panel{Title: pn.title, X: x, Y: measure.Axis{Label: pn.ylabel, Log: pn.log}}
		if pn.log {
			p.Y.Min = 0.1
		}
		for _, s := range ss {
			l := measure.Line{Name: s.backend + " " + s.mode, Color: modeColors[s.mode],
				Dashes: measure.Dashes(slices.Index(backends, s.backend))}
			for _, pt := range s.pts {
				l.XY = append(l.XY, plotter.XY{X: float64(pt.Size), Y: pn.f(pt)})
			}
			p.Lines = append(p.Lines, l)
		}
		fig.Panels = append(fig.Panels, p)
	}
	return fig.WritePNG(path)
}
