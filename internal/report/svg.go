package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// Point is one measurement: Y at X, with an optional whisker from Lo to Hi
// (drawn when Lo < Hi).
type Point struct {
	X, Y   float64
	Lo, Hi float64
}

// Series is one line of a plot.
type Series struct {
	Name   string
	Points []Point
}

// Plot is a line plot. With LogX the x axis is logarithmic (base 10) and
// every X must be > 0. Y axes start at 0.
type Plot struct {
	Title  string
	XLabel string
	YLabel string
	LogX   bool
	// XTick formats x tick labels; nil prints the number.
	XTick  func(float64) string
	Series []Series
	Width  int // pixels; 0 means 760
	Height int // pixels; 0 means 460
}

// palette is colour-blind friendly (Okabe-Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}

// WriteSVG writes the plot as a standalone SVG document.
func (p *Plot) WriteSVG(w io.Writer) error {
	width, height := p.Width, p.Height
	if width <= 0 {
		width = 760
	}
	if height <= 0 {
		height = 460
	}
	const left, right, top, bottom = 70.0, 180.0, 40.0, 55.0
	pw, ph := float64(width)-left-right, float64(height)-top-bottom
	if pw <= 0 || ph <= 0 {
		return fmt.Errorf("report: plot %dx%d too small", width, height)
	}
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	npts := 0
	for _, s := range p.Series {
		for _, pt := range s.Points {
			for _, v := range []float64{pt.X, pt.Y, pt.Lo, pt.Hi} {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					return fmt.Errorf("report: series %q has a non-finite value", s.Name)
				}
			}
			if p.LogX && pt.X <= 0 {
				return fmt.Errorf("report: series %q has x = %v on a log axis", s.Name, pt.X)
			}
			xmin, xmax = math.Min(xmin, pt.X), math.Max(xmax, pt.X)
			ymax = math.Max(ymax, math.Max(pt.Y, pt.Hi))
			npts++
		}
	}
	if npts == 0 {
		return fmt.Errorf("report: plot has no points")
	}
	fx := func(v float64) float64 { return v }
	if p.LogX {
		fx = math.Log10
		xmin, xmax = math.Pow(10, math.Floor(math.Log10(xmin))), math.Pow(10, math.Ceil(math.Log10(xmax)))
	}
	if xmax == xmin {
		xmin, xmax = xmin-1, xmax+1
		if p.LogX {
			xmin, xmax = xmin/10+1, xmax*10-10
		}
	}
	ystep := niceStep(ymax / 5)
	if ymax <= 0 {
		ystep = 1
	}
	ytop := math.Ceil(ymax/ystep) * ystep
	if ytop == 0 {
		ytop = ystep
	}
	X := func(v float64) float64 { return left + (fx(v)-fx(xmin))/(fx(xmax)-fx(xmin))*pw }
	Y := func(v float64) float64 { return top + ph - v/ytop*ph }
	xt := p.XTick
	if xt == nil {
		xt = func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
	}

	var b strings.Builder
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	if p.Title != "" {
		fmt.Fprintf(&b, `<text x="%s" y="22" text-anchor="middle" font-size="15">%s</text>`+"\n", f(left+pw/2), html.EscapeString(p.Title))
	}
	// Grid and y ticks.
	for v := 0.0; v <= ytop+ystep/2; v += ystep {
		y := Y(v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`+"\n", f(left), f(y), f(left+pw), f(y))
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", f(left-6), f(y+4), strconv.FormatFloat(v, 'g', 6, 64))
	}
	// x ticks: decades (and 2, 5 within) on log axes, 5 even steps otherwise.
	var xticks []float64
	if p.LogX {
		for d := xmin; d <= xmax*1.0001; d *= 10 {
			for _, m := range []float64{1, 2, 5} {
				if v := d * m; v <= xmax*1.0001 {
					xticks = append(xticks, v)
				}
			}
		}
	} else {
		st := niceStep((xmax - xmin) / 5)
		for v := math.Ceil(xmin/st) * st; v <= xmax+st/1e6; v += st {
			xticks = append(xticks, v)
		}
	}
	for _, v := range xticks {
		x := X(v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#eee"/>`+"\n", f(x), f(top), f(x), f(top+ph))
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f(x), f(top+ph+16), html.EscapeString(xt(v)))
	}
	fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333"/>`+"\n", f(left), f(top), f(pw), f(ph))
	if p.XLabel != "" {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f(left+pw/2), f(top+ph+40), html.EscapeString(p.XLabel))
	}
	if p.YLabel != "" {
		fmt.Fprintf(&b, `<text x="18" y="%s" text-anchor="middle" transform="rotate(-90 18 %s)">%s</text>`+"\n", f(top+ph/2), f(top+ph/2), html.EscapeString(p.YLabel))
	}
	// Series.
	for i, s := range p.Series {
		col := palette[i%len(palette)]
		fmt.Fprintf(&b, `<g stroke="%s" fill="%s">`+"\n", col, col)
		if len(s.Points) > 1 {
			pts := make([]string, len(s.Points))
			for k, pt := range s.Points {
				pts[k] = f(X(pt.X)) + "," + f(Y(pt.Y))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke-width="2" points="%s"/>`+"\n", strings.Join(pts, " "))
		}
		for _, pt := range s.Points {
			x := X(pt.X)
			if pt.Lo < pt.Hi {
				fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke-width="1"/>`+"\n", f(x), f(Y(pt.Lo)), f(x), f(Y(pt.Hi)))
			}
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3"/>`+"\n", f(x), f(Y(pt.Y)))
		}
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke-width="2"/>`+"\n", f(left+pw+12), f(ly), f(left+pw+36), f(ly))
		fmt.Fprintf(&b, `<text x="%s" y="%s" stroke="none" fill="#000">%s</text>`+"\n", f(left+pw+42), f(ly+4), html.EscapeString(s.Name))
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}
