package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/stats"
	"github.com/mosto-net/mosto/internal/transfer"
)

// runDemo brings up the demo world (client near Dublin, origin in San
// Francisco, eight FEPs between), starts a proxy per FEP with a chain table
// from a real `mosto controller` running in the world (or, with
// --static-table, a table file computed from the world's RTTs), fetches 10-500 KB objects directly, through
// mosto and through an nginx front-end, prints the medians and tears down.
func runDemo(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "demo")
	runs := fs.Int("runs", 4, "fetches per size and mode")
	sizesFlag := fs.String("sizes", "10KB,50KB,100KB,200KB,500KB", "object sizes (comma-separated, 1 KB = 1000 B)")
	noCDN := fs.Bool("no-cdn", false, "skip the nginx CDN front-end")
	single := fs.Bool("single", false, "also fetch through the single proxy in Washington (the paper's Virginia)")
	static := fs.Bool("static-table", false, "no controller: give every proxy a chain table file computed by pathcomp from the world's RTTs")
	probeEvery := fs.Duration("probe-interval", 2*time.Second, "with the controller: the agents' probe round interval")
	plain := fs.Bool("plain", false, "the paper's plain chain: no connection pools, no TCP Fast Open, kernel-default initial windows on the FEPs")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto demo [--runs N] [--sizes LIST] [--no-cdn] [--single] [--static-table] [--probe-interval D]\n\nNeeds root (network namespaces, TUN devices, sysctls). Takes about a minute.")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *runs < 1 {
		return usageErrorf("--runs must be at least 1")
	}
	if *probeEvery < 100*time.Millisecond {
		return usageErrorf("--probe-interval must be at least 100ms")
	}
	sizes, err := transfer.ParseSizes(*sizesFlag)
	if err != nil {
		return usageErrorf("--sizes: %v", err)
	}
	if err := needPrivileges("mosto demo"); err != nil {
		return err
	}
	spec, err := scenario.DemoSpec()
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the mosto binary for the proxies: %w", err)
	}
	useCDN := !*noCDN
	if _, err := exec.LookPath("nginx"); err != nil && useCDN {
		fmt.Fprintln(env.Stdout, "nginx not installed: skipping the CDN front-end (apt-get install nginx)")
		useCDN = false
	}
	start := time.Now()
	fmt.Fprintln(env.Stdout, "mosto demo: client near Dublin, origin in San Francisco, 8 FEPs between them (WonderProxy RTTs, 2020-07-19)")
	w, err := emu.Up(ctx, spec, env.Log)
	if err != nil {
		return fmt.Errorf("bring up the demo world: %w", err)
	}
	defer w.Close()
	scfg := scenario.Config{Roles: scenario.Roles{Single: "Washington"}, Sizes: sizes, Mosto: []string{exe}, CDN: useCDN, CDNIdle: 5 * time.Second}
	if !*plain {
		scfg.Tune = demoLevers()
		scfg.TuneCDN = true
		scfg.Model = pathcomp.Model{ICW: scfg.Tune.InitCwnd}
		fmt.Fprintln(env.Stdout, "levers on (--plain turns them off): 2 pooled connections per proxy pair and to the origin, TCP Fast Open on hops, initcwnd/initrwnd 10000 and 32 MB initial rmem on the FEPs and the CDN front-end's host; the planner models ICW 10000 on the chain's links (docs/bench.md, \"Relay levers\")")
	}
	if !*static {
		scfg.Controller = &scenario.ControllerConfig{ProbeInterval: *probeEvery}
	}
	sc, err := scenario.Start(ctx, w, scfg, env.Log)
	if err != nil {
		return err
	}
	defer sc.Close()
	roles := sc.Roles()
	rtt, _ := sc.OriginRTT()
	fmt.Fprintf(env.Stdout, "world, origin and proxies ready in %v: %d hosts; client-origin RTT %.1f ms; ingress FEP %s, egress FEP %s, single proxy %s\n",
		time.Since(start).Round(100*time.Millisecond), len(w.Hosts()), float64(rtt)/1e6, roles.InP, roles.EgP, roles.Single)
	fmt.Fprintln(env.Stdout, chainSource(sc, ""))
	fmt.Fprint(env.Stdout, chainsPerSize(sc, sizes))

	modes := []scenario.Mode{scenario.Direct, scenario.Chain}
	if *single {
		modes = append(modes, scenario.Single)
	}
	if useCDN {
		modes = append(modes, scenario.CDNWarm)
	}
	// One untimed fetch per mode: opens nginx's upstream connection.
	for _, m := range modes {
		if _, err := sc.Fetch(ctx, m, sizes[0], 0); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	fmt.Fprintf(env.Stdout, "fetching %d sizes x %d modes x %d runs (every body hash-checked)...\n", len(sizes), len(modes), *runs)
	res, err := sc.Measure(ctx, scenario.Plan{Modes: modes, Sizes: sizes, Runs: *runs})
	if err != nil {
		return err
	}
	printDemo(env, res, modes)
	fmt.Fprintf(env.Stdout, "\ndone in %v; tearing down\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

func printDemo(env *Env, res *scenario.Results, modes []scenario.Mode) {
	tw := tabwriter.NewWriter(env.Stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	hdr := "size\t"
	for _, m := range modes {
		hdr += string(m) + " ms\t"
	}
	hdr += "chain vs direct\t"
	if res.MS[scenario.CDNWarm] != nil {
		hdr += "chain vs cdn\t"
	}
	hdr += "limit ms\tchain / limit\t"
	fmt.Fprintln(env.Stdout)
	fmt.Fprintln(tw, hdr+" chain used")
	for _, size := range res.Sizes {
		line := transfer.FormatSize(size) + "\t"
		for _, m := range modes {
			line += fmt.Sprintf("%.0f\t", res.Median(m, size))
		}
		ch := res.Median(scenario.Chain, size)
		line += fmt.Sprintf("%.2fx\t", res.Median(scenario.Direct, size)/ch)
		if res.MS[scenario.CDNWarm] != nil {
			line += fmt.Sprintf("%.2fx\t", res.Median(scenario.CDNWarm, size)/ch)
		}
		line += fmt.Sprintf("%.0f\t%.2f\t", res.Limit(size), ch/res.Limit(size))
		used := res.Chains[size]
		note := ""
		if len(used) == 0 {
			note = " (not observed)"
			used = res.Planned[size]
		} else if strings.Join(used, ">") != strings.Join(res.Planned[size], ">") {
			note = " (computed: " + strings.Join(res.Planned[size], ">") + ")"
		}
		line += " " + strings.Join(used, ">") + note
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	fmt.Fprintln(env.Stdout, "\nmedian times; speedup = median(other) / median(mosto-chain), > 1 means mosto is faster; limit = the physical limit (one client-origin RTT + size / bottleneck rate), chain / limit = 1.00 at the limit")
	var all []float64
	for _, size := range res.Sizes {
		all = append(all, res.Median(scenario.Direct, size)/res.Median(scenario.Chain, size))
	}
	fmt.Fprintf(env.Stdout, "mosto chain vs direct: median speedup %.2fx over all sizes\n", stats.Median(all))
}

// chainSource says where the proxies' chains come from; table is the
// --table file of a static run, if any.
func chainSource(sc *scenario.Scenario, table string) string {
	if !sc.UsesController() {
		if table != "" {
			return "chains: static table file " + table + " given to every proxy (no controller)"
		}
		return "chains: no controller (--static-table) — the chain table was computed by pathcomp from the world's RTTs and given to every proxy as a file"
	}
	cv := sc.Converged()
	m := cv.Matrix
	measured := 0
	for i := range m.RTTMS {
		for j := range m.RTTMS[i] {
			if i != j && m.RTTMS[i][j] != nil { // the diagonal may hold 0
				measured++
			}
		}
	}
	return fmt.Sprintf("chains: from the controller — `mosto controller` on %s (bbolt store, mutual TLS); %d proxies joined with a token, "+
		"measured %d of %d directed pairs and received their tables; discovery converged %v after the proxies started",
		sc.ControllerHost(), len(cv.Versions), measured, len(m.Names)*(len(m.Names)-1), cv.Took.Round(100*time.Millisecond))
}

// chainsPerSize lists the chain of the ingress FEP's table per size.
func chainsPerSize(sc *scenario.Scenario, sizes []int64) string {
	r := sc.Roles()
	var b strings.Builder
	fmt.Fprintf(&b, "table of %s (version %d), chain to %s per size:\n", r.InP, sc.TableVersion(), r.EgP)
	for _, size := range sizes {
		e, ok := sc.ComputedEntry(size)
		if !ok {
			fmt.Fprintf(&b, "  %6s  no chain (flows go direct)\n", transfer.FormatSize(size))
			continue
		}
		fmt.Fprintf(&b, "  %6s  %s\n", transfer.FormatSize(size), strings.Join(e.Path, ">"))
	}
	return b.String()
}

// needPrivileges explains what cmd (which brings up an emulated world) needs
// when it cannot run.
func needPrivileges(cmd string) error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (it creates network namespaces and TUN devices and sets sysctls)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		missing = append(missing, "iproute2's ip command")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		missing = append(missing, "/dev/net/tun")
	}
	if len(missing) > 0 {
		return errors.New(cmd + " needs " + strings.Join(missing, ", ") + "; run it as root on Linux, e.g. sudo " + cmd)
	}
	return nil
}

// demoLevers is the tuning measured in docs/bench.md ("Relay levers") that
// makes the chain beat the warm CDN front-end: hop and origin connection
// pools, TCP Fast Open on hop connections, and large initial windows on the
// inter-FEP paths standing in for the grown window of a warm connection.
func demoLevers() scenario.Tune {
	return scenario.Tune{HopPool: 2, OriginPool: 2, FastOpen: true, InitCwnd: 10000, RmemInit: 32000000}
}
