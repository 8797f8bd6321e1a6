package measure

import (
	"errors"
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

// Figure is a PNG of panels in a grid. WritePNG refuses a figure that
// would not read on its own: every panel needs a title, both its axes a
// label (with the unit, such as "frame size (bytes)"), and every line a
// name for the panel's legend.
type Figure struct {
	// Panels are drawn left to right, then top to bottom.
	Panels []Panel
	// Cols is the number of panels per row (0: 2, or 1 for one panel).
	Cols int
	// PanelWidth and PanelHeight are each panel's size (0: 550 and
	// 400 points).
	PanelWidth, PanelHeight vg.Length
}

// Panel is one plot of a figure.
type Panel struct {
	// Title is drawn above the panel.
	Title string
	// X and Y are the axes.
	X, Y Axis
	// Lines are the data, each with its entry in the panel's legend,
	// which is drawn to the right of the data, never over it.
	Lines []Line
}

// Axis is one axis of a panel.
type Axis struct {
	// Label names the quantity and its unit: "throughput (Mpkt/s)".
	Label string
	// Log draws a logarithmic axis; points with a value <= 0 are left
	// out of a line on it.
	Log bool
	// Ticks are the values to mark and label (nil: 1, 2 and 5 times the
	// powers of ten on a log axis, gonum's default on a linear one).
	Ticks []float64
	// Min is the lower end of the axis: on a linear axis, 0 unless set
	// (rates and sizes start at zero); on a log axis, the data's minimum
	// unless set above 0.
	Min float64
}

// Line is one named line of a panel, drawn with a dot at each point.
type Line struct {
	// Name is the line's legend entry.
	Name string
	// XY are the points, in drawing order.
	XY plotter.XYs
	// Color is the line's colour (nil: Palette(i) for the i-th line).
	Color color.Color
	// Dashes is the line's dash pattern (nil: solid).
	Dashes []vg.Length
}

// palette is the ten colours of matplotlib's tab10, distinct on screen
// and in print.
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0xff, 0x7f, 0x0e, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff}, {0xbc, 0xbd, 0x22, 0xff},
	{0x17, 0xbe, 0xcf, 0xff},
}

// Palette returns the i-th of ten distinct colours (repeating after ten).
func Palette(i int) color.Color { return palette[i%len(palette)] }

// dashes are four distinguishable dash patterns, solid first.
var dashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)}, {vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)}}

// Dashes returns the i-th of four dash patterns (repeating after four;
// the first is solid).
func Dashes(i int) []vg.Length { return dashes[i%len(dashes)] }

// Ticks125 marks a log axis at 1, 2 and 5 times the powers of ten, with
// their values; over a range too narrow for two such ticks it marks
// every integer multiple of the powers of ten instead, and failing that
// falls back to gonum's default ticks.
type Ticks125 struct{}

// Ticks implements plot.Ticker.
func (Ticks125) Ticks(lo, hi float64) []plot.Tick {
	for _, ms := range [][]float64{{1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
		var ts []plot.Tick
		for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
			for _, m := range ms {
				if v := m * d; v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
					ts = append(ts, plot.Tick{Value: v, Label: formatTick(v)})
				}
			}
		}
		if len(ts) >= 2 {
			return ts
		}
	}
	return plot.DefaultTicks{}.Ticks(lo, hi)
}

func formatTick(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }

// check reports what would leave f unreadable.
func (f Figure) check() error {
	if len(f.Panels) == 0 {
		return errors.New("measure: a figure with no panels")
	}
	for i, p := range f.Panels {
		switch {
		case p.Title == "":
			return fmt.Errorf("measure: panel %d has no title", i)
		case p.X.Label == "" || p.Y.Label == "":
			return fmt.Errorf("measure: panel %q has an axis with no label", p.Title)
		}
		for j, l := range p.Lines {
			if l.Name == "" {
				return fmt.Errorf("measure: line %d of panel %q has no name", j, p.Title)
			}
		}
	}
	return nil
}

// setAxis applies a to pa.
func setAxis(pa *plot.Axis, a Axis) {
	pa.Label.Text = a.Label
	switch {
	case a.Log:
		pa.Scale = plot.LogScale{}
		pa.Tick.Marker = Ticks125{}
		if a.Min > 0 {
			pa.Min = a.Min
		}
	default:
		pa.Min = a.Min
	}
	if a.Ticks != nil {
		ts := make(plot.ConstantTicks, len(a.Ticks))
		for i, v := range a.Ticks {
			ts[i] = plot.Tick{Value: v, Label: formatTick(v)}
		}
		pa.Tick.Marker = ts
	}
}

// keep returns the points of xy that the axes can draw.
func keep(xy plotter.XYs, x, y Axis) plotter.XYs {
	out := make(plotter.XYs, 0, len(xy))
	for _, p := range xy {
		if (x.Log && p.X <= 0) || (y.Log && p.Y <= 0) || math.IsNaN(p.X) || math.IsNaN(p.Y) ||
			math.IsInf(p.X, 0) || math.IsInf(p.Y, 0) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// fixRange gives an axis with no data, or a single value, a range it
// can draw (gonum's log scale panics on a range that reaches 0).
func fixRange(pa *plot.Axis, log bool) {
	switch {
	case pa.Min > pa.Max && log: // no data
		pa.Min, pa.Max = 1, 10
	case pa.Min > pa.Max:
		pa.Min, pa.Max = 0, 1
	case pa.Min == pa.Max && log:
		pa.Min, pa.Max = pa.Min/2, pa.Max*2
	}
}

// plot builds p's gonum plot and its legend.
func (p Panel) plot() (*plot.Plot, *plot.Legend, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	setAxis(&pl.X, p.X)
	setAxis(&pl.Y, p.Y)
	pl.Add(plotter.NewGrid())
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	for i, l := range p.Lines {
		xy := keep(l.XY, p.X, p.Y)
		if len(xy) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, nil, fmt.Errorf("measure: line %q of panel %q: %v", l.Name, p.Title, err)
		}
		c := l.Color
		if c == nil {
			c = Palette(i)
		}
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		line.Dashes = l.Dashes
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(2.5)
		pl.Add(line, points)
		leg.Add(l.Name, line, points)
	}
	fixRange(&pl.X, p.X.Log)
	fixRange(&pl.Y, p.Y.Log)
	return pl, &leg, nil
}

// legendWidth is the width of leg's entries.
func legendWidth(leg *plot.Legend) vg.Length {
	r := leg.Rectangle(draw.Canvas{})
	return r.Max.X - r.Min.X
}

// WritePNG draws f to a PNG file at path.
func (f Figure) WritePNG(path string) error {
	if err := f.check(); err != nil {
		return err
	}
	cols := f.Cols
	if cols <= 0 {
		cols = min(2, len(f.Panels))
	}
	rows := (len(f.Panels) + cols - 1) / cols
	pw, ph := f.PanelWidth, f.PanelHeight
	if pw <= 0 {
		pw = vg.Points(550)
	}
	if ph <= 0 {
		ph = vg.Points(400)
	}
	plots := make([][]*plot.Plot, rows)
	legends := make([]*plot.Legend, len(f.Panels))
	var legW vg.Length // the legends' strip, right of each panel's data
	for i, p := range f.Panels {
		pl, leg, err := p.plot()
		if err != nil {
			return err
		}
		plots[i/cols] = append(plots[i/cols], pl)
		legends[i] = leg
		legW = max(legW, legendWidth(leg))
	}
	if legW > 0 {
		legW += vg.Points(16)
	}
	for len(plots[rows-1]) < cols {
		plots[rows-1] = append(plots[rows-1], nil) // plot.Align leaves a nil cell empty
	}
	img := vgimg.New((pw+legW)*vg.Length(cols), ph*vg.Length(rows))
	dc := draw.New(img)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(20), PadY: vg.Points(20),
		PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	canvases := plot.Align(plots, t, dc)
	for r := range plots {
		for c := range plots[r] {
			if plots[r][c] == nil {
				continue
			}
			tile := canvases[r][c]
			pc := draw.Crop(tile, 0, -legW, 0, 0)
			plots[r][c].Draw(pc)
			strip := draw.Crop(tile, tile.Max.X-tile.Min.X-legW+vg.Points(12), 0, 0, 0)
			// Level with the top of the data area, below the title.
			leg := legends[r*cols+c]
			leg.YOffs = plots[r][c].DataCanvas(pc).Max.Y - strip.Max.Y
			leg.Draw(strip)
		}
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
