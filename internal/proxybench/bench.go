package proxybench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/report"
)

// Config selects what Run measures. Zero fields take the defaults below.
type Config struct {
	Modes []string // subset of AllModes; nil: all

	Mosto    string // mosto binary for the mosto modes (required for them)
	HAProxy  string // haproxy binary; "" looks it up in PATH
	Nginx    string // nginx binary; "" looks it up in PATH
	NginxMod string // stream module to load; "" uses the Debian path if present

	Bytes int64 // bytes per single-flow throughput run (default 2 GB)
	// OffloadAfter is where mosto1off offloads a flow (bytes relayed;
	// default DefaultOffloadAfter).
	OffloadAfter int64
	Runs         int // throughput runs per mode, interleaved (default 3)

	ConnDuration time.Duration // per mode (default 3s)
	ConnParallel int           // parallel clients (default 16)
	ConnPayload  int           // bytes per short connection (default 64)
	// ConnCPU is the CPU budget (in CPUs, e.g. 0.5) each relay gets in a
	// second connection-rate test, so conn/s compares relays at equal CPU
	// (a cgroup CPU quota; needs root). 0 takes the default, < 0 skips it.
	ConnCPU float64
	// CapPeriod is the CFS period of those cgroups (default
	// DefaultCapPeriod).
	CapPeriod time.Duration

	IdleConns int // idle flows for memory per connection (default 5000; < 0 skips)

	// Threads is the thread count of every relay: mosto's event loops and
	// GOMAXPROCS, HAProxy's nbthread (tuned), nginx's workers (tuned).
	// Default: one per CPU.
	Threads int

	// CoreHour is the price of one CPU core for an hour, in dollars, that
	// turns CPU seconds per GB into dollars per delivered TB (default
	// DefaultCoreHour).
	CoreHour float64

	// LatConns is the number of back-to-back connections of one client
	// per mode and run in the latency test (default 2000; < 0 skips).
	LatConns int

	Dir string       `json:"-"` // work directory for configs; "" makes a temporary one
	Log *slog.Logger `json:"-"` // progress; nil discards
}

// Defaults.
const (
	DefaultBytes        = 2_000_000_000
	DefaultOffloadAfter = 64 << 20
	DefaultRuns         = 3
	DefaultConnDuration = 3 * time.Second
	DefaultConnParallel = 16
	DefaultConnPayload  = 64
	DefaultIdleConns    = 5000
	DefaultLatConns     = 2000
	DefaultConnCPU      = 0.5
	// DefaultCoreHour is seed 001's price of a core-hour (report.DefaultCoreHour).
	DefaultCoreHour = report.DefaultCoreHour
	// DebianStreamModule is where Debian's libnginx-mod-stream puts
	// nginx's stream module.
	DebianStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"
)

// Result is everything measured for one mode.
type Result struct {
	Mode string
	Err  string // why this mode could not be measured, if so

	IdleRSS  int64 // bytes, all relay processes, before any traffic
	IdleAnon int64 // the anonymous (private) part of IdleRSS; the rest is mapped binaries and libraries

	Gbps     []float64 // one per throughput run
	CPUPerGB []float64 // relay CPU seconds per GB moved, per run
	// LoadCPUPerGB is the CPU seconds per GB of this process (the client
	// and the sink), and BusyCPUs the machine's CPUs busy on average, per
	// throughput run: with every CPU busy the machine, not the relay,
	// bounds the rate (Gbit/s ~ CPUs / (relay + load generator CPU per
	// GB) on loopback).
	LoadCPUPerGB []float64
	BusyCPUs     []float64
	ConnPerS     []float64 // one per run
	ConnFail     int64
	CPUPer1k     []float64 // relay CPU seconds per 1000 connections, per run
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
	if c.OffloadAfter <= 0 {
		c.OffloadAfter = DefaultOffloadAfter
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
	if c.CapPeriod <= 0 {
		c.CapPeriod = DefaultCapPeriod
	}
	if c.Threads <= 0 {
		c.Threads = runtime.NumCPU()
	}
	if c.CoreHour <= 0 {
		c.CoreHour = DefaultCoreHour
	}
	if c.HAProxy == "" {
		c.HAProxy, _ = exec.LookPath("haproxy")
	}
	if c.Nginx == "" {
		c.Nginx, _ = exec.LookPath("nginx")
	}
	if c.NginxMod == "" {
		if _, err := os.Stat(DebianStreamModule); err == nil {
			c.NginxMod = DebianStreamModule
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
		nginx: cfg.Nginx, nginxMod: cfg.NginxMod, maxconn: raiseFileLimit(), threads: cfg.Threads, offloadAfter: cfg.OffloadAfter, log: cfg.Log}

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
			self0 := selfCPU()
			busy0, total0 := machineCPU()
			d, err := transfer(ctx, r.entry, cfg.Bytes, buf)
			cpu1, _ := r.usage()
			self1 := selfCPU()
			busy1, total1 := machineCPU()
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
			gb := float64(cfg.Bytes) / 1e9
			res.CPUPerGB = append(res.CPUPerGB, (cpu1-cpu0).Seconds()/gb)
			res.LoadCPUPerGB = append(res.LoadCPUPerGB, (self1-self0).Seconds()/gb)
			if total1 > total0 {
				res.BusyCPUs = append(res.BusyCPUs, float64(runtime.NumCPU())*float64(busy1-busy0)/float64(total1-total0))
			}
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
		if err := capPhase(ctx, cfg, rep, relays); err != nil {
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

// capPhase moves the processes of every relay into a CPU cgroup of its
// own, limits each cgroup to cfg.ConnCPU CPUs for the connection-rate
// test, and removes the cgroups afterwards. One cgroup per relay: an idle
// relay's housekeeping does not count against the one under test.
func capPhase(ctx context.Context, cfg Config, rep *Report, relays map[string]*relay) (err error) {
	var caps []*cpuCap
	defer func() {
		for _, cc := range caps {
			cc.set(0)
			if rerr := cc.remove(); rerr != nil {
				cfg.Log.Warn("cgroup left behind", "err", rerr)
			}
		}
	}()
	for _, r := range relays {
		if len(r.procs) == 0 {
			continue
		}
		cc, err := newCPUCap(cfg.CapPeriod)
		if err != nil {
			return err
		}
		caps = append(caps, cc)
		var pids []int
		for _, p := range r.pids() {
			pids = append(pids, tree(p)...)
		}
		if err := cc.add(pids); err != nil {
			return err
		}
		if err := cc.set(cfg.ConnCPU); err != nil {
			return fmt.Errorf("set cpu quota: %w", err)
		}
	}
	// The clients and the sink (this process) get the same largest
	// weight, uncapped: otherwise on a busy machine they, not the quota,
	// bound the capped relays (session 6: relays at 0.13-0.23 of 0.5 CPU
	// without it, 0.39-0.44 with it). The relays were started before and
	// stay in their own cgroups.
	lg, err := newCPUCap(cfg.CapPeriod)
	if err != nil {
		return err
	}
	caps = append(caps, lg)
	if err := lg.add([]int{os.Getpid()}); err != nil {
		return err
	}
	if err := lg.boost(); err != nil {
		return fmt.Errorf("load generator weight: %w", err)
	}
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
