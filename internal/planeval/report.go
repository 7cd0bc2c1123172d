package planeval

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// curve is one CDF line of the figure.
type curve struct {
	label string
	xs    []float64 // sorted samples
	color string
	dash  string
	table bool // listed in the tables only, not drawn
}

func (s Series) curves() []curve {
	cs := []curve{
		{label: "vs shortest path", xs: s.VsShortest, color: "#1f77b4"},
		{label: "vs minimax", xs: s.VsMinimax, color: "#d62728"},
	}
	if len(s.VsHopsMinimax) > 0 {
		cs = append(cs, curve{label: "vs minimax (fewest hops)", xs: s.VsHopsMinimax, table: true})
	}
	if len(s.VsMSTMinimax) > 0 {
		cs = append(cs, curve{label: "vs minimax (MST path)", xs: s.VsMSTMinimax, color: "#ff7f0e", dash: "6 4"})
	}
	return cs
}

// drawn returns the curves of the figure.
func (s Series) drawn() []curve {
	var out []curve
	for _, c := range s.curves() {
		if !c.table {
			out = append(out, c)
		}
	}
	return out
}

// roundsTitle names a round count by the transfer sizes of the paper.
func roundsTitle(r int) string {
	switch r {
	case 1:
		return "1 round (< 15 KB)"
	case 5:
		return "5 rounds (450 KB)"
	case 10:
		return "10 rounds (14935 KB)"
	}
	return fmt.Sprintf("%d rounds", r)
}

// xMin is the left edge of the logarithmic x axis: improvements up to 0.1%
// (including none) are drawn there.
const xMin = 1e-3

// xDecades returns the decade exponents of a panel's logarithmic x axis,
// from 10^-3 (0.1%) to the decade above the largest finite value (at least
// 10^0 = 100%).
func xDecades(cs []curve) (lo, hi int) {
	top := 1.0
	for _, c := range cs {
		for k := len(c.xs) - 1; k >= 0; k-- {
			if !math.IsInf(c.xs[k], 0) {
				top = math.Max(top, c.xs[k])
				break
			}
		}
	}
	return -3, int(math.Ceil(math.Log10(top) - 1e-12))
}

// WriteSVG writes the figure: one panel per round count with the CDF, over
// all ordered pairs, of the relative improvement of the planner's chains over
// each baseline.
func (res *Result) WriteSVG(w io.Writer) error {
	const (
		pw, ph   = 300.0, 230.0 // plot area of a panel
		ml, mt   = 60.0, 56.0   // left and top margin of a panel
		gap      = 90.0
		legendH  = 60.0
		steps    = 400
		fontAttr = `font-family="sans-serif" font-size="12"`
	)
	n := len(res.Series)
	width := ml + float64(n)*(pw+gap) - gap + 30
	height := mt + ph + 50 + legendH
	bw := bufio.NewWriter(w)
	esc := func(s string) string {
		var b strings.Builder
		xml.EscapeText(&b, []byte(s))
		return b.String()
	}
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`+"\n", width, height, width, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="%.0f" y="18" font-family="sans-serif" font-size="14" font-weight="bold">%s</text>`+"\n", ml,
		esc(fmt.Sprintf("Relative improvement of mosto chains over baselines: CDF over %d ordered pairs of %d graphs", res.Pairs, len(res.Graphs))))
	for k, s := range res.Series {
		x0 := ml + float64(k)*(pw+gap)
		y0 := mt
		cs := s.drawn()
		lo, hi := xDecades(cs)
		span := float64(hi - lo)
		xpos := func(x float64) float64 {
			return x0 + (math.Log10(math.Max(x, xMin))-float64(lo))/span*pw
		}
		fmt.Fprintf(bw, `<g>`+"\n")
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" %s text-anchor="middle" font-weight="bold">%s</text>`+"\n", x0+pw/2, y0-8, fontAttr, esc(roundsTitle(s.Rounds)))
		// Grid and axes.
		for t := 0; t <= 5; t++ {
			yy := y0 + ph - float64(t)/5*ph
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, yy, x0+pw, yy)
			fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" %s text-anchor="end">%.1f</text>`+"\n", x0-6, yy+4, fontAttr, float64(t)/5)
		}
		for d := lo; d <= hi; d++ {
			x := math.Pow(10, float64(d))
			xx := xpos(x)
			label := fmt.Sprintf("%g%%", x*100)
			if d == lo {
				label = "<=" + label
			}
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", xx, y0, xx, y0+ph)
			fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" %s text-anchor="middle">%s</text>`+"\n", xx, y0+ph+16, fontAttr, esc(label))
			for m := 2; m < 10 && d < hi; m++ {
				mx := xpos(float64(m) * x)
				fmt.Fprintf(bw, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`+"\n", mx, y0+ph, mx, y0+ph-4)
			}
		}
		fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="black"/>`+"\n", x0, y0, pw, ph)
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" %s text-anchor="middle">improvement = baseline time / mosto time - 1 (log)</text>`+"\n", x0+pw/2, y0+ph+34, fontAttr)
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" %s text-anchor="middle" transform="rotate(-90 %.1f %.1f)">CDF (fraction of pairs)</text>`+"\n", x0-40, y0+ph/2, fontAttr, x0-40, y0+ph/2)
		for _, c := range cs {
			var pts strings.Builder
			prev := -1.0
			for t := 0; t <= steps; t++ {
				x := math.Pow(10, float64(lo)+float64(t)/steps*span)
				y := 1 - FractionAbove(c.xs, x)
				px, py := xpos(x), y0+ph-y*ph
				if t > 0 && y != prev {
					// Vertical step at this x.
					fmt.Fprintf(&pts, "%.2f,%.2f ", px, y0+ph-prev*ph)
				}
				fmt.Fprintf(&pts, "%.2f,%.2f ", px, py)
				prev = y
			}
			dash := ""
			if c.dash != "" {
				dash = fmt.Sprintf(` stroke-dasharray="%s"`, c.dash)
			}
			fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", c.color, dash, strings.TrimSpace(pts.String()))
		}
		fmt.Fprintf(bw, `</g>`+"\n")
	}
	// Legend.
	ly := mt + ph + 58
	for k, c := range res.Series[0].drawn() {
		lx := ml + float64(k)*220
		dash := ""
		if c.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, c.dash)
		}
		fmt.Fprintf(bw, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly, lx+30, ly, c.color, dash)
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" %s>%s</text>`+"\n", lx+36, ly+4, fontAttr, esc(c.label))
	}
	fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" %s fill="#555">%s</text>`+"\n", ml, ly+26, fontAttr,
		esc("Pairs with no improvement (or at most 0.1%) sit at the left edge: the height there is the fraction of pairs where the baseline is as good as mosto."))
	fmt.Fprintln(bw, `</svg>`)
	return bw.Flush()
}

// WriteMarkdown writes the summary tables.
func (res *Result) WriteMarkdown(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# mosto plan eval: Fig. 2 and number of proxies\n\n")
	fmt.Fprintf(bw, "%d graphs, %d ordered pairs of locations per round count, computed in %.2f s.\n", len(res.Graphs), res.Pairs, res.Elapsed.Seconds())
	fmt.Fprintf(bw, "Relative improvement over a baseline = cost(baseline chain) / cost(mosto chain) - 1,\n")
	fmt.Fprintf(bw, "with cost = 1/2 sum of RTTs + (rounds - 1) x max RTT along the chain.\n\n")
	fmt.Fprintf(bw, "## Relative improvement (distribution over ordered pairs)\n\n")
	fmt.Fprintf(bw, "| rounds | baseline | pairs > 0 | > 5%% | > 10%% | > 15%% | > 40%% | p50 | p80 | p90 | p99 | max | mosto worse |\n")
	fmt.Fprintf(bw, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range res.Series {
		for _, c := range s.curves() {
			fmt.Fprintf(bw, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", s.Rounds, strings.TrimPrefix(c.label, "vs "),
				pct(FractionAbove(c.xs, 0)), pct(FractionAbove(c.xs, 0.05)), pct(FractionAbove(c.xs, 0.10)), pct(FractionAbove(c.xs, 0.15)), pct(FractionAbove(c.xs, 0.40)),
				pct(Quantile(c.xs, 0.5)), pct(Quantile(c.xs, 0.8)), pct(Quantile(c.xs, 0.9)), pct(Quantile(c.xs, 0.99)), pct(Quantile(c.xs, 1)), s.Worse)
		}
	}
	fmt.Fprintf(bw, "\n\"pairs > x\" is the fraction of ordered pairs whose improvement exceeds x; p50..max are quantiles of the improvement.\n")
	fmt.Fprintf(bw, "\"mosto worse\" counts pairs where the mosto chain cost more than a baseline (a planner bug if not 0).\n\n")
	fmt.Fprintf(bw, "## Number of proxies (mean intermediate locations per chain)\n\n")
	fmt.Fprintf(bw, "| rounds | mosto | shortest path | minimax | minimax (fewest hops) | minimax (MST path) | mosto vs minimax | vs minimax (fewest hops) | vs minimax (MST path) |\n")
	fmt.Fprintf(bw, "|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range res.Series {
		fmt.Fprintf(bw, "| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %s | %s | %s |\n", s.Rounds, s.ProxiesOurs, s.ProxiesShortest, s.ProxiesMinimax, s.ProxiesHopsMinimax, s.ProxiesMSTMinimax,
			signedPct(s.ProxiesOurs/s.ProxiesMinimax-1), signedPct(s.ProxiesOurs/s.ProxiesHopsMinimax-1), signedPct(s.ProxiesOurs/s.ProxiesMSTMinimax-1))
	}
	fmt.Fprintf(bw, "\n## Graphs\n\n| graph | locations | links | ordered pairs | time |\n|---|---|---|---|---|\n")
	for _, g := range res.Graphs {
		fmt.Fprintf(bw, "| %s | %d | %d | %d | %.0f ms |\n", g.Name, g.Locations, g.Links, g.Pairs, float64(g.Elapsed.Microseconds())/1000)
	}
	return bw.Flush()
}

func pct(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}

func signedPct(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", 100*x)
}

// WriteSummary writes the headline numbers as plain text, in the terms of
// the paper's Sec. V.
func (res *Result) WriteSummary(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%d graphs, %d ordered pairs, %.2f s\n", len(res.Graphs), res.Pairs, res.Elapsed.Seconds())
	fmt.Fprintf(bw, "%-7s %-24s %9s %9s %9s %9s %9s\n", "rounds", "baseline", "pairs>0", ">10%", "p90", "max", "proxies")
	for _, s := range res.Series {
		for _, c := range s.curves() {
			prox := ""
			switch c.label {
			case "vs minimax":
				prox = signedPct(s.ProxiesOurs/s.ProxiesMinimax - 1)
			case "vs minimax (MST path)":
				prox = signedPct(s.ProxiesOurs/s.ProxiesMSTMinimax - 1)
			case "vs minimax (fewest hops)":
				prox = signedPct(s.ProxiesOurs/s.ProxiesHopsMinimax - 1)
			}
			fmt.Fprintf(bw, "%-7d %-24s %9s %9s %9s %9s %9s\n", s.Rounds, strings.TrimPrefix(c.label, "vs "),
				pct(FractionAbove(c.xs, 0)), pct(FractionAbove(c.xs, 0.10)), pct(Quantile(c.xs, 0.9)), pct(Quantile(c.xs, 1)), prox)
		}
		if s.Worse > 0 {
			fmt.Fprintf(bw, "WARNING: %d pairs where mosto's chain is worse than a baseline at %d rounds\n", s.Worse, s.Rounds)
		}
	}
	fmt.Fprintf(bw, "(proxies: mean proxies of mosto's chains relative to the baseline's)\n")
	return bw.Flush()
}
