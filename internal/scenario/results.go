package scenario

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/mosto-net/mosto/internal/report"
	"github.com/mosto-net/mosto/internal/stats"
	"github.com/mosto-net/mosto/internal/transfer"
)

// Plan says what to measure.
type Plan struct {
	Modes []Mode
	Sizes []int64
	Runs  int
	// CoreHour is the price of a CPU core-hour in dollars for the proxies'
	// cost per delivered TB (0: DefaultCoreHour).
	CoreHour float64
	// Progress, if set, is called after every fetch.
	Progress func(run int, smp Sample)
}

// Results holds time-to-last-byte samples in milliseconds.
type Results struct {
	Modes   []Mode
	Sizes   []int64
	Runs    int
	MS      map[Mode]map[int64][]float64
	Chains  map[int64][]string // chain the InP's flow took, per size (from metrics)
	Planned map[int64][]string // chain the table holds, per size
	Model   map[int64]float64  // the table's predicted time of that chain (ms), per size
	// Fetch is the fetch model's prediction of the whole fetch through
	// that chain, per size: Predicted[Chain].
	Fetch map[int64]float64
	// Predicted is the fetch model's time (ms) per mode and size, for the
	// modes it describes (every mode but the cold restarts).
	Predicted map[Mode]map[int64]float64
	// CoreHour is Plan.CoreHour.
	CoreHour float64
	// Source says where the table came from (the controller, with its
	// version, or pathcomp over the configured RTTs).
	Source string
	// NotCold counts cdn-cold fetches during which nginx reused an upstream
	// connection, and NotWarm cdn-warm and cdn-default fetches that opened
	// a new one.
	NotCold, NotWarm int
	// ColdFlows and ColdPooled count, per cold mode (mosto-cold,
	// mosto-plain), its fetches and the hops of them served from a pool.
	ColdFlows, ColdPooled map[Mode]int
	// CPU holds every fetch's processor time, like MS.
	CPU     map[Mode]map[int64][]CPU
	RTT     time.Duration // configured client-origin RTT
	RateBps float64       // bottleneck rate of the direct path, bytes/s; 0: none
	// Machine is the machine's measured rates (Scenario.SetMachineRate):
	// Chain went into the chain's fetch model, Link into MachineLimit.
	Machine MachineRates
}

// Measure runs the plan: for every run, for every size, every mode once, in
// an order that rotates with the run so no mode always goes first (cdn-cold
// always precedes cdn-warm, which then finds the connection it opened;
// without cdn-cold an untimed fetch of the same size primes cdn-warm).
func (s *Scenario) Measure(ctx context.Context, p Plan) (*Results, error) {
	if p.Runs < 1 {
		return nil, fmt.Errorf("scenario: runs %d < 1", p.Runs)
	}
	r := &Results{Modes: p.Modes, Sizes: p.Sizes, Runs: p.Runs, MS: make(map[Mode]map[int64][]float64),
		Chains: make(map[int64][]string), Planned: make(map[int64][]string), Model: make(map[int64]float64),
		Fetch: make(map[int64]float64), Predicted: make(map[Mode]map[int64]float64), CoreHour: p.CoreHour}
	if r.CoreHour <= 0 {
		r.CoreHour = DefaultCoreHour
	}
	r.RTT, r.RateBps = s.OriginRTT()
	r.Machine = s.machine
	r.Source = fmt.Sprintf("computed by pathcomp from the world's RTTs, table version %d", s.TableVersion())
	if s.ctl != nil {
		r.Source = fmt.Sprintf("from the controller's table version %d for %s, computed from the RTTs the proxies measured", s.TableVersion(), s.roles.InP)
	} else if s.cfg.Table != nil {
		r.Source = fmt.Sprintf("from the given table file, version %d", s.TableVersion())
	}
	r.CPU = make(map[Mode]map[int64][]CPU)
	for _, m := range p.Modes {
		r.MS[m] = make(map[int64][]float64)
		r.CPU[m] = make(map[int64][]CPU)
	}
	paced := s.originPaces()
	for _, size := range p.Sizes {
		var path []string
		if e, ok := s.ComputedEntry(size); ok {
			r.Planned[size] = e.Path
			r.Model[size] = e.CostMS
			path = e.Path
		}
		for _, m := range p.Modes {
			if v, ok := s.predict(m, size, path, paced); ok {
				if r.Predicted[m] == nil {
					r.Predicted[m] = make(map[int64]float64)
				}
				r.Predicted[m][size] = v
				if m == Chain {
					r.Fetch[size] = v
				}
			}
		}
	}
	var others, colds []Mode
	hasCold, hasWarm, hasDefault := false, false, false
	for _, m := range p.Modes {
		switch m {
		case ChainCold, ChainPlain:
			colds = append(colds, m)
		case CDNCold:
			hasCold = true
		case CDNWarm:
			hasWarm = true
		case CDNDefault:
			hasDefault = true
		default:
			others = append(others, m)
		}
	}
	for run := 0; run < p.Runs; run++ {
		for _, size := range p.Sizes {
			var order []Mode
			// The cold modes restart the proxies; they go first, so the
			// warm modes after them find refilled pools.
			for k := range colds {
				order = append(order, colds[(k+run)%len(colds)])
			}
			if hasCold {
				order = append(order, CDNCold)
			}
			if hasWarm {
				order = append(order, CDNWarm)
			}
			if hasDefault {
				// After cdn-warm: the upstream connection exists and has
				// carried this size.
				order = append(order, CDNDefault)
			}
			for k := range others {
				order = append(order, others[(k+run)%len(others)])
			}
			for _, m := range order {
				if m == CDNWarm && !hasCold || m == CDNDefault && !hasCold && !hasWarm {
					// Without a cold fetch just before, prime nginx's
					// upstream connection with an untimed fetch of the same
					// size, so that cdn-warm is warm (the CDN's best case)
					// whatever came before (a cold restart of the proxies
					// outlasts nginx's idle timeout).
					if _, err := s.Fetch(ctx, CDNWarm, size, 0); err != nil {
						return r, err
					}
				}
				var before Hops
				trace := run == 0 && m == Chain
				if trace {
					// Restart first if a cold mode left the plain proxies,
					// so the counters read before and after are the same
					// processes'.
					if err := s.prepare(ctx, m); err != nil {
						return r, err
					}
					before, _ = s.Hops(ctx)
				}
				smp, err := s.Fetch(ctx, m, size, uint64(run*1000+len(r.MS[m][size])))
				if err != nil {
					return r, err
				}
				if trace && before != nil {
					if after, err := s.Hops(ctx); err == nil {
						if c, ok := UsedChain(before, after, s.roles.InP); ok {
							r.Chains[size] = c
						}
					}
				}
				switch {
				case m == CDNCold && !smp.NewOriginConn:
					r.NotCold++
				case (m == CDNWarm || m == CDNDefault) && smp.NewOriginConn:
					r.NotWarm++
				}
				r.MS[m][size] = append(r.MS[m][size], float64(smp.Result.Total)/1e6)
				r.CPU[m][size] = append(r.CPU[m][size], smp.CPU)
				if isCold(m) {
					if r.ColdFlows == nil {
						r.ColdFlows, r.ColdPooled = make(map[Mode]int), make(map[Mode]int)
					}
					r.ColdFlows[m], r.ColdPooled[m] = s.ColdPooled(m)
				}
				if p.Progress != nil {
					p.Progress(run, smp)
				}
			}
		}
	}
	return r, nil
}

// Limit returns the physical limit for size in ms: one client-origin RTT plus
// size over the bottleneck rate.
func (r *Results) Limit(size int64) float64 {
	ms := float64(r.RTT) / 1e6
	if r.RateBps > 0 {
		ms += float64(size) / r.RateBps * 1e3
	}
	return ms
}

// MachineLimit is Limit with the machine's one-link rate (Machine.Link)
// as the bottleneck when the world states none or a larger one: no mode's
// bytes can cross this machine faster. NaN without a measured rate.
func (r *Results) MachineLimit(size int64) float64 {
	rate := r.Machine.Link
	if rate <= 0 {
		return math.NaN()
	}
	if r.RateBps > 0 {
		rate = min(rate, r.RateBps)
	}
	return float64(r.RTT)/1e6 + float64(size)/rate*1e3
}

// Median returns the median time of mode at size, NaN if not measured.
func (r *Results) Median(m Mode, size int64) float64 { return stats.Median(r.MS[m][size]) }

func ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// WriteMarkdown writes the summary table, the comparison tables (A12 and
// Mann-Whitney p against direct and against the warm CDN) and the ratio to
// the physical limit.
func (r *Results) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "Time to last byte in ms, %d runs per cell; client-origin RTT %.1f ms", r.Runs, float64(r.RTT)/1e6)
	if r.RateBps > 0 {
		fmt.Fprintf(w, ", bottleneck %.0f Mbit/s", r.RateBps*8/1e6)
	}
	if r.Machine.Chain > 0 {
		fmt.Fprintf(w, "; machine rate along the chain %.0f Mbit/s (measured by calibration fetches, given to the chain's fetch model)", r.Machine.Chain*8/1e6)
	}
	if r.Machine.Link > 0 {
		fmt.Fprintf(w, "; machine rate over one emulated link %.0f Mbit/s", r.Machine.Link*8/1e6)
	}
	fmt.Fprint(w, ".\n\n")
	t := &report.Table{Header: []string{"size", "mode", "n", "mean", "sd", "median", "p5", "p95"},
		Align: []report.Align{report.Left, report.Left, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right}}
	for _, size := range r.Sizes {
		for _, m := range r.Modes {
			sm, err := stats.Summarize(r.MS[m][size])
			if err != nil {
				continue
			}
			t.AddRow(transfer.FormatSize(size), string(m), strconv.Itoa(sm.N), ms(sm.Mean), ms(sm.SD), ms(sm.Median), ms(sm.P5), ms(sm.P95))
		}
	}
	if err := t.WriteMarkdown(w); err != nil {
		return err
	}
	for _, base := range []Mode{Direct, CDNWarm, ChainPlain} {
		if !r.has(base) {
			continue
		}
		fmt.Fprintf(w, "\nAgainst %s: speedup = median(%s) / median(mode); A12 = P(mode slower than %s), < 0.5 means the mode is faster; p: two-sided Mann-Whitney U.\n\n", base, base, base)
		c := &report.Table{Header: []string{"size", "mode", "speedup", "A12", "p"},
			Align: []report.Align{report.Left, report.Left, report.Right, report.Right, report.Right}}
		for _, size := range r.Sizes {
			b := r.MS[base][size]
			for _, m := range r.Modes {
				x := r.MS[m][size]
				if m == base || len(x) == 0 || len(b) == 0 {
					continue
				}
				mw, err := stats.MannWhitneyU(x, b)
				if err != nil {
					return err
				}
				c.AddRow(transfer.FormatSize(size), string(m),
					strconv.FormatFloat(stats.Median(b)/stats.Median(x), 'f', 2, 64)+"x",
					strconv.FormatFloat(stats.A12(x, b), 'f', 2, 64), strconv.FormatFloat(mw.P, 'g', 3, 64))
			}
		}
		if err := c.WriteMarkdown(w); err != nil {
			return err
		}
	}
	fmt.Fprint(w, "\nPhysical limit = one client-origin RTT + size / bottleneck rate; ratio = median / limit (1.00 is the limit).\n\n")
	hdr := []string{"size", "limit ms"}
	for _, m := range r.Modes {
		hdr = append(hdr, string(m))
	}
	lt := &report.Table{Header: hdr}
	for i := 1; i < len(hdr); i++ {
		lt.Align = append(lt.Align, report.Right)
	}
	lt.Align = append([]report.Align{report.Left}, lt.Align...)
	for _, size := range r.Sizes {
		row := []string{transfer.FormatSize(size), ms(r.Limit(size))}
		for _, m := range r.Modes {
			row = append(row, strconv.FormatFloat(r.Median(m, size)/r.Limit(size), 'f', 2, 64))
		}
		lt.AddRow(row...)
	}
	if err := lt.WriteMarkdown(w); err != nil {
		return err
	}
	if r.Machine.Link > 0 {
		fmt.Fprintf(w, "\nMachine limit = one client-origin RTT + size / the smaller of the bottleneck rate and the machine's rate over one emulated link (%.0f Mbit/s, measured): the fastest any mode's bytes cross this machine; ratio = median / machine limit.\n\n", r.Machine.Link*8/1e6)
		mt := &report.Table{Header: hdr, Align: lt.Align}
		for _, size := range r.Sizes {
			row := []string{transfer.FormatSize(size), ms(r.MachineLimit(size))}
			for _, m := range r.Modes {
				row = append(row, strconv.FormatFloat(r.Median(m, size)/r.MachineLimit(size), 'f', 2, 64))
			}
			mt.AddRow(row...)
		}
		if err := mt.WriteMarkdown(w); err != nil {
			return err
		}
	}
	if len(r.Planned) > 0 {
		src := r.Source
		if src == "" {
			src = "computed = the table's chain"
		}
		fmt.Fprintf(w, "\nChains (%s; used = what the proxies' metrics show for the first mosto-chain fetch; model = the table's predicted time, 1/2 sum + (rounds-1) max of the hop RTTs, which leaves out connection set-up; "+
			"fetch model = the whole fetch as the data path runs it: %s; error = fetch model / measured median - 1):\n\n", src, fetchModelDoc)
		ct := &report.Table{Header: []string{"size", "computed", "used", "model ms", "fetch model ms", "measured median ms", "error"},
			Align: []report.Align{report.Left, report.Left, report.Left, report.Right, report.Right, report.Right, report.Right}}
		for _, size := range r.Sizes {
			model, fetch, errPct := "-", "-", "-"
			if v, ok := r.Model[size]; ok {
				model = ms(v)
			}
			med := r.Median(Chain, size)
			if v, ok := r.Fetch[size]; ok {
				fetch = ms(v)
				if med > 0 {
					errPct = strconv.FormatFloat(100*(v/med-1), 'f', 0, 64) + "%"
				}
			}
			ct.AddRow(transfer.FormatSize(size), chainString(r.Planned[size]), chainString(r.Chains[size]), model, fetch, ms(med), errPct)
		}
		if err := ct.WriteMarkdown(w); err != nil {
			return err
		}
	}
	if err := r.writePredicted(w); err != nil {
		return err
	}
	if err := r.writeCPU(w); err != nil {
		return err
	}
	for _, m := range []Mode{ChainCold, ChainPlain} {
		if n := r.ColdFlows[m]; n > 0 {
			fmt.Fprintf(w, "\n%s: %d fetches, each the first flow after every proxy restarted (TCP metrics and Fast Open cookies flushed on the FEPs); %d hops of them were served from a pool filled during the start.\n", m, n, r.ColdPooled[m])
		}
	}
	if r.NotCold > 0 || r.NotWarm > 0 {
		fmt.Fprintf(w, "\nWarning: %d cdn-cold fetches found a warm upstream connection and %d cdn-warm or cdn-default fetches opened a new one.\n", r.NotCold, r.NotWarm)
	}
	return nil
}

// writeCPU writes the median processor time per fetch: this process (the
// emulator with the client and the origin), the proxies, and the machine's
// busy share over the fetch.
func (r *Results) writeCPU(w io.Writer) error {
	if len(r.CPU) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nProcessor time per fetch (medians; 10 ms resolution): emu = the bench process (emulator, which also runs the receivers' TCP stacks, client, origin), proxies = all proxies together, busy = share of both CPUs busy during the fetch (all processes, other users' too); "+
		"proxies CPU s/GB = the proxies' CPU summed over the cell's fetches / the bytes they delivered (the whole proxies: relaying, probes, pool upkeep; small sizes are dominated by the 10 ms tick), "+
		"$/TB = that at $%.3f per core-hour (CPU only; %s).\n\n", r.CoreHour, report.SeedCostNote())
	t := &report.Table{Header: []string{"size", "mode", "emu ms", "proxies ms", "busy", "proxies CPU s/GB", "proxies $/TB"},
		Align: []report.Align{report.Left, report.Left, report.Right, report.Right, report.Right, report.Right, report.Right}}
	for _, size := range r.Sizes {
		for _, m := range r.Modes {
			cs := r.CPU[m][size]
			if len(cs) == 0 {
				continue
			}
			var e, p, b []float64
			var sum time.Duration
			for _, c := range cs {
				e = append(e, float64(c.Emu)/1e6)
				p = append(p, float64(c.Proxies)/1e6)
				b = append(b, c.Busy)
				sum += c.Proxies
			}
			perGB, cost := "-", "-"
			if sum > 0 && m != Direct && !isCDN(m) {
				v := sum.Seconds() / (float64(size) * float64(len(cs)) / 1e9)
				perGB = strconv.FormatFloat(v, 'f', 3, 64)
				cost = strconv.FormatFloat(report.DollarsPerTB(v, r.CoreHour), 'f', 4, 64)
			}
			t.AddRow(transfer.FormatSize(size), string(m), ms(stats.Median(e)), ms(stats.Median(p)),
				strconv.FormatFloat(100*stats.Median(b), 'f', 0, 64)+"%", perGB, cost)
		}
	}
	return t.WriteMarkdown(w)
}

func chainString(c []string) string {
	if len(c) == 0 {
		return "-"
	}
	s := c[0]
	for _, x := range c[1:] {
		s += " > " + x
	}
	return s
}

func (r *Results) has(m Mode) bool {
	for _, x := range r.Modes {
		if x == m {
			return true
		}
	}
	return false
}

// WriteSVG plots median time against size per mode (log x) with p5-p95
// whiskers, and the physical limit.
func (r *Results) WriteSVG(w io.Writer, title string) error {
	p := &report.Plot{Title: title, XLabel: "object size", YLabel: "time to last byte (ms)", LogX: true,
		XTick: func(v float64) string { return transfer.FormatSize(int64(math.Round(v))) }}
	for _, m := range r.Modes {
		s := report.Series{Name: string(m)}
		for _, size := range r.Sizes {
			x := r.MS[m][size]
			if len(x) == 0 {
				continue
			}
			s.Points = append(s.Points, report.Point{X: float64(size), Y: stats.Median(x), Lo: stats.Percentile(x, 5), Hi: stats.Percentile(x, 95)})
		}
		if len(s.Points) > 0 {
			p.Series = append(p.Series, s)
		}
	}
	lim := report.Series{Name: "physical limit"}
	for _, size := range r.Sizes {
		lim.Points = append(lim.Points, report.Point{X: float64(size), Y: r.Limit(size)})
	}
	p.Series = append(p.Series, lim)
	return p.WriteSVG(w)
}

// writePredicted writes the fetch model against the measured median of
// every mode it describes, per size, with the error (model / measured - 1)
// and the largest error per mode.
func (r *Results) writePredicted(w io.Writer) error {
	var modes []Mode
	for _, m := range r.Modes {
		if len(r.Predicted[m]) > 0 {
			modes = append(modes, m)
		}
	}
	if len(modes) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nFetch model vs measured, every mode (model ms / measured median ms (error); the model: %s):\n\n", fetchModelDoc)
	t := &report.Table{Header: []string{"size"}, Align: []report.Align{report.Left}}
	for _, m := range modes {
		t.Header = append(t.Header, string(m))
		t.Align = append(t.Align, report.Right)
	}
	worst := make([]float64, len(modes))
	for _, size := range r.Sizes {
		row := []string{transfer.FormatSize(size)}
		for k, m := range modes {
			v, ok := r.Predicted[m][size]
			med := r.Median(m, size)
			if !ok || med <= 0 {
				row = append(row, "-")
				continue
			}
			e := v/med - 1
			if math.Abs(e) > math.Abs(worst[k]) {
				worst[k] = e
			}
			row = append(row, fmt.Sprintf("%s / %s (%+.0f%%)", ms(v), ms(med), 100*e))
		}
		t.AddRow(row...)
	}
	row := []string{"largest error"}
	for k := range modes {
		row = append(row, fmt.Sprintf("%+.0f%%", 100*worst[k]))
	}
	t.AddRow(row...)
	return t.WriteMarkdown(w)
}
