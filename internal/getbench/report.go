package getbench

import (
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/report"
	"github.com/mosto-net/mosto/internal/stats"
)

// summary is one mode's times.
type summary struct {
	n, errs     int
	mean, sd, v float64
	min, max    float64
}

func summarize(rs []Result, sc, mode string) summary {
	var xs []float64
	s := summary{}
	for _, r := range rs {
		if r.Scenario != sc || r.Mode != mode {
			continue
		}
		if r.Err != "" {
			s.errs++
			continue
		}
		xs = append(xs, r.Seconds)
	}
	s.n = len(xs)
	if s.n == 0 {
		return s
	}
	s.mean, s.sd = stats.Mean(xs), stats.SD(xs)
	s.v = s.sd * s.sd
	s.min, s.max = math.Inf(1), 0
	for _, x := range xs {
		s.min, s.max = min(s.min, x), max(s.max, x)
	}
	return s
}

func modes(rs []Result, sc string) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range rs {
		if r.Scenario == sc && !seen[r.Mode] {
			seen[r.Mode] = true
			out = append(out, r.Mode)
		}
	}
	return out
}

func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

// WriteMarkdown writes one table per scenario and the ratios the issue asks
// for.
func WriteMarkdown(w io.Writer, rs []Result) error {
	sizes := map[string]float64{"multisource": 12e6, "nginx": 12e6, "failure": 50e6, "failure-access": 50e6, "multipath": 50e6, "shared": 16e6}
	for _, sc := range []string{"multisource", "nginx", "failure", "failure-access", "multipath", "shared"} {
		ms := modes(rs, sc)
		if len(ms) == 0 {
			continue
		}
		t := report.Table{Header: []string{"mode", "runs", "errors", "mean s", "sd s", "variance", "min s", "max s", "MB/s"},
			Align: []report.Align{report.Left, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right}}
		sum := map[string]summary{}
		for _, m := range ms {
			s := summarize(rs, sc, m)
			sum[m] = s
			mbps := 0.0
			if s.mean > 0 {
				mbps = sizes[sc] / s.mean / 1e6
			}
			t.AddRow(m, strconv.Itoa(s.n), strconv.Itoa(s.errs), f2(s.mean), f2(s.sd), f2(s.v), f2(s.min), f2(s.max), f2(mbps))
		}
		fmt.Fprintf(w, "### %s\n\n", sc)
		if err := t.WriteMarkdown(w); err != nil {
			return err
		}
		fmt.Fprintln(w)
		switch sc {
		case "nginx":
			mg, one := sum["mosto get"], sum["single Paris"]
			if mg.n > 0 && one.n > 0 {
				fmt.Fprintf(w, "- nginx mirrors: mosto get %.2fx Paris alone; variance %.3f vs %.3f; %.2f of what the nominal link rates allow\n", one.mean/mg.mean, mg.v, one.v, Ideal(12e6)/mg.mean)
				if a := sum["aria2c"]; a.n > 0 {
					fmt.Fprintf(w, "- mosto get vs aria2c with the same nginx mirrors: **%.2fx** (aria2c %.2f s)\n", a.mean/mg.mean, a.mean)
				}
				if c := sum["curl Paris"]; c.n > 0 {
					fmt.Fprintf(w, "- mosto get vs curl from Paris' nginx: **%.2fx** (curl %.2f s)\n", c.mean/mg.mean, c.mean)
				}
			}
		case "multisource":
			best, bestMode := math.Inf(1), ""
			for _, m := range ms {
				if len(m) > 7 && m[:7] == "single " && sum[m].n > 0 && sum[m].mean < best {
					best, bestMode = sum[m].mean, m
				}
			}
			mg := sum["mosto get"]
			if mg.n > 0 && bestMode != "" {
				fmt.Fprintf(w, "- mosto get vs the best single source (%s): **%.2fx** faster (goal >= 1.56x); variance %.4f vs %.4f\n", bestMode, best/mg.mean, mg.v, sum[bestMode].v)
				fmt.Fprintf(w, "- share of what the sum of the source rates allows (%.2f s for 12 MB at %.0f Mbit/s): **%.2f** (goal >= 0.9)\n", Ideal(12e6), sumMbit(), Ideal(12e6)/mg.mean)
				if rtt, ok := subflowRTTs(rs, sc); ok {
					b := TCPBound(12e6, sourceMbit(), rtt)
					fmt.Fprintf(w, "- TCP bound of any client on fresh connections (payload 1448/1500, first byte after 2 RTTs, slow start from 10 segments; RTTs %s ms as mosto get measured them): %.2f s = **%.2f** of the nominal time; mosto get at **%.2f** of the bound\n", msList(rtt), b, Ideal(12e6)/b, b/mg.mean)
				}
				// The same against the rates the emulator delivered to each
				// source alone in this run (slow start and emulator losses
				// included).
				var measured float64
				for _, m := range ms {
					if len(m) > 7 && m[:7] == "single " && sum[m].n > 0 {
						measured += 12e6 / sum[m].mean
					}
				}
				if measured > 0 {
					fmt.Fprintf(w, "- share of the sum of the single-source rates measured in this run (%.2f MB/s, %.2f s for 12 MB): **%.2f**\n", measured/1e6, 12e6/measured, 12e6/measured/mg.mean)
				}
				if a := sum["aria2c"]; a.n > 0 {
					fmt.Fprintf(w, "- mosto get vs aria2c with the same mirrors: **%.2fx** (aria2c %.2f s)\n", a.mean/mg.mean, a.mean)
				}
				if c := sum["curl Paris"]; c.n > 0 {
					fmt.Fprintf(w, "- mosto get vs curl from the best source: **%.2fx** (curl %.2f s)\n", c.mean/mg.mean, c.mean)
				}
			}
		case "failure", "failure-access":
			bound := FailureBound(sc)
			for _, tool := range []string{"mosto get", "aria2c"} {
				n, f := sum[tool], sum[tool+", Paris silent"]
				if n.n > 0 && f.n > 0 {
					fmt.Fprintf(w, "- %s: failure %.2f s vs %.2f s without: **%+.1f%%** (seed: +17%%; this world's bound at the run's own efficiency: +%.2f s = **%+.1f%%**)\n",
						tool, f.mean, n.mean, 100*(f.mean/n.mean-1), bound, 100*bound/n.mean)
				}
			}
			writeFailure(w, rs, sc)
		case "shared":
			writeShared(w, rs)
		case "multipath":
			one, two := sum["1 path per source"], sum["2 paths per source"]
			if one.n > 0 && two.n > 0 {
				fmt.Fprintf(w, "- two paths per source: **%.1f%%** faster than one (goal >= 17%%)\n", 100*(1-two.mean/one.mean))
			}
		}
		fmt.Fprintln(w)
	}
	return nil
}

// writeShared writes the shared scenario's shares: the sub-flows' rate
// through the bottleneck, the competing flow's, their fraction, and the
// disjoint sub-flow's rate (its path: 1 MB/s).
func writeShared(w io.Writer, rs []Result) {
	t := report.Table{Header: []string{"mode", "runs", "ours MB/s", "competitor MB/s", "our fraction", "sd", "disjoint MB/s"},
		Align: []report.Align{report.Left, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right}}
	fr := map[string]float64{}
	for _, m := range modes(rs, "shared") {
		var ours, comp, solo, fracs []float64
		for _, r := range rs {
			if r.Scenario == "shared" && r.Mode == m && r.Err == "" && r.Shared != nil {
				ours = append(ours, r.Shared.Ours)
				comp = append(comp, r.Shared.Competitor)
				solo = append(solo, r.Shared.Solo)
				fracs = append(fracs, r.Shared.Ours/(r.Shared.Ours+r.Shared.Competitor))
			}
		}
		if len(ours) == 0 {
			continue
		}
		fr[m] = stats.Mean(fracs)
		t.AddRow(m, strconv.Itoa(len(ours)), f2(stats.Mean(ours)), f2(stats.Mean(comp)), f2(fr[m]), f2(stats.SD(fracs)), f2(stats.Mean(solo)))
	}
	t.WriteMarkdown(w)
	fmt.Fprintln(w)
	one, c, two := fr[OnePath.String()], fr[TwoCoupled.String()], fr[TwoPaths.String()]
	if one > 0 && c > 0 && two > 0 {
		fmt.Fprintf(w, "- fraction of the bottleneck taken beside one TCP flow: coupled **%.2f**, one sub-flow %.2f, two independent %.2f (one TCP flow's fair share: 0.50; two: 0.67)\n", c, one, two)
	}
}

func sumMbit() float64 {
	var m float64
	for _, s := range sources {
		m += s.mbit
	}
	return m
}

// RatePlot returns the per-sub-flow rate over time of the first successful
// download of scenario sc in mode (seed 003's Fig. 5 for the failure run).
func RatePlot(rs []Result, sc, mode, title string) (*report.Plot, bool) {
	for _, r := range rs {
		if r.Scenario != sc || r.Mode != mode || r.Err != "" || r.Stats == nil || len(r.Stats.Samples) == 0 {
			continue
		}
		p := &report.Plot{Title: title, XLabel: "time (s)", YLabel: "rate (MB/s), 300 ms moving average"}
		for i, sf := range r.Stats.Subflows {
			s := report.Series{Name: sf.URL + " " + sf.Path}
			samples := r.Stats.Samples
			for k := range samples {
				var acc float64
				var n int
				for j := max(0, k-1); j <= min(len(samples)-1, k+1); j++ {
					if i < len(samples[j].MBps) {
						acc += samples[j].MBps[i]
						n++
					}
				}
				s.Points = append(s.Points, report.Point{X: samples[k].T, Y: acc / float64(max(n, 1))})
			}
			p.Series = append(p.Series, s)
		}
		return p, true
	}
	return nil, false
}

// writeFailure writes, per mosto get run with the silence, what the
// samples show: each source's rate in the 2 s before the silence and
// during it (from 0.5 s in), the others' rise, when Paris was back and at
// 80% of its earlier rate, and the extra time against the world's bound.
func writeFailure(w io.Writer, rs []Result, sc string) {
	normal := map[int]float64{}
	for _, r := range rs {
		if r.Scenario == sc && r.Mode == "mosto get" && r.Err == "" {
			normal[r.Run] = r.Seconds
		}
	}
	t := report.Table{Header: []string{"run", "extra s", "bound s", "before MB/s (Bud/Par/Fra)", "during MB/s (Bud/Fra)", "rise Bud", "rise Fra", "Paris back s", "Paris 80% s"},
		Align: []report.Align{report.Right, report.Right, report.Right, report.Left, report.Left, report.Right, report.Right, report.Right, report.Right}}
	rows := 0
	for _, r := range rs {
		n, ok := normal[r.Run]
		if r.Scenario != sc || r.Mode != "mosto get, Paris silent" || r.Err != "" || r.Stats == nil || r.SilenceAt == 0 || !ok {
			continue
		}
		at, end := r.SilenceAt, r.SilenceAt+silence.Seconds()
		before := meanRates(r.Stats.Samples, at-2, at)
		during := meanRates(r.Stats.Samples, at+0.5, end)
		if len(before) < 3 || len(during) < 3 {
			continue
		}
		back, p80 := math.NaN(), math.NaN()
		for _, sm := range r.Stats.Samples {
			if sm.T < end || len(sm.MBps) < 2 {
				continue
			}
			if math.IsNaN(back) && sm.MBps[1] > 0 {
				back = sm.T - end
			}
			if math.IsNaN(p80) && sm.MBps[1] >= 0.8*before[1] {
				p80 = sm.T - end
			}
		}
		t.AddRow(strconv.Itoa(r.Run), f2(r.Seconds-n), f2(FailureBound(sc)),
			f2(before[0])+" / "+f2(before[1])+" / "+f2(before[2]), f2(during[0])+" / "+f2(during[2]),
			fmt.Sprintf("%+.0f%%", 100*(during[0]/before[0]-1)), fmt.Sprintf("%+.0f%%", 100*(during[2]/before[2]-1)),
			f2(back), f2(p80))
		rows++
	}
	if rows == 0 {
		return
	}
	fmt.Fprintln(w)
	t.WriteMarkdown(w)
}

// meanRates returns each sub-flow's mean rate (MB/s) over the samples in
// [from, to).
func meanRates(samples []mget.Sample, from, to float64) []float64 {
	var acc []float64
	n := 0
	for _, sm := range samples {
		if sm.T < from || sm.T >= to {
			continue
		}
		for len(acc) < len(sm.MBps) {
			acc = append(acc, 0)
		}
		for i, v := range sm.MBps {
			acc[i] += v
		}
		n++
	}
	for i := range acc {
		acc[i] /= float64(max(n, 1))
	}
	return acc
}
