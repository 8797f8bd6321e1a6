package main

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"slices"
)

// The plot is drawn with the standard library (image, image/png) so that
// the example needs no plotting module: two panels, throughput and median
// latency against frame size, one coloured line per back-plane, on log
// axes, with a legend of colour swatches (the JSON names the colours in
// the same order as the back-planes appear in it). Text labels would need
// a font; the axes' ranges are printed with the table instead.

var palette = []color.RGBA{
	{0x7f, 0x7f, 0x7f, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x1f, 0x77, 0xb4, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x94, 0x67, 0xbd, 0xff},
	{0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff},
}

// plotRows writes the PNG of rows to path.
func plotRows(path string, rows []Row) error {
	const w, h, pad = 1200, 480, 40
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	var bps []string
	for _, r := range rows {
		if !slices.Contains(bps, r.Backplane) {
			bps = append(bps, r.Backplane)
		}
	}
	panel := func(x0 int, val func(Row) float64) {
		x1, y0, y1 := x0+w/2-2*pad, pad, h-pad
		axis := color.RGBA{0, 0, 0, 0xff}
		line(img, x0, y1, x1, y1, axis)
		line(img, x0, y0, x0, y1, axis)
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range rows {
			if v := val(r); r.Err == "" && v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
		if math.IsInf(lo, 1) {
			return
		}
		lo, hi = math.Log10(lo)-0.1, math.Log10(hi)+0.1
		px := func(size int) int {
			return x0 + int(float64(x1-x0)*(math.Log10(float64(size))-math.Log10(50))/(math.Log10(1600)-math.Log10(50)))
		}
		py := func(v float64) int { return y1 - int(float64(y1-y0)*(math.Log10(v)-lo)/(hi-lo)) }
		for d := math.Floor(lo); d <= hi; d++ { // decade grid
			if d >= lo {
				line(img, x0, py(math.Pow(10, d)), x1, py(math.Pow(10, d)), color.RGBA{0xdd, 0xdd, 0xdd, 0xff})
			}
		}
		for i, bp := range bps {
			c := palette[i%len(palette)]
			px0, py0 := -1, -1
			for _, r := range rows {
				if r.Backplane != bp || r.Err != "" || val(r) <= 0 {
					continue
				}
				x, y := px(r.Size), py(val(r))
				dot(img, x, y, c)
				if px0 >= 0 {
					line(img, px0, py0, x, y, c)
				}
				px0, py0 = x, y
			}
			dot(img, x0+10+i*24, y0-20, c) // legend swatch, in back-plane order
		}
	}
	panel(pad, func(r Row) float64 { return r.Mpps })
	panel(w/2+pad, func(r Row) float64 { return r.MedianUs })
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func dot(img *image.RGBA, x, y int, c color.Color) {
	for dx := -3; dx <= 3; dx++ {
		for dy := -3; dy <= 3; dy++ {
			img.Set(x+dx, y+dy, c)
		}
	}
}

// line draws a segment (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}
