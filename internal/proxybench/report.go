package proxybench

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/report"
)

func (r *Report) find(mode string) *Result {
	for _, res := range r.Results {
		if res.Mode == mode {
			return res
		}
	}
	return nil
}

// figure reads one figure of a result, one value per run.
type figure func(*Result) []float64

// peerRef is what a mode's figure is compared with: for single relays the
// best tuned peer (tunedPeers), for chains haproxy3.
type peerRef struct {
	name string    // the peer with the best median ("" when none measured)
	med  float64   // its median
	runs []float64 // per run, the best peer's value in that run
}

func isChain(mode string) bool { return mode == ModeMosto3 || mode == ModeHAProxy3 }

// ref returns the reference of mode for the figure get; higher says whether
// a larger value is better (throughput) or worse (CPU, memory, latency).
func (r *Report) ref(mode string, get figure, higher bool) peerRef {
	peers := tunedPeers
	if isChain(mode) {
		peers = []string{ModeHAProxy3}
	}
	better := func(a, b float64) bool { return (higher && a > b) || (!higher && a < b) }
	var p peerRef
	for _, name := range peers {
		res := r.find(name)
		if res == nil {
			continue
		}
		v := get(res)
		if len(v) == 0 || median(v) == 0 {
			continue
		}
		if m := median(v); p.name == "" || better(m, p.med) {
			p.name, p.med = name, m
		}
		for i, x := range v {
			if x == 0 {
				continue
			}
			if i >= len(p.runs) {
				p.runs = append(p.runs, make([]float64, i+1-len(p.runs))...)
			}
			if p.runs[i] == 0 || better(x, p.runs[i]) {
				p.runs[i] = x
			}
		}
	}
	return p
}

// vs formats the ratio of v's median to the reference's, naming the
// reference: "1.23x haproxy".
func (p peerRef) vs(v float64) string {
	if v == 0 || p.med == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx %s", v/p.med, p.name)
}

// ratio formats a/b as "1.23x", or "-" when either is missing.
func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// paired formats the ratios a[i]/b[i] of runs measured side by side
// (same round) as "median (min-max)".
func paired(a, b []float64) string {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", median(rs), slices.Min(rs), slices.Max(rs))
}

func runList(v []float64, format string) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(s, " ")
}

func num(v float64, format string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// Figures read from a Result.
var (
	fGbps     figure = func(r *Result) []float64 { return r.Gbps }
	fCPUPerGB figure = func(r *Result) []float64 { return r.CPUPerGB }
	fConn     figure = func(r *Result) []float64 { return r.ConnPerS }
	fCPUPer1k figure = func(r *Result) []float64 { return r.CPUPer1k }
	fSwitches figure = func(r *Result) []float64 { return r.SwitchesPerConn }
	fCapConn  figure = func(r *Result) []float64 { return r.CappedConnPerS }
	fCapCPU   figure = func(r *Result) []float64 { return r.CappedCPUPer1k }
	fIdleRSS  figure = func(r *Result) []float64 { return scalar(float64(r.IdleRSS)) }
	fIdleAnon figure = func(r *Result) []float64 { return scalar(float64(r.IdleAnon)) }
	fPerConn  figure = func(r *Result) []float64 { return scalar(r.PerConn) }
)

func scalar(v float64) []float64 {
	if v == 0 {
		return nil
	}
	return []float64{v}
}

// addedLatency returns the figure "p50 over direct's p50 in the same run",
// per run. (The p99 is compared as is: direct's tail is the machine's
// noise, and the difference of two tails is not the relay's tail.)
func (r *Report) addedLatency() figure {
	var base []float64
	if d := r.find(ModeDirect); d != nil {
		base = d.LatP50
	}
	return func(res *Result) []float64 {
		v := res.LatP50
		if res.Mode == ModeDirect || len(base) == 0 {
			return nil
		}
		out := make([]float64, 0, len(v))
		for i, x := range v {
			b := median(base)
			if i < len(base) {
				b = base[i]
			}
			out = append(out, max(x-b, 0)) // 0: not above direct's (noise), no ratio
		}
		return out
	}
}

// WriteMarkdown writes the report as Markdown tables. Every figure of a
// single relay is compared with the best tuned peer (HAProxy or nginx,
// whichever is better in that figure: "1.23x haproxy"), as the ratio of
// medians and as the median and range of the per-run ratios to the better
// peer of the same run; chains compare with haproxy3.
func (r *Report) WriteMarkdown(w io.Writer) {
	c := r.Config
	idle := fmt.Sprintf("%d idle flows", c.IdleConns)
	if c.IdleConns < 0 {
		idle = "no idle-flow test"
	}
	fmt.Fprintf(w, "Loopback, %d threads per relay. Throughput: %d runs of %.1f GB per mode, one flow, modes interleaved. "+
		"Conn/s: %d runs of %v per mode, %d parallel clients, %d-byte request and 8-byte reply per connection, interleaved. Memory: %s. "+
		"Ratios are to the best tuned peer of each figure (%s; chains: %s): ratio of medians, and per-run ratio to the better peer of the same run (median, range).\n\n",
		c.Threads, c.Runs, float64(c.Bytes)/1e9, c.Runs, c.ConnDuration, c.ConnParallel, c.ConnPayload, idle,
		strings.Join(tunedPeers, ", "), ModeHAProxy3)
	r.writeHeadline(w)

	fmt.Fprintf(w, "| mode | Gbit/s (median) | runs | vs best peer | per-run ratio | relay CPU s/GB | vs best peer | per-run ratio | relay $/TB at $%.3f/core-hour | load generator CPU s/GB | machine CPUs busy |\n", c.CoreHour)
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, res := range r.Results {
		g, cpu := median(res.Gbps), median(res.CPUPerGB)
		rg, rc := r.ref(res.Mode, fGbps, true), r.ref(res.Mode, fCPUPerGB, false)
		cpuS, cpuR, cpuP, cost := num(cpu, "%.3f"), rc.vs(cpu), paired(res.CPUPerGB, rc.runs), num(report.DollarsPerTB(cpu, c.CoreHour), "%.4f")
		if res.Mode == ModeDirect {
			cpuS, cpuR, cpuP, cost = "(no relay)", "-", "-", "-"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", res.Mode, num(g, "%.2f"), runList(res.Gbps, "%.2f"),
			rg.vs(g), paired(res.Gbps, rg.runs), cpuS, cpuR, cpuP, cost, num(median(res.LoadCPUPerGB), "%.3f"), runList(res.BusyCPUs, "%.2f"))
	}
	fmt.Fprintf(w, "\nCost: relay CPU seconds per GB x 1000 / 3600 x the core-hour price (-core-hour; default seed 001's EC2 m4.large, $0.108/h for 2 cores), "+
		"CPU only (no bandwidth, no idle capacity). Seed 001: CloudFront $%.4f/Tb = $%.2f/TB (request price at 500 KB per request), "+
		"three relay VMs $%.3f/Tb = $%.3f/TB (10 Gbit/s per core assumed). "+
		"Load generator: this process (the client and the sink) per GB; machine CPUs busy: the average over each run from /proc/stat, "+
		"of %d CPUs: where it is near all of them, client, relay and sink share a saturated machine and Gbit/s is about CPUs / (relay + load generator CPU s/GB), "+
		"not the relay's own limit.\n\n",
		report.SeedCloudFrontPerTb, report.SeedCloudFrontPerTb*8, report.SeedRelaysPerTb, report.SeedRelaysPerTb*8, runtime.NumCPU())

	fmt.Fprintln(w, "| mode | conn/s (median) | runs | vs best peer | per-run ratio | failed | relay CPU s per 1k conns | vs best peer | context switches per conn | vs best peer |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, res := range r.Results {
		if len(res.ConnPerS) == 0 {
			continue
		}
		rate, cpu, sw := median(res.ConnPerS), median(res.CPUPer1k), median(res.SwitchesPerConn)
		rr := r.ref(res.Mode, fConn, true)
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %d | %s | %s | %s | %s |\n", res.Mode, rate, runList(res.ConnPerS, "%.0f"),
			rr.vs(rate), paired(res.ConnPerS, rr.runs), res.ConnFail, num(cpu, "%.3f"), r.ref(res.Mode, fCPUPer1k, false).vs(cpu),
			num(sw, "%.2f"), r.ref(res.Mode, fSwitches, false).vs(sw))
	}
	fmt.Fprintln(w)
	if r.CapErr != "" {
		fmt.Fprintf(w, "Conn/s at equal CPU not measured: %s\n\n", r.CapErr)
	} else if c.ConnCPU > 0 && slices.ContainsFunc(r.Results, func(res *Result) bool { return len(res.CappedConnPerS) > 0 }) {
		fmt.Fprintf(w, "Conn/s at equal CPU: every relay in a CPU cgroup of its own held to %.2f CPU (CPU quota, %v period), %d threads each, same clients. "+
			"Where a relay used its whole budget (CPU used = cap) it was the bottleneck and conn/s is its capacity per CPU; "+
			"below the cap the machine was too busy to give it that much. The per-run ratio is the headline.\n\n", c.ConnCPU, c.CapPeriod, c.Threads)
		fmt.Fprintln(w, "| mode | conn/s (median) | runs | vs best peer | per-run ratio | relay CPU s per 1k conns | vs best peer | CPU used per run (CPUs) |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, res := range r.Results {
			if len(res.CappedConnPerS) == 0 {
				continue
			}
			rate, cpu := median(res.CappedConnPerS), median(res.CappedCPUPer1k)
			rr := r.ref(res.Mode, fCapConn, true)
			var used []float64
			for i := range min(len(res.CappedConnPerS), len(res.CappedCPUPer1k)) {
				used = append(used, res.CappedConnPerS[i]*res.CappedCPUPer1k[i]/1000)
			}
			fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %s | %s | %s |\n", res.Mode, rate, runList(res.CappedConnPerS, "%.0f"),
				rr.vs(rate), paired(res.CappedConnPerS, rr.runs), num(cpu, "%.3f"), r.ref(res.Mode, fCapCPU, false).vs(cpu), runList(used, "%.2f"))
		}
		fmt.Fprintln(w)
	}
	if c.LatConns > 0 {
		fmt.Fprintf(w, "Time per connection, one client, %d connections back to back per mode and run (dial, %d bytes, half-close, 8-byte reply, close); "+
			"medians over the runs of each run's percentile; added = p50 over direct's in the same run; p99 compared as measured.\n\n", c.LatConns, c.ConnPayload)
		fmt.Fprintln(w, "| mode | p50 (us) | added (us) | vs best peer (added) | per-run ratio | p99 (us) | vs best peer | per-run ratio | failed |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		f50 := r.addedLatency()
		f99 := func(res *Result) []float64 { return res.LatP99 }
		for _, res := range r.Results {
			if len(res.LatP50) == 0 {
				continue
			}
			a50 := f50(res)
			r50, r99 := r.ref(res.Mode, f50, false), r.ref(res.Mode, f99, false)
			p99, p99r, p99p := median(res.LatP99), r99.vs(median(res.LatP99)), paired(res.LatP99, r99.runs)
			if res.Mode == ModeDirect {
				p99r, p99p = "-", "-"
			}
			fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %.0f | %s | %s | %d |\n", res.Mode, median(res.LatP50), num(median(a50), "%.0f"),
				r50.vs(median(a50)), paired(a50, r50.runs), p99, p99r, p99p, res.LatFail)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "| mode | idle RSS (MB) | vs best peer | of which anonymous (MB) | vs best peer | RSS per idle flow (KB) | vs best peer |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, res := range r.Results {
		if res.IdleRSS == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %.1f | %s | %.1f | %s | %s | %s |\n", res.Mode,
			float64(res.IdleRSS)/1e6, r.ref(res.Mode, fIdleRSS, false).vs(float64(res.IdleRSS)),
			float64(res.IdleAnon)/1e6, r.ref(res.Mode, fIdleAnon, false).vs(float64(res.IdleAnon)),
			num(res.PerConn/1e3, "%.1f"), r.ref(res.Mode, fPerConn, false).vs(res.PerConn))
	}
	var errs []string
	for _, res := range r.Results {
		if res.Err != "" {
			errs = append(errs, fmt.Sprintf("- %s: %s", res.Mode, res.Err))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nNot measured:\n%s\n", strings.Join(errs, "\n"))
	}
	fmt.Fprintf(w, "\nElapsed %v. mosto3 is three chained daemons (InP, TrP, EgP), haproxy3 three chained tuned HAProxy processes; their CPU and RSS are the sums of the three. "+
		"CPU is utime+stime of each relay's process tree from /proc/PID/stat; RSS sums the tree.\n", r.Elapsed.Round(time.Second))
}

// pairedMedian returns the median of the per-run ratios a[i]/b[i] (0 when
// no run has both).
func pairedMedian(a, b []float64) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if a[i] > 0 && b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	return median(rs)
}

// capUsed returns the CPUs a relay used per run of the equal-CPU test.
func capUsed(res *Result) []float64 {
	var used []float64
	for i := range min(len(res.CappedConnPerS), len(res.CappedCPUPer1k)) {
		used = append(used, res.CappedConnPerS[i]*res.CappedCPUPer1k[i]/1000)
	}
	return used
}

// writeHeadline writes, for each single mosto relay, issue 18's figures
// against the best tuned peer of each run: the per-run (paired) ratio,
// the target and whether its median reaches it.
func (r *Report) writeHeadline(w io.Writer) {
	type row struct {
		name   string
		get    figure
		higher bool    // a larger value is better
		target float64 // the ratio to reach
		format string
	}
	rows := []row{
		{"single-flow throughput (Gbit/s)", fGbps, true, 1.2, "%.2f"},
		{"relay CPU s per GB", fCPUPerGB, false, 0.6, "%.3f"},
		{"conn/s at equal CPU (own cgroup each)", fCapConn, true, 1.2, "%.0f"},
		{"added time per connection, p50 (us)", r.addedLatency(), false, 1.0, "%.0f"},
		{"idle RSS (MB)", func(res *Result) []float64 { return scalar(float64(res.IdleRSS) / 1e6) }, false, 1.0, "%.1f"},
		{"RSS per idle flow (KB)", func(res *Result) []float64 { return scalar(res.PerConn / 1e3) }, false, 1.0, "%.1f"},
	}
	for _, mode := range []string{ModeMosto1, ModeMosto1G, ModeMosto1Off} {
		res := r.find(mode)
		if res == nil || res.Err != "" {
			continue
		}
		fmt.Fprintf(w, "**Headline: %s against the best tuned peer of each run** (per-run ratio: each run against the better of %s in the same run; median and range).\n\n",
			mode, strings.Join(tunedPeers, " and "))
		fmt.Fprintln(w, "| figure | "+mode+" (median) | best tuned peer (median) | per-run ratio | target | met |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
		for _, x := range rows {
			v := x.get(res)
			p := r.ref(mode, x.get, x.higher)
			if len(v) == 0 || p.name == "" {
				continue
			}
			pr := pairedMedian(v, p.runs)
			met := "no"
			if (x.higher && pr >= x.target) || (!x.higher && pr <= x.target) {
				met = "yes"
			}
			if pr == 0 {
				met = "-"
			}
			op := "<="
			if x.higher {
				op = ">="
			}
			mine, theirs := num(median(v), x.format), fmt.Sprintf("%s %s", p.name, num(p.med, x.format))
			if x.name == "conn/s at equal CPU (own cgroup each)" {
				mine += fmt.Sprintf(" at %s CPU", runList(capUsed(res), "%.2f"))
				if peer := r.find(p.name); peer != nil {
					theirs += fmt.Sprintf(" at %s CPU", runList(capUsed(peer), "%.2f"))
				}
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s %.1fx | %s |\n", x.name, mine, theirs, paired(v, p.runs), op, x.target, met)
		}
		cost := r.ref(mode, fCPUPerGB, false)
		if c := median(res.CPUPerGB); c > 0 && cost.name != "" {
			fmt.Fprintf(w, "| relay CPU cost per delivered TB at $%.3f/core-hour | $%.4f | %s $%.4f | - | seed 001: relay VMs $%.3f/TB, CloudFront $%.2f/TB | - |\n",
				r.Config.CoreHour, report.DollarsPerTB(c, r.Config.CoreHour), cost.name, report.DollarsPerTB(cost.med, r.Config.CoreHour), report.SeedRelaysPerTb*8, report.SeedCloudFrontPerTb*8)
		}
		fmt.Fprintln(w)
	}
}
