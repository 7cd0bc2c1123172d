package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/transfer"
)

// runBenchTransfer measures direct, mosto (single proxy and computed chain)
// and the nginx CDN front-end (warm and cold) in one emulated world, for
// several object sizes, interleaved, and writes markdown and SVG results.
func runBenchTransfer(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "bench transfer")
	world := fs.String("world", "", "world spec (YAML, see docs/emu.md); \"demo\" for the built-in demo world")
	runs := fs.Int("runs", 10, "fetches per size and mode")
	sizesFlag := fs.String("sizes", "10KB,50KB,100KB,200KB,500KB,1MB,5MB,15MB", "object sizes (1 KB = 1000 B)")
	modesFlag := fs.String("modes", "direct,mosto-single,mosto-chain,cdn-warm,cdn-cold", "modes to measure; also mosto-cold (the first flow after the proxies restart, with the levers) and mosto-plain (the same without levers)")
	out := fs.String("out", "", "results folder (default results/transfer-YYYYMMDD-HHMMSS)")
	client := fs.String("client", "client", "client host")
	originHost := fs.String("origin", "origin", "origin host")
	feps := fs.String("feps", "", "FEP hosts, comma-separated (default: every other host)")
	inp := fs.String("inp", "", "ingress FEP (default: nearest the client)")
	egp := fs.String("egp", "", "egress FEP (default: nearest the origin)")
	single := fs.String("single", "", "FEP of the single-proxy mode (default: Washington if present, else the FEP minimizing its longer leg)")
	table := fs.String("table", "", "chain table file (mosto plan table --json) given to every proxy (implies --static-table)")
	static := fs.Bool("static-table", false, "no controller: give every proxy a chain table file computed by pathcomp from the world's RTTs")
	probeEvery := fs.Duration("probe-interval", 2*time.Second, "with the controller: the agents' probe round interval")
	initcwnd := fs.Int("fep-initcwnd", 0, "lever: initcwnd and initrwnd (segments) of the FEPs' routes; 0: kernel default")
	rmem := fs.Int("fep-rmem", 0, "lever: tcp_rmem default (initial receive buffer, bytes) on the FEPs; 0: unchanged")
	hopPool := fs.Int("fep-pool", 0, "lever: pre-established connections each proxy keeps to every member (proxy pool.hop); 0: none")
	originPool := fs.Int("fep-origin-pool", 0, "lever: pre-established connections the EgP keeps to the origin (proxy pool.origin); 0: none")
	fastOpen := fs.Bool("fep-fastopen", false, "lever: TCP Fast Open on the proxies' sockets (socket.fastopen, tcp_fastopen=3 on the FEPs)")
	offload := fs.Int64("fep-offload", 0, "lever: every proxy joins its own legs in the kernel (eBPF, docs/offload.md) after this many bytes of a flow (offload mode bytes); 0: off")
	offloadNoBound := fs.Bool("fep-offload-nobound", false, "with --fep-offload: pause a due flow at once and drain whatever the proxy holds (offload.no_bound; the default bounds it first)")
	offloadMode := fs.String("fep-offload-mode", "bytes", "with --fep-offload: the proxies' offload.mode (bytes: after --fep-offload bytes; slow-start: once a leg left slow start, or after --fep-offload bytes)")
	offloadAgeRTTs := fs.Int("fep-offload-age-rtts", 0, "with --fep-offload: offload.age_rtts (hold an offload until the flow lasted this many joined RTTs; 0: the proxies' default 20, -1: never hold)")
	offloadTail := fs.Bool("fep-offload-tail", false, "with --fep-offload-handover drain: offload.tail (the early join: join while a leg still delivers about one RTT)")
	offloadFreeze := fs.Bool("fep-offload-freeze", false, "with --fep-offload-handover drain: offload.freeze (stop the senders at the window edge of the handover's start)")
	offloadHandover := fs.String("fep-offload-handover", "", "with --fep-offload: offload.handover (frozen: the proxies' default; drain: the handover of sessions 9-12, where --fep-offload-tail, -freeze, -nobound and -no-rcvbuf-cap apply)")
	offloadNoCap := fs.Bool("fep-offload-no-rcvbuf-cap", false, "with --fep-offload: offload.no_rcvbuf_cap (the handover leaves the receive buffers uncut)")
	offloadJoinShort := fs.Bool("fep-offload-join-short", false, "with --fep-offload: offload.join_short (join even when a window would limit the joined flow; the default holds such an offload back)")
	cc := fs.String("fep-cc", "", "lever: congestion control of the proxies' hop and origin sockets (e.g. cubic, bbr)")
	cdnHost := fs.String("cdn-host", "", "host of the CDN front-end (default: the client's host, 0 RTT from the client; \"inp\": the ingress FEP's host, a CDN edge at mosto's InP site)")
	tuneCDN := fs.Bool("tune-cdn", true, "equal tuning: the CDN front-end's host (the client host) gets the FEPs' kernel levers (--fep-initcwnd, --fep-rmem, --fep-fastopen)")
	icw := fs.Int("icw", 0, "planner model: initial window (segments) of the chain's links, for the table and the controller (default: --fep-initcwnd when set, else 10)")
	endICW := fs.Int("end-icw", -1, "planner model: initial window (segments) of the end segments (client - InP, EgP - origin: fresh connections from untuned hosts) while the chain's links keep --icw; 0: the ends ramp like the chain (default: 10, Linux's window, when --icw is larger, else 0)")
	endRTT := fs.Float64("end-rtt", -1, "planner model: RTT in `ms` assumed for each end segment with --end-icw (default: the world's client-InP RTT)")
	coreHour := fs.Float64("core-hour", scenario.DefaultCoreHour, "price of one CPU core-hour in dollars, for the proxies' cost per delivered TB")
	originWmem := fs.Int("origin-wmem", 0, "the origin's tcp_wmem default (initial send buffer, bytes), the same in every mode: a tuned origin; 0: the kernel's")
	machineRate := fs.Float64("machine-rate", -1, "the machine's rate in `Mbit/s` along the chain, for the chain's fetch model; -1: measure it with 3 calibration fetches of 12 MB when mosto-chain runs with --fep-initcwnd >= 10000; 0: none")
	defaultIdle := fs.Duration("cdn-default-idle", scenario.DefaultCDNDefaultIdle, "cdn-default: how long nginx's upstream connection idles before each fetch, with the origin's tcp_slow_start_after_idle=1 during the fetch")
	cdnIdle := fs.Duration("cdn-idle", 0, "nginx upstream keep-alive idle timeout; cdn-cold waits longer than this (default: 2s with cdn-cold, else 10m so cdn-warm keeps one long-lived connection, the CDN's best case)")
	realtime := fs.Bool("emu-realtime", false, "run the emulator's threads at real-time priority (steadier delays next to other load on the machine, 30-50% more emulator CPU; docs/emu.md)")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto bench transfer --world W.yaml [--runs N] [--sizes LIST] [--out DIR] [flags]\n\nNeeds root. See docs/bench.md.")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *world == "" {
		return usageErrorf("--world is required (a world spec file, or \"demo\")")
	}
	if *runs < 1 {
		return usageErrorf("--runs must be at least 1")
	}
	if *offload < 0 {
		return usageErrorf("--fep-offload must be 0 (off) or a byte count")
	}
	if *offloadMode != "bytes" && *offloadMode != "slow-start" {
		return usageErrorf("--fep-offload-mode must be bytes or slow-start")
	}
	if h := *offloadHandover; h != "" && h != "frozen" && h != "drain" {
		return usageErrorf("--fep-offload-handover must be frozen or drain")
	}
	if *probeEvery < 100*time.Millisecond {
		return usageErrorf("--probe-interval must be at least 100ms")
	}
	if *icw < 0 || *icw > maxICW || *coreHour <= 0 {
		return usageErrorf("--icw must be 0-%d and --core-hour positive", maxICW)
	}
	if *icw == 0 && *initcwnd > 0 {
		*icw = *initcwnd
	}
	if *endICW < -1 || *endICW > maxICW || *endRTT > pathcomp.MaxRTT || math.IsNaN(*endRTT) {
		return usageErrorf("--end-icw must be 0-%d and --end-rtt at most %v ms", maxICW, float64(pathcomp.MaxRTT))
	}
	if *endICW == -1 {
		*endICW = 0
		if *icw > 10 {
			*endICW = 10
		}
	}
	if *endRTT < 0 {
		*endRTT = -1 // the world's client-InP RTT (scenario.Scenario.PlanModel)
	}
	if *endICW == 0 {
		*endRTT = 0
	}
	if *originWmem < 0 || math.IsNaN(*machineRate) || *machineRate < -1 {
		return usageErrorf("--origin-wmem must be >= 0 and --machine-rate -1, 0 or a rate")
	}
	if *cdnIdle != 0 && *cdnIdle < time.Millisecond {
		return usageErrorf("--cdn-idle must be at least 1ms")
	}
	sizes, err := transfer.ParseSizes(*sizesFlag)
	if err != nil {
		return usageErrorf("--sizes: %v", err)
	}
	var modes []scenario.Mode
	useCDN := false
	for _, m := range strings.Split(*modesFlag, ",") {
		m = strings.TrimSpace(m)
		ok := false
		for _, k := range scenario.AllModes() {
			if string(k) == m {
				modes, ok = append(modes, k), true
				useCDN = useCDN || k == scenario.CDNWarm || k == scenario.CDNCold || k == scenario.CDNDefault
			}
		}
		if !ok {
			return usageErrorf("--modes: unknown mode %q (want %v)", m, scenario.AllModes())
		}
	}
	if *cdnIdle == 0 {
		// cdn-cold needs the idle timeout to pass between fetches; without
		// it a short timeout would only hurt cdn-warm (proxy restarts of
		// the cold mosto modes outlast it, and the front-end's connection
		// would start over with a small window).
		*cdnIdle = 10 * time.Minute
		if slices.Contains(modes, scenario.CDNCold) {
			*cdnIdle = 2 * time.Second
		}
	}
	if slices.Contains(modes, scenario.CDNDefault) && *cdnIdle <= *defaultIdle+*defaultIdle/2 {
		return usageErrorf("--cdn-idle must exceed 1.5 x --cdn-default-idle (%v) with cdn-default; cdn-cold needs a short --cdn-idle, so measure cdn-default in a run without it", *defaultIdle)
	}
	var specData []byte
	if *world == "demo" {
		specData = scenario.DemoYAML()
	} else if specData, err = os.ReadFile(*world); err != nil {
		return fmt.Errorf("read world: %w", err)
	}
	spec, err := emu.ParseSpec(specData)
	if err != nil {
		return err
	}
	roles := scenario.Roles{Client: *client, Origin: *originHost, InP: *inp, EgP: *egp, Single: *single}
	if *feps != "" {
		roles.FEPs = strings.Split(*feps, ",")
	}
	if roles.Single == "" {
		for _, h := range spec.Hosts {
			if h.Name == "Washington" {
				roles.Single = h.Name
			}
		}
	}
	var tf *pathcomp.TableFile
	if *table != "" {
		f, err := os.Open(*table)
		if err != nil {
			return fmt.Errorf("chain table: %w", err)
		}
		tf, err = pathcomp.ReadTableFile(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if err := needPrivileges("mosto bench transfer"); err != nil {
		return err
	}
	if useCDN {
		if _, err := exec.LookPath("nginx"); err != nil {
			return fmt.Errorf("the cdn modes need nginx (apt-get install nginx), or leave them out with --modes")
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the mosto binary for the proxies: %w", err)
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join("results", "transfer-"+time.Now().UTC().Format("20060102-150405"))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results folder: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "world.yaml"), specData, 0o644); err != nil {
		return err
	}

	w, err := emu.UpWith(ctx, spec, env.Log, emu.UpOptions{Realtime: *realtime})
	if err != nil {
		return fmt.Errorf("bring up world: %w", err)
	}
	defer w.Close()
	scfg := scenario.Config{Roles: roles, Sizes: sizes, Mosto: []string{exe}, CDN: useCDN, CDNIdle: *cdnIdle, Table: tf,
		Tune: scenario.Tune{InitCwnd: *initcwnd, RmemInit: *rmem, Congestion: *cc,
			HopPool: *hopPool, OriginPool: *originPool, FastOpen: *fastOpen, Offload: *offload, OffloadNoBound: *offloadNoBound, OffloadMode: *offloadMode, OffloadJoinShort: *offloadJoinShort, OffloadAgeRTTs: *offloadAgeRTTs,
			OffloadTail: *offloadTail, OffloadFreeze: *offloadFreeze, OffloadNoRcvbufCap: *offloadNoCap, OffloadHandover: *offloadHandover},
		TuneCDN: *tuneCDN, OriginWmem: *originWmem, Model: pathcomp.Model{ICW: *icw, EndICW: *endICW, EndRTT: *endRTT}, CDNHost: *cdnHost, CDNDefaultIdle: *defaultIdle}
	if *offload > 0 {
		// Keep the proxies' configs and logs with the results (what each
		// proxy's handovers did).
		scfg.Dir = filepath.Join(dir, "proxies")
		if err := os.MkdirAll(scfg.Dir, 0o755); err != nil {
			return err
		}
	}
	if tf == nil && !*static {
		scfg.Controller = &scenario.ControllerConfig{ProbeInterval: *probeEvery}
	}
	sc, err := scenario.Start(ctx, w, scfg, env.Log)
	if err != nil {
		return err
	}
	defer sc.Close()
	r := sc.Roles()
	fmt.Fprintf(env.Stderr, "bench transfer: world %q, client %s, origin %s, ingress %s, egress %s, single %s; %d sizes x %d modes x %d runs\n",
		spec.Name, r.Client, r.Origin, r.InP, r.EgP, r.Single, len(sizes), len(modes), *runs)
	source := chainSource(sc, *table)
	fmt.Fprintln(env.Stderr, source)
	ccNote := congestionNote(w, r.Origin, spec.TCP.Congestion)
	fmt.Fprintln(env.Stderr, ccNote)
	for _, m := range modes {
		if m == scenario.CDNCold || m == scenario.CDNDefault || m == scenario.ChainCold || m == scenario.ChainPlain {
			continue
		}
		if _, err := sc.Fetch(ctx, m, sizes[0], 0); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	switch {
	case *machineRate > 0:
		sc.SetMachineRate(scenario.MachineRates{Chain: *machineRate * 1e6 / 8})
	case *machineRate < 0 && *initcwnd >= 10000 && slices.Contains(modes, scenario.Chain):
		mr, err := sc.MeasureMachineRate(ctx, 3)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stderr, "machine rate (3 calibration fetches of %s each): along the chain %.0f Mbit/s, over one emulated link %.0f Mbit/s\n",
			transfer.FormatSize(scenario.MachineRateSize), mr.Chain*8/1e6, mr.Link*8/1e6)
		sc.SetMachineRate(mr)
	}
	var rows [][]string
	start := time.Now()
	total := len(sizes) * len(modes) * *runs
	res, err := sc.Measure(ctx, scenario.Plan{Modes: modes, Sizes: sizes, Runs: *runs, CoreHour: *coreHour, Progress: func(run int, s scenario.Sample) {
		rows = append(rows, []string{strconv.Itoa(run), transfer.FormatSize(s.Size), strconv.FormatInt(s.Size, 10), string(s.Mode),
			fmt.Sprintf("%.3f", float64(s.Result.Connect)/1e6), fmt.Sprintf("%.3f", float64(s.Result.FirstByte)/1e6),
			fmt.Sprintf("%.3f", float64(s.Result.Total)/1e6), strconv.FormatBool(s.NewOriginConn),
			strconv.FormatInt(s.CPU.Emu.Milliseconds(), 10), strconv.FormatInt(s.CPU.Proxies.Milliseconds(), 10), fmt.Sprintf("%.2f", s.CPU.Busy)})
		if len(rows)%20 == 0 || len(rows) == total {
			fmt.Fprintf(env.Stderr, "  %d/%d fetches, %v\n", len(rows), total, time.Since(start).Round(time.Second))
		}
	}})
	if werr := writeSamples(filepath.Join(dir, "samples.csv"), rows); werr != nil && err == nil {
		err = werr
	}
	offloadNote := ""
	if *offload > 0 {
		oc, oerr := sc.OffloadCounts(ctx)
		if oerr != nil {
			return errors.Join(err, oerr)
		}
		offloadNote = "Offload counters after the run (per FEP: handovers tried / joined in the kernel / refused; flows held back as young / by the receiver's / the sender's window / loss):"
		for _, f := range slices.Sorted(maps.Keys(oc)) {
			c := oc[f]
			offloadNote += fmt.Sprintf(" %s %.0f/%.0f/%.0f held %.0f/%.0f/%.0f/%.0f;", f, c["handovers"], c["joined"], c["refused"],
				c["held_young"], c["held_receiver_window"], c["held_sender_window"], c["held_loss"])
		}
		offloadNote += "\n\n"
	}
	if err != nil {
		if offloadNote != "" {
			fmt.Fprint(env.Stderr, offloadNote)
		}
		return err
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "# mosto bench transfer\n\nWorld `%s`; client %s, origin %s; ingress FEP %s, egress FEP %s, single proxy %s; nginx upstream idle timeout %v.\n\nCommand: `mosto bench transfer %s`\n\n",
		spec.Name, r.Client, r.Origin, r.InP, r.EgP, r.Single, *cdnIdle, strings.Join(args, " "))
	fmt.Fprintf(&md, "%s\n\n%s\n\n%s\n\n", source, ccNote, tuningNote(scfg, useCDN))
	md.WriteString(offloadNote)
	if err := res.WriteMarkdown(&md); err != nil {
		return err
	}
	var svg bytes.Buffer
	if err := res.WriteSVG(&svg, "Time to last byte, "+spec.Name+" ("+r.Client+" - "+r.Origin+")"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "time-vs-size.svg"), svg.Bytes(), 0o644); err != nil {
		return err
	}
	env.Stdout.Write(md.Bytes())
	fmt.Fprintf(env.Stdout, "\nresults in %s (results.md, time-vs-size.svg, samples.csv, world.yaml)\n", dir)
	return nil
}

// tuningNote says which hosts got which levers and the planner's model.
func tuningNote(c scenario.Config, cdn bool) string {
	t := c.Tune
	icw := c.Model.ICW
	if icw == 0 {
		icw = 10
	}
	s := fmt.Sprintf("Levers: FEPs initcwnd/initrwnd %d (0: kernel default), initial rmem %d (0: unchanged), Fast Open %v, hop pool %d, origin pool %d, offload after %d bytes (0: off; mode %q, no_bound %v, join_short %v, age_rtts %d, tail %v, freeze %v, no_rcvbuf_cap %v, handover %q). ",
		t.InitCwnd, t.RmemInit, t.FastOpen, t.HopPool, t.OriginPool, t.Offload, t.OffloadMode, t.OffloadNoBound, t.OffloadJoinShort, t.OffloadAgeRTTs, t.OffloadTail, t.OffloadFreeze, t.OffloadNoRcvbufCap, t.OffloadHandover)
	switch {
	case !cdn:
		s += "No CDN front-end. "
	case c.TuneCDN:
		where := "the client's namespace: the client's sockets get them in every mode"
		if c.CDNHost != "" {
			where = "host " + c.CDNHost
		}
		s += "The CDN front-end's host (" + where + ") has the same kernel levers; its upstream keep-alive pool is nginx's. "
	default:
		s += "The CDN front-end's host has no levers (--tune-cdn=false). "
	}
	if c.OriginWmem > 0 {
		s += fmt.Sprintf("The origin has kernel defaults but a tcp_wmem default of %d bytes (its initial send buffer), in every mode. ", c.OriginWmem)
	} else {
		s += "The origin has kernel defaults in every mode. "
	}
	s += fmt.Sprintf("Planner model: ICW %d segments on the chain's links", icw)
	switch m := c.Model; {
	case m.EndICW > 0 && m.EndRTT < 0:
		s += fmt.Sprintf(", end segments (client - InP, EgP - origin) ICW %d over the world's client-InP RTT", m.EndICW)
	case m.EndICW > 0:
		s += fmt.Sprintf(", end segments (client - InP, EgP - origin) ICW %d over %v ms", m.EndICW, m.EndRTT)
	}
	return s + "."
}

func writeSamples(path string, rows [][]string) error {
	var b bytes.Buffer
	cw := csv.NewWriter(&b)
	cw.Write([]string{"run", "size", "bytes", "mode", "connect_ms", "first_byte_ms", "total_ms", "new_origin_conn", "emu_cpu_ms", "proxies_cpu_ms", "machine_busy"})
	cw.WriteAll(rows)
	if err := cw.Error(); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// congestionNote says which TCP congestion control the origin's namespace
// uses: it paces the warm front-end's origin connection (BBR) or not
// (CUBIC), which changes cdn-warm's times (docs/bench.md, "15 MB: what
// bounds it"). A world without tcp.congestion inherits the root
// namespace's default.
func congestionNote(w *emu.World, origin, configured string) string {
	var cc string
	err := w.Do(origin, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
		cc = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return fmt.Sprintf("TCP congestion control of the origin: unknown (%v)", err)
	}
	from := "set by the world file"
	if configured == "" {
		from = "not set by the world file: the root namespace's default"
	}
	return fmt.Sprintf("TCP congestion control of the origin (and every host without a lever): %s (%s)", cc, from)
}
