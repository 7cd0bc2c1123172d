package ttsbench

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/mosto-net/mosto/internal/report"
	"github.com/mosto-net/mosto/internal/stats"
)

func f3(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.3f", x)
}

func pval(p float64) string {
	switch {
	case math.IsNaN(p):
		return "-"
	case p < 1e-4:
		return fmt.Sprintf("%.1e", p)
	}
	return fmt.Sprintf("%.4f", p)
}

// Compare is one mode against end-to-end in one row.
type Compare struct {
	E2E, Other stats.Summary
	A12        float64 // P(E2E slower than the other mode): > 0.5 favours it
	P          float64 // Mann-Whitney two-sided p
	Ratio      float64 // mean(other) / mean(E2E)
}

// Compare computes mode against E2E for (cc, row); ok is false when a side
// has no samples.
func (r *TableResult) Compare(cc string, row int, mode Mode) (Compare, bool) {
	e, o := r.Sample[key{cc, row, E2E}], r.Sample[key{cc, row, mode}]
	se, err1 := stats.Summarize(e)
	so, err2 := stats.Summarize(o)
	if err1 != nil || err2 != nil {
		return Compare{}, false
	}
	c := Compare{E2E: se, Other: so, A12: stats.A12(e, o), P: math.NaN(), Ratio: so.Mean / se.Mean}
	if mw, err := stats.MannWhitneyU(e, o); err == nil {
		c.P = mw.P
	}
	return c, true
}

// WriteMarkdown writes one table per congestion control and mode, in the
// seed's layout, with the seed's figures and ratios beside.
func (r *TableResult) WriteMarkdown(w io.Writer) error {
	for _, cc := range r.CCs {
		for _, m := range r.Modes {
			if m == E2E {
				continue
			}
			fmt.Fprintf(w, "\n%s, E2E vs %s (%d B, times in s; A12 = P(E2E slower), > 0.5 favours %s):\n\n", strings.ToUpper(cc), strings.ToUpper(string(m)), r.Size, m)
			t := report.Table{
				Header: []string{"row", "n", "mean E2E", "mean " + string(m), "sd E2E", "sd " + string(m), "A12", "p", string(m) + "/E2E", "seed TTS/E2E", "seed A12", "fails"},
				Align:  []report.Align{report.Left, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right},
			}
			for i, row := range r.Rows {
				c, ok := r.Compare(cc, i, m)
				fails := fmt.Sprintf("%d/%d", r.Failed[key{cc, i, E2E}], r.Failed[key{cc, i, m}])
				seedRatio, seedA12 := "-", "-"
				if row.seedHasFigures {
					seedRatio = f3(row.SeedTTS / row.SeedE2E)
					if row.SeedA12 > 0 {
						seedA12 = f3(row.SeedA12)
					}
				}
				if !ok {
					t.AddRow(row.Name, "0", "-", "-", "-", "-", "-", "-", "-", seedRatio, seedA12, fails)
					continue
				}
				t.AddRow(row.Name, fmt.Sprintf("%d/%d", c.E2E.N, c.Other.N), f3(c.E2E.Mean), f3(c.Other.Mean), f3(c.E2E.SD), f3(c.Other.SD), f3(c.A12), pval(c.P), f3(c.Ratio), seedRatio, seedA12, fails)
			}
			if err := t.WriteMarkdown(w); err != nil {
				return err
			}
		}
	}
	return nil
}

// Plot draws mean time per row and mode (whiskers: +- sd), one series per
// (cc, mode).
func (r *TableResult) Plot() *report.Plot {
	p := &report.Plot{Title: "seed 002 rows: time to stream the file", XLabel: "row", YLabel: "seconds",
		XTick: func(x float64) string {
			i := int(math.Round(x)) - 1
			if i >= 0 && i < len(r.Rows) && math.Abs(x-math.Round(x)) < 1e-9 {
				return r.Rows[i].Name
			}
			return ""
		}}
	for _, cc := range r.CCs {
		for _, m := range r.Modes {
			s := report.Series{Name: cc + " " + string(m)}
			for i := range r.Rows {
				xs := r.Sample[key{cc, i, m}]
				if len(xs) == 0 {
					continue
				}
				mean, sd := stats.Mean(xs), stats.SD(xs)
				s.Points = append(s.Points, report.Point{X: float64(i + 1), Y: mean, Lo: mean - sd, Hi: mean + sd})
			}
			p.Series = append(p.Series, s)
		}
	}
	return p
}

// WriteMarkdown writes the grid: per cell the mean time per number of
// segmentation points, the speedup of the best over end to end, the
// model's prediction and whether the model picks the measured best.
func (g *GridResult) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "\nGrid (%s, %d B, path c-r1-r2-r3-s of 4 equal hops; loss compounds to the end-to-end value; relays per points: 1 = %s, 2 = %s, 3 = %s). Times in s, mean (model):\n\n",
		g.Cfg.CC, g.Cfg.Size, activeNames(g.Active[1]), activeNames(g.Active[2]), activeNames(g.Active[3]))
	t := report.Table{
		Header: []string{"RTT ms", "loss %", "E2E", "1 point", "2 points", "3 points", "best/E2E", "best (meas.)", "best (model)", "n", "fails"},
		Align:  []report.Align{report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right},
	}
	agree, cells := 0, 0
	for _, c := range g.Cells {
		row := []string{fmt.Sprint(c.RTT), fmt.Sprint(c.Loss)}
		bestM, bestP := -1, -1
		mean := [gridHops]float64{}
		for p := range gridHops {
			mean[p] = math.NaN()
			if len(c.Sample[p]) > 0 {
				mean[p] = stats.Mean(c.Sample[p])
			}
			row = append(row, fmt.Sprintf("%s (%s)", f3(mean[p]), f3(c.Predicted[p])))
			if !math.IsNaN(mean[p]) && (bestM < 0 || mean[p] < mean[bestM]) {
				bestM = p
			}
			if bestP < 0 || c.Predicted[p] < c.Predicted[bestP]*0.999 {
				bestP = p
			}
		}
		ratio := math.NaN()
		if bestM >= 0 {
			ratio = mean[bestM] / mean[0]
			cells++
			if bestM == bestP {
				agree++
			}
		}
		n := fmt.Sprintf("%d", len(c.Sample[0]))
		fails := fmt.Sprintf("%d/%d/%d/%d", c.Failed[0], c.Failed[1], c.Failed[2], c.Failed[3])
		row = append(row, f3(ratio), fmt.Sprint(bestM), fmt.Sprint(bestP), n, fails)
		t.AddRow(row...)
	}
	if err := t.WriteMarkdown(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nThe model picks the measured best number of points in %d of %d cells.\n", agree, cells)
	return nil
}

// Plot draws the speedup of 1-3 points over end to end against loss, one
// series per (RTT, points).
func (g *GridResult) Plot() *report.Plot {
	p := &report.Plot{Title: "TTS grid: E2E time / segmented time", XLabel: "end-to-end loss (%)", YLabel: "speedup over E2E"}
	for _, rtt := range g.Cfg.RTTs {
		for pts := 1; pts < gridHops; pts++ {
			s := report.Series{Name: fmt.Sprintf("RTT %g ms, %d pt", rtt, pts)}
			for _, c := range g.Cells {
				if c.RTT != rtt || len(c.Sample[0]) == 0 || len(c.Sample[pts]) == 0 {
					continue
				}
				s.Points = append(s.Points, report.Point{X: c.Loss, Y: stats.Mean(c.Sample[0]) / stats.Mean(c.Sample[pts])})
			}
			p.Series = append(p.Series, s)
		}
	}
	return p
}
