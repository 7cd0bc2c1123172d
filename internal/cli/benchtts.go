package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/report"
	"github.com/mosto-net/mosto/internal/transfer"
	"github.com/mosto-net/mosto/internal/ttsbench"
)

// runBenchTTS reproduces seed 002's tables (E2E vs TTS vs explicit split
// relay) and runs the loss x RTT grid with 1-3 segmentation points.
func runBenchTTS(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "bench tts")
	trials := fs.Int("trials", 200, "trials per cell (the seed: 200)")
	only := fs.String("only", "tables,grid", "parts to run: tables, grid, planner (the controller deciding which on-path relays intercept)")
	sizeFlag := fs.String("size", "70MB", "file size of the seed's tables (70 MB: E2E takes ~5.9 s at 100 Mbit/s, as in the seed)")
	ccs := fs.String("cc", "cubic,bbr", "congestion controls of the tables")
	modes := fs.String("modes", "e2e,tts,split", "modes of the tables: e2e, tts, split, pepsal, tts-bdpG (tts through a second proxy beside the first, its tproxy entry with the same settings plus window_bdp: G, e.g. tts-bdp1.25)")
	rowsFlag := fs.String("rows", "", "rows of the tables to run, 1-based indices (default: all 6); \"clean\": 1 ms links without jitter or loss (interception overhead)")
	rate := fs.Float64("rate", 100, "link rate, Mbit/s (the seed: 100)")
	gridRTTs := fs.String("grid-rtts", "2,20,100,400", "grid: end-to-end RTTs (ms)")
	gridLoss := fs.String("grid-loss", "0,0.5,2,5", "grid: end-to-end loss (%)")
	gridSize := fs.String("grid-size", "2MB", "grid: transfer size")
	gridCC := fs.String("grid-cc", "cubic", "grid: congestion control")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound of one transfer (a slower one counts as failed)")
	out := fs.String("out", "", "results folder (default results/tts-YYYYMMDD-HHMMSS)")
	realtime := fs.Bool("emu-realtime", false, "emulator threads at real-time priority")
	relayCC := fs.String("relay-cc", "", "congestion control of the relay's own connections (default: the table's, --cc)")
	jitterGSO := fs.Bool("jitter-gso", false, "draw link jitter once per GSO packet, as netem per skb on the seed's veth links (default: per wire segment)")
	sysctl := fs.String("sysctl", "", "sysctls set in every host of the worlds, comma-separated (e.g. net.ipv4.tcp_recovery=0)")
	tproxyCC := fs.String("tproxy-cc", "", "congestion control of the tproxy entry's legs only (tproxy.congestion; e.g. bbr for long legs), after --relay-cc; the split entry keeps the proxy's")
	tproxyPacing := fs.Bool("tproxy-pacing", false, "the tproxy entry's pacing: TCP-internal pacing on the intercepted legs (SO_MAX_PACING_RATE)")
	tproxyPacingMbit := fs.Float64("tproxy-pacing-mbit", 0, "the tproxy entry's pacing_mbit: pace the intercepted legs at most at this rate (Mbit/s; 0: no cap)")
	tproxyWindowClamp := fs.String("tproxy-window-clamp", "", "the tproxy entry's window_clamp: bound of the receive window the intercepted legs advertise (e.g. 3MB; empty: none)")
	tproxyInitCwnd := fs.Int("tproxy-initcwnd", 0, "the tproxy entry's initcwnd: initial congestion window of the intercepted legs (segments; 0: the kernel's 10)")
	tproxyHold := fs.Duration("tproxy-handshake-hold", 0, "the tproxy entry's handshake_hold: hold the relay's handshake ACK to the server and the flow's first bytes this long (<= 200ms), so the server's first RTT sample is not far below its leg's RTT (for the jitter rows; 0: off)")
	relaySysctl := fs.String("relay-sysctl", "", "sysctls set only in the relay hosts (their own legs), comma-separated, after --sysctl (e.g. net.ipv4.tcp_sack=0)")
	relayNoSACK := fs.Bool("relay-nosack", false, "the tproxy entry's no_sack: the legs of intercepted flows run without SACK (dupACK loss detection with adaptive reordering; for the jitter rows)")
	netemLimit := fs.Bool("netem-limit", false, "tables: each link direction holds at most 1000 packets queued and delayed together, as netem's limit on the seed's Mininet links (default: a 1000-packet queue, the delay line unbounded)")
	merge := fs.String("merge", "", "build the tables from per-transfer results files instead of running (comma-separated trials.jsonl files of earlier runs; trials of the same setup and size are pooled)")
	parallel := fs.Int("parallel", 1, "tables: run this many worlds at once (each its own namespaces), the trials dealt out among them; recorded per transfer (see docs/tts.md for when it changes the results)")
	mergeByParallel := fs.Bool("merge-by-parallel", false, "with --merge: pool the transfers of runs with different --parallel apart (default: together, counted per parallelism)")
	pepsal := fs.String("pepsal", "", "path of a PEPsal binary (github.com/CNES/pepsal, built by you) for the pepsal mode: the peer on the relay host behind its own TPROXY rules")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto bench tts [--trials N] [--only tables,grid] [flags]\n\nNeeds root. See docs/tts.md.")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *merge != "" {
		return mergeTTS(env, splitList(*merge), *out, *mergeByParallel)
	}
	if *parallel < 1 {
		return usageErrorf("--parallel must be at least 1")
	}
	if *trials < 1 {
		return usageErrorf("--trials must be at least 1")
	}
	if *rate <= 0 {
		return usageErrorf("--rate must be > 0")
	}
	size, err := transfer.ParseSizes(*sizeFlag)
	if err != nil || len(size) != 1 {
		return usageErrorf("--size: want one size (%v)", err)
	}
	var windowClamp int64
	if *tproxyWindowClamp != "" {
		ws, err := transfer.ParseSizes(*tproxyWindowClamp)
		if err != nil || len(ws) != 1 || ws[0] <= 0 {
			return usageErrorf("--tproxy-window-clamp: want one size > 0 (%v)", err)
		}
		windowClamp = ws[0]
	}
	gsize, err := transfer.ParseSizes(*gridSize)
	if err != nil || len(gsize) != 1 {
		return usageErrorf("--grid-size: want one size (%v)", err)
	}
	doTables, doGrid, doPlanner := false, false, false
	for _, p := range strings.Split(*only, ",") {
		switch strings.TrimSpace(p) {
		case "tables":
			doTables = true
		case "grid":
			doGrid = true
		case "planner":
			doPlanner = true
		default:
			return usageErrorf("--only: unknown part %q (want tables, grid, planner)", p)
		}
	}
	rows := ttsbench.SeedRows()
	if *rowsFlag != "" {
		var pick []ttsbench.Row
		for _, f := range strings.Split(*rowsFlag, ",") {
			if strings.TrimSpace(f) == "clean" {
				// For the interception overhead: 1 ms per link, no jitter, no loss.
				pick = append(pick, ttsbench.Row{Name: "clean 1ms", D1: 1, D2: 1})
				continue
			}
			i, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || i < 1 || i > len(rows) {
				return usageErrorf("--rows: %q is not a row 1-%d", f, len(rows))
			}
			pick = append(pick, rows[i-1])
		}
		rows = pick
	}
	var ms []ttsbench.Mode
	for _, m := range strings.Split(*modes, ",") {
		ms = append(ms, ttsbench.Mode(strings.TrimSpace(m)))
		if ms[len(ms)-1] == ttsbench.PEPsal && *pepsal == "" {
			return usageErrorf("--modes pepsal needs --pepsal PATH (a PEPsal binary)")
		}
	}
	rtts, err := parseFloats(*gridRTTs)
	if err != nil {
		return usageErrorf("--grid-rtts: %v", err)
	}
	losses, err := parseFloats(*gridLoss)
	if err != nil {
		return usageErrorf("--grid-loss: %v", err)
	}
	for _, l := range losses {
		if l < 0 || l >= 100 {
			return usageErrorf("--grid-loss: %v%% is not in [0, 100)", l)
		}
	}
	for _, r := range rtts {
		if r <= 0 {
			return usageErrorf("--grid-rtts: %v ms is not > 0", r)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join("results", "tts-"+time.Now().UTC().Format("20060102-150405"))
	}
	cfg := ttsbench.Config{
		Mosto: []string{exe}, Dir: dir, Trials: *trials, Size: size[0],
		CCs: splitList(*ccs), Modes: ms, Rows: rows, RateMbit: *rate, Timeout: *timeout,
		Realtime: *realtime, Sysctls: splitList(*sysctl), RelaySysctls: splitList(*relaySysctl), RelayNoSACK: *relayNoSACK, TProxyCC: *tproxyCC, TProxyPacing: *tproxyPacing, TProxyPacingMbit: *tproxyPacingMbit, TProxyInitCwnd: *tproxyInitCwnd, TProxyWindowClamp: windowClamp, TProxyHandshakeHold: *tproxyHold, NetemLimit: *netemLimit, PEPsal: *pepsal, JitterGSO: *jitterGSO, RelayCC: *relayCC, Parallel: *parallel, Log: env.Log, Progress: env.Stderr,
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "`mosto bench tts %s`, %s\nload before: %s\n", strings.Join(args, " "), time.Now().UTC().Format(time.RFC1123), loadAvg())
	if doTables {
		res, err := ttsbench.RunTables(ctx, cfg)
		if err != nil {
			return err
		}
		if err := res.WriteMarkdown(&md); err != nil {
			return err
		}
		if err := writePlot(filepath.Join(dir, "tables.svg"), res.Plot()); err != nil {
			return err
		}
	}
	if doGrid {
		res, err := ttsbench.RunGrid(ctx, cfg, ttsbench.GridConfig{RTTs: rtts, Losses: losses, Size: gsize[0], CC: *gridCC})
		if err != nil {
			return err
		}
		if err := res.WriteMarkdown(&md); err != nil {
			return err
		}
		if err := writePlot(filepath.Join(dir, "grid.svg"), res.Plot()); err != nil {
			return err
		}
	}
	if doPlanner {
		res, err := ttsbench.RunPlanner(ctx, cfg, nil)
		if res != nil {
			res.WriteMarkdown(&md)
		}
		if err != nil {
			env.Stdout.Write(md.Bytes())
			return err
		}
	}
	fmt.Fprintf(&md, "\nload after: %s\n", loadAvg())
	if err := os.WriteFile(filepath.Join(dir, "results.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	env.Stdout.Write(md.Bytes())
	fmt.Fprintf(env.Stdout, "\nresults in %s (results.md, tables.svg, grid.svg, proxy configs and logs)\n", dir)
	return nil
}

// mergeTTS pools the trials of several results files into the seed's
// tables (stdout, and results.md in out when given).
func mergeTTS(env *Env, files []string, out string, byParallel bool) error {
	var all []ttsbench.Trial
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			return err
		}
		ts, err := ttsbench.ReadTrials(r)
		r.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		all = append(all, ts...)
	}
	if byParallel {
		ttsbench.SeparateParallel(all)
	}
	p, err := ttsbench.MergeTrials(all)
	if err != nil {
		return err
	}
	var md bytes.Buffer
	fmt.Fprintf(&md, "`mosto bench tts --merge %s`: %d transfers from %d files\n", strings.Join(files, ","), len(all), len(files))
	if err := p.WriteMarkdown(&md); err != nil {
		return err
	}
	if out != "" {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, "results.md"), md.Bytes(), 0o644); err != nil {
			return err
		}
	}
	_, err = env.Stdout.Write(md.Bytes())
	return err
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range splitList(s) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func writePlot(path string, p *report.Plot) error {
	var b bytes.Buffer
	if err := p.WriteSVG(&b); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
