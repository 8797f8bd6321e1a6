package main

import (
	"fmt"
	"slices"

	"gonum.org/v1/plot/plotter"

	"github.com/weft-io/weft/tools/measure"
)

// plotRows writes the figure of rows to path (through tools/measure): two
// panels, forwarding rate and median latency against frame size, on log
// axes, one line per back-plane named in each panel's legend, in the
// order the back-planes appear in the table and the JSON. Rows that
// failed are left out.
func plotRows(path string, rows []Row) error {
	var bps []string
	var sizes []float64
	latRate := 0.0
	for _, r := range rows {
		if !slices.Contains(bps, r.Backplane) {
			bps = append(bps, r.Backplane)
		}
		if !slices.Contains(sizes, float64(r.Size)) {
			sizes = append(sizes, float64(r.Size))
		}
		if r.Err == "" && latRate == 0 {
			latRate = r.LatRate
		}
	}
	slices.Sort(sizes)
	lines := func(val func(Row) float64) []measure.Line {
		var ls []measure.Line
		for _, bp := range bps {
			l := measure.Line{Name: bp}
			for _, r := range rows {
				if r.Backplane == bp && r.Err == "" {
					l.XY = append(l.XY, plotter.XY{X: float64(r.Size), Y: val(r)})
				}
			}
			ls = append(ls, l)
		}
		return ls
	}
	x := measure.Axis{Label: "frame size (bytes)", Log: true, Ticks: sizes}
	nodes := 0
	if len(rows) > 0 {
		nodes = rows[0].Nodes
	}
	fig := measure.Figure{Panels: []measure.Panel{{
		Title: fmt.Sprintf("Forwarding rate, %d nodes (throughput phase)", nodes),
		X:     x, Y: measure.Axis{Label: "throughput (Mpkt/s, log)", Log: true},
		Lines: lines(func(r Row) float64 { return r.Mpps }),
	}, {
		Title: fmt.Sprintf("Median latency at %.0f kpkt/s (latency phase)", latRate/1e3),
		X:     x, Y: measure.Axis{Label: "one-way latency, generator to sink (µs, log)", Log: true},
		Lines: lines(func(r Row) float64 { return r.MedianUs }),
	}}}
	return fig.WritePNG(path)
}
