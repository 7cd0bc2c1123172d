package ttsbench

// The controller decides (docs/tts.md, "Which relays intercept: the
// controller"): a world c - r1 - r2 - s with a `mosto controller` (host
// ctl, clean links to r1 and r2) whose --onpath file declares three paths
// over the same relays: "cs" (server port 8080) planned by the controller
// from what the relays report, "allon" (8081) pinned with every relay
// intercepting, "alloff" (8082) pinned with none. After a warm-up on cs
// until its decision rests on measurements and both relays applied it,
// every trial fetches the file over the three ports in a random order.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/stats"
)

// Ports of the planner worlds.
const (
	portPlanned = 8080 // path cs: the controller decides
	portAllOn   = 8081 // path allon: every relay intercepts
	portAllOff  = 8082 // path alloff: no relay intercepts
	portCtl     = 7443
)

// PlannerWorld is one world of the planner experiment: hop i is the link
// between the path's i-th and (i+1)-th host (c, r1, r2, s).
type PlannerWorld struct {
	Name    string
	DelayMS [3]float64 // one-way delay of each hop
	LossPct [3]float64 // loss of each hop, per direction
}

// DefaultPlannerWorlds: a lossy first hop (1% on c - r1, 5 ms hops) and
// a clean short path (0.5 ms hops).
func DefaultPlannerWorlds() []PlannerWorld {
	return []PlannerWorld{
		{Name: "lossy", DelayMS: [3]float64{5, 5, 5}, LossPct: [3]float64{1, 0, 0}},
		{Name: "clean", DelayMS: [3]float64{0.5, 0.5, 0.5}},
	}
}

// PlannerWorldResult is one world's decision and times.
type PlannerWorldResult struct {
	World PlannerWorld
	// Active is the controller's decision for cs (r1, r2); Model is
	// BestSplit's choice on the world's true hops (the same gain rule).
	Active, Model []bool
	WarmUp        time.Duration // from the first warm-up fetch to the decision applied
	// Times (s) per mode: planned, all-on, all-off.
	Times  [3][]float64
	Failed [3]int
	// Predicted (s) per mode by the loss model on the true hops.
	Predicted [3]float64
}

// PlannerResult is the experiment's result.
type PlannerResult struct {
	Size   int64
	Worlds []PlannerWorldResult
}

var plannerModes = [3]string{"planned", "all-on", "all-off"}

// RunPlanner runs the experiment in every world (default
// DefaultPlannerWorlds), cfg.Trials trials each (CUBIC, cfg.Size bytes).
func RunPlanner(ctx context.Context, cfg Config, worlds []PlannerWorld) (*PlannerResult, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if len(worlds) == 0 {
		worlds = DefaultPlannerWorlds()
	}
	res := &PlannerResult{Size: cfg.Size}
	for _, pw := range worlds {
		wr, err := runPlannerWorld(ctx, &cfg, pw)
		if wr != nil {
			res.Worlds = append(res.Worlds, *wr)
		}
		if err != nil {
			return res, fmt.Errorf("ttsbench: world %s: %w", pw.Name, err)
		}
		fmt.Fprintf(cfg.Progress, "planner world %s: decision %s\n", pw.Name, activeNames(wr.Active))
	}
	return res, nil
}

// activeNames names the active relays ("r1+r3"; "none").
func activeNames(a []bool) string {
	var out []string
	for i, on := range a {
		if on {
			out = append(out, fmt.Sprintf("r%d", i+1))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "+")
}

func (pw PlannerWorld) hops() []pathcomp.LossHop {
	hs := make([]pathcomp.LossHop, 3)
	for i := range hs {
		hs[i] = pathcomp.LossHop{RTT: 2 * pw.DelayMS[i], Loss: pw.LossPct[i] / 100}
	}
	return hs
}

func runPlannerWorld(ctx context.Context, cfg *Config, pw PlannerWorld) (*PlannerWorldResult, error) {
	names := []string{"c", "r1", "r2", "s"}
	spec := &emu.Spec{Name: "ttsplan", TCP: emu.TCP{Congestion: "cubic"}}
	for _, n := range append(slices.Clone(names), "ctl") {
		spec.Hosts = append(spec.Hosts, emu.HostSpec{Name: n})
	}
	for i := range 3 {
		spec.Links = append(spec.Links, linkSpec(names[i], names[i+1], pw.DelayMS[i], 0, pw.LossPct[i], cfg.RateMbit, false))
	}
	spec.Links = append(spec.Links, linkSpec("ctl", "r1", 0.1, 0, 0, 1000, false), linkSpec("ctl", "r2", 0.1, 0, 0, 1000, false))
	for i := range names {
		for j := i + 2; j < len(names); j++ {
			spec.Routes = append(spec.Routes, emu.RouteSpec{From: names[i], To: names[j], Via: names[i+1 : j]})
		}
	}
	spec.Routes = append(spec.Routes, emu.RouteSpec{From: "ctl", To: "c", Via: []string{"r1"}}, emu.RouteSpec{From: "ctl", To: "s", Via: []string{"r2"}})
	w, err := emu.UpWith(ctx, spec, cfg.Log, emu.UpOptions{Realtime: cfg.Realtime})
	if err != nil {
		return nil, err
	}
	l := &lab{cfg: cfg, w: w, size: cfg.Size}
	defer l.close()
	if err := l.sysctls(ctx); err != nil {
		return nil, err
	}
	for _, p := range []uint16{portPlanned, portAllOn, portAllOff} {
		if err := l.serve(ctx, p); err != nil {
			return nil, err
		}
	}
	s := w.Addr("s")
	dir := filepath.Join(cfg.Dir, "planner-"+pw.Name+"-"+w.RunID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The controller: the three paths, decisions held 2 s, losses from
	// 500 segments on.
	op := fmt.Sprintf(`gain: 0.10
hold: 2s
min_segs: 500
paths:
  - {name: cs, relays: [r1, r2], dests: ["%v"], ports: "%d", rate_mbit: %g, size: %d}
  - {name: allon, relays: [r1, r2], dests: ["%v"], ports: "%d", pin: all}
  - {name: alloff, relays: [r1, r2], dests: ["%v"], ports: "%d", pin: none}
`, s, portPlanned, cfg.RateMbit, cfg.Size, s, portAllOn, s, portAllOff)
	opFile := filepath.Join(dir, "onpath.yaml")
	if err := os.WriteFile(opFile, []byte(op), 0o644); err != nil {
		return nil, err
	}
	ctlAddr := netip.AddrPortFrom(w.Addr("ctl"), portCtl)
	if err := l.start("controller", "ctl", filepath.Join(dir, "controller.log"), "controller", "--data", filepath.Join(dir, "ctl"),
		"--listen", ctlAddr.String(), "--insecure", "--onpath", opFile, "--debounce", "100ms", "--period", "1h",
		"--allow-member-net", emu.Prefix.String(), "--light-bound=false"); err != nil {
		return nil, err
	}
	client := &api.Client{BaseURL: "http://" + ctlAddr.String(), HTTP: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, n, a string) (net.Conn, error) { return w.Dial(ctx, "ctl", n, a) },
	}}}
	if err := waitUntil(ctx, 30*time.Second, func() bool {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := client.Health(hctx)
		return err == nil
	}); err != nil {
		return nil, fmt.Errorf("controller not up: %w", err)
	}
	for _, r := range []string{"r1", "r2"} {
		conf := fmt.Sprintf(`id: %s
destinations: {allow: ["%v"]}
tproxy: {listen: "0.0.0.0:%d", ports: "%d-%d"}
socket: {congestion: cubic}
timeouts: {drain: 1s, idle: 15m}
controller:
  url: http://%v
  data_dir: %s
  hop_addr: %v:7000
  probe_addr: %v:7001
  probe_interval: 1s
`, r, emu.Prefix, portTP, portPlanned, portAllOff, ctlAddr, filepath.Join(dir, r), w.Addr(r), w.Addr(r))
		if err := l.proxy(ctx, r, conf, netip.AddrPortFrom(w.Addr(r), portTP)); err != nil {
			return nil, err
		}
	}
	wr := &PlannerWorldResult{World: pw}
	m := pathcomp.LossModel{Model: pathcomp.Model{ICW: 10, MSS: 1448}, RateMbit: cfg.RateMbit}
	hops := pw.hops()
	wr.Model = modelChoice(m, hops, cfg.Size, 0.10)
	for i, a := range [][]bool{nil, {true, true}, {false, false}} {
		if a == nil {
			a = wr.Model
		}
		t, _ := m.Time(pathcomp.Merge(hops, a), cfg.Size)
		wr.Predicted[i] = (t + hops[0].RTT + hops[1].RTT + hops[2].RTT) / 1000
	}
	// Warm-up: fetch over cs until the decision rests on measurements
	// and both relays' rules show it.
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	for {
		if _, err := l.fetch(ctx, netip.AddrPortFrom(s, portPlanned)); err != nil {
			cfg.Log.Warn("warm-up transfer failed", "err", err)
		}
		dec, ok := decision(ctx, client)
		if ok && l.applied(ctx, dec) {
			wr.Active = dec
			break
		}
		if time.Now().After(deadline) {
			return wr, fmt.Errorf("no measured decision applied after %v (last: %v, measured %v)", time.Since(start).Round(time.Second), dec, ok)
		}
	}
	wr.WarmUp = time.Since(start)
	ports := [3]uint16{portPlanned, portAllOn, portAllOff}
	for range cfg.Trials {
		for _, k := range shuffled([]int{0, 1, 2}) {
			d, err := l.fetch(ctx, netip.AddrPortFrom(s, ports[k]))
			if err != nil {
				if ctx.Err() != nil {
					return wr, ctx.Err()
				}
				wr.Failed[k]++
				cfg.Log.Warn("planner transfer failed", "world", pw.Name, "mode", plannerModes[k], "err", err)
				continue
			}
			wr.Times[k] = append(wr.Times[k], secs(d))
		}
	}
	// The decision must not have moved during the trials.
	if dec, ok := decision(ctx, client); ok && !slices.Equal(dec, wr.Active) {
		return wr, fmt.Errorf("the decision changed during the trials: %v -> %v", wr.Active, dec)
	}
	return wr, nil
}

// modelChoice is the planner's rule on known hops: the fewest relays
// within gain of the fastest choice.
func modelChoice(m pathcomp.LossModel, hops []pathcomp.LossHop, size int64, gain float64) []bool {
	n := len(hops) - 1
	best, times := -1.0, make([]float64, 1<<n)
	for mask := range times {
		a := make([]bool, n)
		for i := range a {
			a[i] = mask&(1<<i) != 0
		}
		times[mask], _ = m.Time(pathcomp.Merge(hops, a), size)
		if best < 0 || times[mask] < best {
			best = times[mask]
		}
	}
	want := -1
	for mask, t := range times {
		if t > (1+gain)*best {
			continue
		}
		if want < 0 || popcount(mask) < popcount(want) || popcount(mask) == popcount(want) && t < times[want] {
			want = mask
		}
	}
	a := make([]bool, n)
	for i := range a {
		a[i] = want&(1<<i) != 0
	}
	return a
}

func popcount(m int) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

// decision reads path cs's decision from r1's table; ok once it rests on
// measurements.
func decision(ctx context.Context, c *api.Client) ([]bool, bool) {
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t, err := c.TableEpoch(tctx, "r1", 0, "", 0)
	if err != nil || t == nil {
		return nil, false
	}
	a := make([]bool, 2)
	measured := true
	for _, in := range t.Intercept {
		if in.Path != "cs" {
			continue
		}
		measured = measured && in.Measured
		switch in.FEP {
		case "r1":
			a[0] = in.Active
		case "r2":
			a[1] = in.Active
		}
	}
	return a, measured && len(t.Intercept) > 0
}

// applied reports whether both relays' interception rules match the
// decision for port portPlanned.
func (l *lab) applied(ctx context.Context, dec []bool) bool {
	for i, r := range []string{"r1", "r2"} {
		out, err := l.w.Command(ctx, r, "nft", "list", "table", "ip", "mosto_tp_"+r).CombinedOutput()
		if err != nil {
			return false
		}
		has := strings.Contains(string(out), fmt.Sprintf("tcp dport %d", portPlanned)) ||
			strings.Contains(string(out), fmt.Sprintf("tcp dport { %d }", portPlanned))
		if has != dec[i] {
			return false
		}
	}
	return true
}

// start runs `mosto args...` in host, logging to logf.
func (l *lab) start(name, host, logf string, args ...string) error {
	f, err := os.Create(logf)
	if err != nil {
		return err
	}
	defer f.Close()
	all := append(append([]string(nil), l.cfg.Mosto[1:]...), args...)
	cmd := l.w.Command(context.Background(), host, l.cfg.Mosto[0], all...)
	cmd.Env = append(os.Environ(), l.cfg.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	l.procs = append(l.procs, p)
	return nil
}

func waitUntil(ctx context.Context, d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %v", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// WriteMarkdown writes the side-by-side table.
func (r *PlannerResult) WriteMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "Planner (cubic, %d B; c - r1 - r2 - s; times in s, mean (sd) [model]; ratio = mean / all-off mean):\n\n", r.Size)
	fmt.Fprintf(w, "| world | hops (one-way ms / loss %%) | decision | model | warm-up s | planned | all-on | all-off | planned/all-off | all-on/all-off | n | fails |\n")
	fmt.Fprintf(w, "| --- | --- | --- | --- | --: | --: | --: | --: | --: | --: | --: | --- |\n")
	for _, wr := range r.Worlds {
		var hs []string
		for i := range 3 {
			hs = append(hs, fmt.Sprintf("%g/%g", wr.World.DelayMS[i], wr.World.LossPct[i]))
		}
		var cells [3]string
		var means [3]float64
		for k := range 3 {
			means[k] = stats.Mean(wr.Times[k])
			cells[k] = fmt.Sprintf("%s (%s) [%s]", f3(means[k]), f3(stats.SD(wr.Times[k])), f3(wr.Predicted[k]))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.1f | %s | %s | %s | %s | %s | %d | %d/%d/%d |\n", wr.World.Name, strings.Join(hs, ", "),
			activeNames(wr.Active), activeNames(wr.Model), wr.WarmUp.Seconds(), cells[0], cells[1], cells[2],
			f3(means[0]/means[2]), f3(means[1]/means[2]), len(wr.Times[0]), wr.Failed[0], wr.Failed[1], wr.Failed[2])
	}
	return nil
}
