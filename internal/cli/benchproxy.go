package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/proxybench"
)

// runBenchProxy measures mosto proxy against direct, HAProxy and nginx
// stream on loopback, side by side, and prints Markdown tables.
func runBenchProxy(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "bench proxy")
	modes := fs.String("modes", strings.Join(proxybench.AllModes, ","), "comma-separated modes to measure")
	size := fs.String("bytes", "2GB", "bytes per single-flow throughput run (decimal units: 500MB, 2GB)")
	offloadAfter := fs.String("offload-after", "64MiB", "mosto1off: bytes a flow is relayed before it is offloaded (its join by the xlate eBPF program)")
	runs := fs.Int("runs", proxybench.DefaultRuns, "throughput runs per mode, interleaved across modes")
	connDur := fs.Duration("conn-duration", proxybench.DefaultConnDuration, "duration of the connections-per-second test per mode")
	parallel := fs.Int("parallel", proxybench.DefaultConnParallel, "parallel clients in the connections-per-second test")
	payload := fs.Int("payload", proxybench.DefaultConnPayload, "bytes sent per short connection")
	connCPU := fs.Float64("conn-cpu", proxybench.DefaultConnCPU, "CPU budget per relay (CPUs) for a second connections-per-second test at equal CPU, via a cgroup quota (root); negative skips it")
	capPeriod := fs.Duration("cap-period", proxybench.DefaultCapPeriod, "CFS period of the equal-CPU test's cgroups (the quota is -conn-cpu x this period)")
	lat := fs.Int("lat-conns", proxybench.DefaultLatConns, "back-to-back connections of one client per mode and run for the time per connection (negative: skip)")
	idle := fs.Int("idle", proxybench.DefaultIdleConns, "idle flows opened to measure memory per connection (negative: skip)")
	threads := fs.Int("threads", 0, "threads of every relay: mosto's event loops and GOMAXPROCS, tuned HAProxy's nbthread, tuned nginx's workers (default: one per CPU)")
	coreHour := fs.Float64("core-hour", proxybench.DefaultCoreHour, "price of one CPU core-hour in dollars, for the relay cost per delivered TB")
	mosto := fs.String("mosto", "", "mosto binary to run as the proxy (default: this executable)")
	haproxy := fs.String("haproxy", "", "haproxy binary (default: from PATH)")
	nginx := fs.String("nginx", "", "nginx binary (default: from PATH)")
	jsonOut := fs.String("json", "", "also write the results as JSON to this file")
	dir := fs.String("dir", "", "directory for generated configs (default: a temporary one, removed afterwards)")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto bench proxy [flags]\n\nCompares single-flow throughput, CPU per GB, connections per second,\nmemory per idle flow and idle RSS of mosto proxy, HAProxy and nginx stream (each tuned and with defaults) on loopback.")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	n, err := pathcomp.ParseSize(*size)
	if err != nil || n <= 0 {
		return usageErrorf("-bytes %q: want a positive size", *size)
	}
	after, err := pathcomp.ParseSize(*offloadAfter)
	if err != nil || after <= 0 {
		return usageErrorf("-offload-after %q: want a positive size", *offloadAfter)
	}
	if *runs < 1 || *parallel < 1 || *payload < 1 || *connDur <= 0 {
		return usageErrorf("-runs, -parallel, -payload and -conn-duration must be positive")
	}
	if *threads < 0 || *coreHour <= 0 {
		return usageErrorf("-threads must be >= 0 and -core-hour positive")
	}
	if *lat == 0 {
		*lat = -1
	}
	if *connCPU == 0 {
		*connCPU = -1
	}
	if *idle == 0 {
		*idle = -1
	}
	list := strings.Split(*modes, ",")
	for _, m := range list {
		if !slices.Contains(proxybench.AllModes, m) {
			return usageErrorf("-modes: unknown mode %q (want some of %s)", m, strings.Join(proxybench.AllModes, ","))
		}
	}
	if *mosto == "" {
		if *mosto, err = os.Executable(); err != nil {
			return fmt.Errorf("find mosto binary: %w", err)
		}
	}
	rep, err := proxybench.Run(ctx, proxybench.Config{
		Modes: list, Mosto: *mosto, HAProxy: *haproxy, Nginx: *nginx,
		Bytes: n, OffloadAfter: after, Runs: *runs, ConnDuration: *connDur, ConnParallel: *parallel, ConnPayload: *payload,
		ConnCPU: *connCPU, CapPeriod: *capPeriod, Threads: *threads, CoreHour: *coreHour, LatConns: *lat, IdleConns: *idle, Dir: *dir, Log: env.Log,
	})
	if rep == nil {
		return err
	}
	rep.WriteMarkdown(env.Stdout)
	if *jsonOut != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
		}
		if jerr != nil {
			return errors.Join(err, fmt.Errorf("write %s: %w", *jsonOut, jerr))
		}
	}
	return err
}
