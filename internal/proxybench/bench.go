package proxybench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Config selects what Run measures. Zero fields take the defaults below.
type Config struct {
	Modes []string // subset of AllModes; nil: all

	Mosto    string // mosto binary for the mosto modes (required for them)
	HAProxy  string // haproxy binary; "" looks it up in PATH
	Nginx    string // nginx binary; "" looks it up in PATH
	NginxMod string // stream module to load; "" uses the Debian path if present

	Bytes int64 // bytes per single-flow throughput run (default 2 GB)
	Runs  int   // throughput runs per mode, interleaved (default 3)

	ConnDuration time.Duration // per mode (default 3s)
	ConnParallel int           // parallel clients (default 16)
	ConnPayload  int           // bytes per short connection (default 64)
	// ConnCPU is the CPU budget (in CPUs, e.g. 0.5) each relay gets in a
	// second connection-rate test, so conn/s compares relays at equal CPU
	// (a cgroup CPU quota; needs root). 0 takes the default, < 0 skips it.
	ConnCPU float64

	IdleConns int // idle flows for memory per connection (default 5000; < 0 skips)

	// LatConns is the number of back-to-back connections of one client
	// per mode and run in the latency test (default 2000; < 0 skips).
	LatConns int

	Dir string       `json:"-"` // work directory for configs; "" makes a temporary one
	Log *slog.Logger `json:"-"` // progress; nil discards
}

// Defaults.
const (
	DefaultBytes        = 2_000_000_000
	DefaultRuns         = 3
	DefaultConnDuration = 3 * time.Second
	DefaultConnParallel = 16
	DefaultConnPayload  = 64
	DefaultIdleConns    = 5000
	DefaultLatConns     = 2000
	DefaultConnCPU      = 0.5
	debianStreamModule  = "/usr/lib/nginx/modules/ngx_stream_module.so"
)

// Result is everything measured for one mode.
type Result struct {
	Mode string
	Err  string // why this mode could not be measured, if so

	IdleRSS  int64 // bytes, all relay processes, before any traffic
	IdleAnon int64 // the anonymous (private) part of IdleRSS; the rest is mapped binaries and libraries

	Gbps     []float64 // one per throughput run
	CPUPerGB []float64 // relay CPU seconds per GB moved, per run
	ConnPerS []float64 // one per run
	ConnFail int64
	CPUPer1k []float64 // relay CPU seconds per 1000 connections, per run
	// CappedConnPerS and CappedCPUPer1k are the same test with the relay
	// held to Config.ConnCPU CPUs.
	CappedConnPerS []float64
	CappedCPUPer1k []float64
	// SwitchesPerConn is the relay threads' context switches (voluntary
	// and not) per connection, per run.
	SwitchesPerConn []float64
	// LatP50 and LatP99 are the median and 99th percentile time per
	// connection (microseconds) of one client without load, per run.
	LatP50, LatP99 []float64
	LatFail        int
	IdleFlows      int
	PerConn        float64 // RSS bytes per idle flow
}

// Report is the outcome of Run.
type Report struct {
	Config  Config
	Results []*Result
	// CapErr says why the equal-CPU connection-rate test did not run.
	CapErr  string `json:",omitempty"`
	Started time.Time
	Elapsed time.Duration
}

func (c *Config) fill() {
	if len(c.Modes) == 0 {
		c.Modes = AllModes
	}
	if c.Bytes <= 0 {
		c.Bytes = DefaultBytes
	}
	if c.Runs <= 0 {
		c.Runs = DefaultRuns
	}
	if c.ConnDuration <= 0 {
		c.ConnDuration = DefaultConnDuration
	}
	if c.ConnParallel <= 0 {
		c.ConnParallel = DefaultConnParallel
	}
	if c.ConnPayload <= 0 {
		c.ConnPayload = DefaultConnPayload
	}
	if c.IdleConns == 0 {
		c.IdleConns = DefaultIdleConns
	}
	if c.LatConns == 0 {
		c.LatConns = DefaultLatConns
	}
	if c.ConnCPU == 0 {
		c.ConnCPU = DefaultConnCPU
	}
	if c.HAProxy == "" {
		c.HAProxy, _ = exec.LookPath("haproxy")
	}
	if c.Nginx == "" {
		c.Nginx, _ = exec.LookPath("nginx")
	}
	if c.NginxMod == "" {
		if _, err := os.Stat(debianStreamModule); err == nil {
			c.NginxMod = debianStreamModule
		}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Run measures every mode of cfg side by side and returns the report. A
// mode that cannot start is reported with its error; Run fails only when
// nothing could be measured or ctx ends.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.fill()
	for _, m := range cfg.Modes {
		if !slices.Contains(AllModes, m) {
			return nil, fmt.Errorf("unknown mode %q (want some of %s)", m, strings.Join(AllModes, ","))
		}
	}
	rep := &Report{Config: cfg, Started: time.Now()}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "mosto-bench-proxy-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		cfg.Dir = d
	}
	sk, err := newSink()
	if err != nil {
		return nil, err
	}
	defer sk.close()
	st := &setup{dir: cfg.Dir, origin: sk.addr(), mosto: cfg.Mosto, haproxy: cfg.HAProxy,
		nginx: cfg.Nginx, nginxMod: cfg.NginxMod, maxconn: raiseFileLimit(), log: cfg.Log}

	relays := map[string]*relay{}
	defer func() {
		for _, r := range relays {
			r.stop(3 * time.Second)
		}
	}()
	for _, m := range cfg.Modes {
		res := &Result{Mode: m}
		rep.Results = append(rep.Results, res)
		r, err := st.start(ctx, m)
		if err != nil {
			res.Err = err.Error()
			cfg.Log.Warn("mode unavailable", "mode", m, "err", err)
			continue
		}
		relays[m] = r
		if len(r.procs) > 0 {
			time.Sleep(300 * time.Millisecond) // let start-up allocations settle
			_, res.IdleRSS = r.usage()
			res.IdleAnon = anonUsage(r.pids())
		}
	}
	if len(relays) == 0 {
		return rep, errors.New("no mode could be started")
	}

	// Single-flow throughput, modes interleaved within each run.
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	for run := 0; run < cfg.Runs; run++ {
		for _, res := range rotate(rep.Results, run) {
			r := relays[res.Mode]
			if r == nil || res.Err != "" {
				continue
			}
			cpu0, _ := r.usage()
			d, err := transfer(ctx, r.entry, cfg.Bytes, buf)
			cpu1, _ := r.usage()
			if err == nil {
				err = r.exited()
			}
			if err != nil {
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
				res.Err = fmt.Sprintf("throughput: %v", err)
				cfg.Log.Warn("throughput failed", "mode", res.Mode, "err", err)
				continue
			}
			gbps := float64(cfg.Bytes) * 8 / d.Seconds() / 1e9
			res.Gbps = append(res.Gbps, gbps)
			res.CPUPerGB = append(res.CPUPerGB, (cpu1-cpu0).Seconds()/(float64(cfg.Bytes)/1e9))
			cfg.Log.Info("throughput", "mode", res.Mode, "run", run+1, "gbps", fmt.Sprintf("%.2f", gbps),
				"cpu_s_per_gb", fmt.Sprintf("%.3f", res.CPUPerGB[len(res.CPUPerGB)-1]))
		}
	}

	// Time per connection without load.
	if cfg.LatConns > 0 {
		if err := latencyPhase(ctx, cfg, rep, relays); err != nil {
			return rep, err
		}
	}

	// Memory per idle connection, before the connection-rate test fills the
	// ephemeral port space with TIME_WAIT sockets.
	if cfg.IdleConns > 0 {
		for _, res := range rep.Results {
			r := relays[res.Mode]
			if r == nil || res.Err != "" || len(r.procs) == 0 {
				continue
			}
			_, rss0 := r.usage()
			conns, err := openIdle(ctx, r.entry, cfg.IdleConns, sk, 30*time.Second)
			if err == nil {
				time.Sleep(500 * time.Millisecond)
				_, rss1 := r.usage()
				res.IdleFlows = len(conns)
				res.PerConn = float64(rss1-rss0) / float64(len(conns))
				cfg.Log.Info("idle flows", "mode", res.Mode, "flows", len(conns), "bytes_per_flow", int(res.PerConn))
			} else {
				cfg.Log.Warn("idle flows failed", "mode", res.Mode, "err", err)
				res.Err = fmt.Sprintf("idle flows: %v; relay output: %s", err, tail(r.log.String(), 600))
			}
			for _, c := range conns {
				c.Close()
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	// Connections per second, modes interleaved within each run: first as
	// fast as the machine allows, then with every relay held to the same
	// CPU budget.
	if err := connPhase(ctx, cfg, rep, relays, false); err != nil {
		return rep, err
	}
	if cfg.ConnCPU > 0 {
		cc, err := newCPUCap()
		if err == nil {
			err = capPhase(ctx, cfg, rep, relays, cc)
			if rerr := cc.remove(); rerr != nil {
				cfg.Log.Warn("cgroup left behind", "err", rerr)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			rep.CapErr = err.Error()
			cfg.Log.Warn("equal-CPU connection rate not measured", "err", err)
		}
	}

	rep.Elapsed = time.Since(rep.Started)
	return rep, nil
}

// rotate returns the results in the order of run: run k starts with the
// k-th mode, so no mode always follows the same one (TIME_WAIT sockets and
// warm caches left by a mode favour or handicap the next).
func rotate(rs []*Result, run int) []*Result {
	if len(rs) == 0 {
		return nil
	}
	k := run % len(rs)
	return append(slices.Clone(rs[k:]), rs[:k]...)
}

// connPhase runs the connection-rate test cfg.Runs times per mode,
// recording into the capped or the unconstrained figures.
func connPhase(ctx context.Context, cfg Config, rep *Report, relays map[string]*relay, capped bool) error {
	for run := 0; run < cfg.Runs; run++ {
		for _, res := range rotate(rep.Results, run) {
			r := relays[res.Mode]
			if r == nil || res.Err != "" {
				continue
			}
			if capped && len(r.procs) == 0 {
				continue // direct: nothing to cap
			}
			cpu0, _ := r.usage()
			sw0 := switches(r.pids())
			ok, failed, sample := connRate(ctx, r.entry, cfg.ConnParallel, cfg.ConnPayload, cfg.ConnDuration)
			cpu1, _ := r.usage()
			sw1 := switches(r.pids())
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rate := float64(ok) / cfg.ConnDuration.Seconds()
			res.ConnFail += failed
			var per1k float64
			if ok > 0 {
				per1k = (cpu1 - cpu0).Seconds() / float64(ok) * 1000
			}
			if capped {
				res.CappedConnPerS = append(res.CappedConnPerS, rate)
				res.CappedCPUPer1k = append(res.CappedCPUPer1k, per1k)
			} else {
				res.ConnPerS = append(res.ConnPerS, rate)
				if ok > 0 {
					res.CPUPer1k = append(res.CPUPer1k, per1k)
					res.SwitchesPerConn = append(res.SwitchesPerConn, float64(sw1-sw0)/float64(ok))
				}
			}
			cfg.Log.Info("conn rate", "mode", res.Mode, "run", run+1, "cpu_cap", capped, "conn_per_s", int(rate),
				"failed", failed, "first_error", sample)
			// Let the relays' per-connection state settle between modes.
			time.Sleep(300 * time.Millisecond)
		}
	}
	return nil
}

// capPhase moves every relay process into cc, limits it to cfg.ConnCPU
// CPUs for the connection-rate test, and lifts the limit afterwards.
func capPhase(ctx context.Context, cfg Config, rep *Report, relays map[string]*relay, cc *cpuCap) error {
	for _, r := range relays {
		var pids []int
		for _, p := range r.pids() {
			pids = append(pids, tree(p)...)
		}
		if err := cc.add(pids); err != nil {
			return err
		}
	}
	if err := cc.set(cfg.ConnCPU); err != nil {
		return fmt.Errorf("set cpu quota: %w", err)
	}
	defer cc.set(0)
	return connPhase(ctx, cfg, rep, relays, true)
}

// raiseFileLimit raises RLIMIT_NOFILE as far as allowed (relays and the
// idle-flow test need two descriptors per flow) and returns the number of
// relayed connections that fit in it.
func raiseFileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 4000
	}
	for _, want := range []uint64{1 << 20, 1 << 18, 1 << 16} {
		if lim.Cur >= want {
			break
		}
		l := syscall.Rlimit{Cur: want, Max: max(want, lim.Max)}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
			lim = l
			break
		}
	}
	if lim.Cur < lim.Max {
		l := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l) == nil {
			lim = l
		}
	}
	// HAProxy reserves about 2.5 descriptors per connection.
	return int(min((lim.Cur-500)/3, 100000))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *Report) find(mode string) *Result {
	for _, res := range r.Results {
		if res.Mode == mode {
			return res
		}
	}
	return nil
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

// rateCells formats the conn/s cells of a mode against HAProxy's runs h:
// median, every run, ratio of medians, per-run ratio.
func rateCells(v, h []float64) string {
	return fmt.Sprintf("%.0f | %s | %s | %s", median(v), runList(v, "%.0f"), ratio(median(v), median(h)), paired(v, h))
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

// connRef returns the result a mode's conn/s and memory figures are
// compared with: haproxy3 for the chains (like for like), else h.
func (r *Report) connRef(mode string, h *Result) *Result {
	if mode == ModeMosto3 || mode == ModeHAProxy3 {
		if h3 := r.find(ModeHAProxy3); h3 != nil {
			return h3
		}
	}
	return h
}

// WriteMarkdown writes the report as Markdown tables with ratios to
// HAProxy (median over runs for throughput; chains compare with haproxy3
// in the conn/s and memory tables).
func (r *Report) WriteMarkdown(w io.Writer) {
	c := r.Config
	idle := fmt.Sprintf("%d idle flows", c.IdleConns)
	if c.IdleConns < 0 {
		idle = "no idle-flow test"
	}
	fmt.Fprintf(w, "Loopback. Throughput: %d runs of %.1f GB per mode, one flow, modes interleaved. "+
		"Conn/s: %d runs of %v per mode, %d parallel clients, %d-byte request and 8-byte reply per connection, interleaved. Memory: %s.\n\n",
		c.Runs, float64(c.Bytes)/1e9, c.Runs, c.ConnDuration, c.ConnParallel, c.ConnPayload, idle)
	h := r.find(ModeHAProxy)
	if h == nil {
		h = &Result{}
	}
	hg, hc := median(h.Gbps), median(h.CPUPerGB)
	fmt.Fprintln(w, "| mode | Gbit/s (median) | runs | vs HAProxy | relay CPU s/GB | vs HAProxy |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for _, res := range r.Results {
		g, cpu := median(res.Gbps), median(res.CPUPerGB)
		cpuS, cpuR := num(cpu, "%.3f"), ratio(cpu, hc)
		if res.Mode == ModeDirect {
			cpuS, cpuR = "(no relay)", "-"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", res.Mode, num(g, "%.2f"), runList(res.Gbps, "%.2f"), ratio(g, hg), cpuS, cpuR)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| mode | conn/s (median) | runs | vs HAProxy | per-run ratio (median, range) | failed | relay CPU s per 1k conns | vs HAProxy | context switches per conn | vs HAProxy |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, res := range r.Results {
		if len(res.ConnPerS) == 0 {
			continue
		}
		cpu, sw := median(res.CPUPer1k), median(res.SwitchesPerConn)
		h := r.connRef(res.Mode, h)
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s |\n", res.Mode, rateCells(res.ConnPerS, h.ConnPerS),
			res.ConnFail, num(cpu, "%.3f"), ratio(cpu, median(h.CPUPer1k)), num(sw, "%.2f"), ratio(sw, median(h.SwitchesPerConn)))
	}
	fmt.Fprintln(w)
	if r.CapErr != "" {
		fmt.Fprintf(w, "Conn/s at equal CPU not measured: %s\n\n", r.CapErr)
	} else if c.ConnCPU > 0 && slices.ContainsFunc(r.Results, func(res *Result) bool { return len(res.CappedConnPerS) > 0 }) {
		fmt.Fprintf(w, "Conn/s at equal CPU: every relay held to %.2f CPU (cgroup CPU quota, %v period), same clients. "+
			"Where a relay used its whole budget (CPU used = cap) it was the bottleneck and conn/s is its capacity per CPU; "+
			"below the cap the machine was too busy to give it that much.\n\n", c.ConnCPU, capPeriod)
		fmt.Fprintln(w, "| mode | conn/s (median) | runs | vs HAProxy | per-run ratio (median, range) | relay CPU s per 1k conns | vs HAProxy | CPU used (CPUs) |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, res := range r.Results {
			if len(res.CappedConnPerS) == 0 {
				continue
			}
			rate, cpu := median(res.CappedConnPerS), median(res.CappedCPUPer1k)
			h := r.connRef(res.Mode, h)
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", res.Mode, rateCells(res.CappedConnPerS, h.CappedConnPerS),
				num(cpu, "%.3f"), ratio(cpu, median(h.CappedCPUPer1k)), num(rate*cpu/1000, "%.2f"))
		}
		fmt.Fprintln(w)
	}
	if c.LatConns > 0 {
		fmt.Fprintf(w, "Time per connection, one client, %d connections back to back per mode and run (dial, %d bytes, half-close, 8-byte reply, close); "+
			"medians over the runs of each run's percentile; added = over direct.\n\n", c.LatConns, c.ConnPayload)
		fmt.Fprintln(w, "| mode | p50 (us) | added (us) | vs HAProxy (added) | p99 (us) | added (us) | vs HAProxy (added) | failed |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
		var d50, d99 float64
		if d := r.find(ModeDirect); d != nil {
			d50, d99 = median(d.LatP50), median(d.LatP99)
		}
		added := func(v, base float64) float64 {
			if v == 0 || base == 0 {
				return 0
			}
			return v - base
		}
		h50, h99 := added(median(h.LatP50), d50), added(median(h.LatP99), d99)
		for _, res := range r.Results {
			if len(res.LatP50) == 0 {
				continue
			}
			p50, p99 := median(res.LatP50), median(res.LatP99)
			a50, a99 := added(p50, d50), added(p99, d99)
			if res.Mode == ModeDirect {
				a50, a99 = 0, 0
			}
			fmt.Fprintf(w, "| %s | %.0f | %s | %s | %.0f | %s | %s | %d |\n", res.Mode, p50, num(a50, "%.0f"), ratio(a50, h50),
				p99, num(a99, "%.0f"), ratio(a99, h99), res.LatFail)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "| mode | idle RSS (MB) | vs HAProxy | of which anonymous (MB) | vs HAProxy | RSS per idle flow (KB) | vs HAProxy |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, res := range r.Results {
		if res.IdleRSS == 0 {
			continue
		}
		h := r.connRef(res.Mode, h)
		fmt.Fprintf(w, "| %s | %.1f | %s | %.1f | %s | %s | %s |\n", res.Mode, float64(res.IdleRSS)/1e6, ratio(float64(res.IdleRSS), float64(h.IdleRSS)),
			float64(res.IdleAnon)/1e6, ratio(float64(res.IdleAnon), float64(h.IdleAnon)),
			num(res.PerConn/1e3, "%.1f"), ratio(res.PerConn, h.PerConn))
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
	fmt.Fprintf(w, "\nElapsed %v. mosto3 is three chained daemons (InP, TrP, EgP), haproxy3 three chained HAProxy processes; their CPU and RSS are the sums of the three, and in the conn/s and memory tables their ratios are to haproxy3 (like for like). "+
		"CPU is utime+stime of each relay's process tree from /proc/PID/stat; RSS sums the tree.\n", r.Elapsed.Round(time.Second))
}
