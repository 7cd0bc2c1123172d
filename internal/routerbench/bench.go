package routerbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/stats"
)

// Modes, in the order they are reported.
var Modes = []string{"direct", "dns", "302", "proxy", "handoff", "handoff-s", "nginx-lb"}

// Config configures a run.
type Config struct {
	Hops []int // client-side path lengths; default 1,2,4,8
	// Ref is the mode the latency tables compare every other mode with
	// (A12, Mann-Whitney p); default handoff.
	Ref      string
	HopMS    float64 // one-way delay of every segment; default 0.5
	OriginMS float64 // one-way delay surrogate <-> origin; default 10
	Runs     int     // fetches per mode and hop count; default 30
	Size     int64   // object of the latency fetches; default 10 KB
	BulkSize int64   // object of the bulk fetches; default 100 MB
	BulkRuns int     // bulk fetches per mode; default 3 (0: none)
	Requests int     // requests per session in the L7 scenarios; default 20
	Modes    []string
	// LossPct drops packets on the client's first segment (both ways).
	LossPct float64
	// StripOptions turns SACK, timestamps and window scaling off in every
	// host (what the seed had to do) to measure what keeping them buys.
	StripOptions bool
	// Congestion is every host's TCP congestion control (default: the root
	// namespace's, BBR on this machine). A handed-off surrogate connection
	// keeps the RTT its handshake with rr measured: BBR sizes its window
	// from it (docs/router.md, 1 GB).
	Congestion string
	// RROnPath routes the clients' packets to the surrogates through rr
	// (a plain forwarder for them), so direct fetches cross rr as the
	// handed-off responses do: the placement's extra hop is then in both.
	RROnPath bool
	// Geo runs the geographic world (geoSpec: WonderProxy RTTs, clients
	// c1..cN in GeoClients' cities) instead of the linear one; Hops are
	// then client numbers.
	Geo bool
	// BulkOnly skips the latency fetches and the L7 sessions.
	BulkOnly bool
	// RouterSite (geographic world): the proxy and handoff routers rank
	// surrogates by their RTT from rr (`mosto router --site`), since the
	// response crosses rr, instead of from the client.
	RouterSite bool
	// Handshakes > 0 measures that many connects to the handoff router, a
	// plain server on rr and s1, interleaved (handshakes), first.
	Handshakes int
	Mosto      string // the mosto binary (runs `mosto router` in the world)
	Dir        string // work directory (nginx configs, logs)
	Log        *slog.Logger
}

func (c *Config) defaults() error {
	maxHops := 8
	if c.Geo {
		maxHops = len(GeoClients)
		if c.RROnPath || c.LossPct != 0 {
			return errors.New("routerbench: the geographic world has no on-path rr and no lossy first segment")
		}
	}
	if len(c.Hops) == 0 {
		c.Hops = []int{1, 2, 4, 8}
		if c.Geo {
			c.Hops = nil
			for i := range GeoClients {
				c.Hops = append(c.Hops, i+1)
			}
		}
	}
	for _, h := range c.Hops {
		if h < 1 || h > maxHops {
			return fmt.Errorf("routerbench: %d hops (or client number); want 1-%d", h, maxHops)
		}
	}
	if c.HopMS == 0 {
		c.HopMS = 0.5
	}
	if c.OriginMS == 0 {
		c.OriginMS = 10
	}
	if c.Runs == 0 {
		c.Runs = 30
	}
	if c.Size == 0 {
		c.Size = 10_000
	}
	if c.BulkSize == 0 {
		c.BulkSize = 100_000_000
	}
	if c.Requests == 0 {
		c.Requests = 20
	}
	if c.Ref == "" {
		c.Ref = "handoff"
	}
	if len(c.Modes) == 0 {
		c.Modes = Modes
	}
	if !slices.Contains(Modes, c.Ref) {
		return fmt.Errorf("routerbench: unknown reference mode %q", c.Ref)
	}
	for _, m := range c.Modes {
		if !slices.Contains(Modes, m) {
			return fmt.Errorf("routerbench: unknown mode %q (want %s)", m, strings.Join(Modes, ", "))
		}
	}
	if c.Mosto == "" {
		return errors.New("routerbench: no mosto binary")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

type bench struct {
	cfg     Config
	w       *emu.World
	procs   map[string]*proc // by mode: the process doing the RR's work
	results map[string][]sample
	cur     int // the measuring client's number (geo: its direct surrogate)
}

// label names client cH in the report.
func (b *bench) label(h int) string {
	if b.cfg.Geo {
		return fmt.Sprintf("client c%d in %s (nearest surrogate %s in %s)", h, GeoClients[h-1], geoNearest(h), geoSites[geoNearest(h)])
	}
	return fmt.Sprintf("%d hop(s) between client and rr/surrogates", h)
}

// Run brings the world up, measures and writes a markdown report to out.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	spec := worldSpec(cfg.Hops, cfg.HopMS, cfg.OriginMS, cfg.RROnPath)
	if cfg.Geo {
		spec = geoSpec(slices.Max(cfg.Hops))
	}
	spec.TCP.Congestion = cfg.Congestion
	if cfg.LossPct < 0 || cfg.LossPct > 50 {
		return fmt.Errorf("routerbench: loss %v%%; want 0-50", cfg.LossPct)
	}
	for i := range spec.Links {
		l := &spec.Links[i]
		if cfg.LossPct > 0 && ((l.A == "h1" && l.B[0] == 'c') || (l.B == "h1" && l.A[0] == 'c')) {
			l.LossPct = &cfg.LossPct
		}
	}
	w, err := emu.UpWith(ctx, spec, cfg.Log, emu.UpOptions{})
	if err != nil {
		return err
	}
	defer w.Close()
	b := &bench{cfg: cfg, w: w, procs: map[string]*proc{}, results: map[string][]sample{}}
	defer func() {
		for _, p := range b.procs {
			p.stop()
		}
	}()
	if cfg.StripOptions {
		for _, h := range w.Hosts() {
			for _, kv := range []string{"net.ipv4.tcp_sack=0", "net.ipv4.tcp_timestamps=0", "net.ipv4.tcp_window_scaling=0"} {
				if out, err := w.Command(ctx, h, "sysctl", "-q", "-w", kv).CombinedOutput(); err != nil {
					return fmt.Errorf("strip options on %s: %v: %s", h, err, out)
				}
			}
		}
	}
	if err := b.start(ctx); err != nil {
		return err
	}
	if err := b.warm(ctx); err != nil {
		return err
	}
	if cfg.Geo {
		fmt.Fprintf(out, "# bench router (geographic world)\n\nworld: WonderProxy minimum RTTs (half each way); clients c1..c%d in %s; rr in %s, s1 (nginx proxy_cache, warm) in %s, s2 in %s, origin in %s; the router picks each client's nearest surrogate from the same matrix (proxy and handoff from rr's site: %v). Object %d B, %d runs per mode, modes interleaved.\n\n",
			slices.Max(cfg.Hops), strings.Join(GeoClients[:slices.Max(cfg.Hops)], ", "), geoSites["rr"], geoSites["s1"], geoSites["s2"], geoSites["origin"], cfg.RouterSite, cfg.Size, cfg.Runs)
	} else {
		fmt.Fprintf(out, "# bench router\n\nworld: clients behind 1-%d forwarding hosts, %.2g ms one way per segment; rr, s1, s2 (nginx proxy_cache, warm) %.2g ms from each other; origin %.2g ms from the surrogates. Object %d B, %d runs per mode, modes interleaved. Loss on the client's first segment: %g%%. TCP options (SACK, timestamps, window scaling): %s. rr on the clients' path to the surrogates: %v. Congestion control: %s.\n\n",
			slices.Max(cfg.Hops), cfg.HopMS, cfg.HopMS, cfg.OriginMS, cfg.Size, cfg.Runs, cfg.LossPct, map[bool]string{false: "kept", true: "stripped"}[cfg.StripOptions], cfg.RROnPath, cmp.Or(cfg.Congestion, "default"))
	}
	if cfg.Handshakes > 0 {
		if err := b.handshakes(ctx, out); err != nil {
			return err
		}
	}
	if !cfg.BulkOnly {
		if err := b.latency(ctx, out); err != nil {
			return err
		}
		if err := b.sessions(ctx, out); err != nil {
			return err
		}
	}
	if cfg.BulkRuns > 0 {
		if err := b.bulk(ctx, out); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) start(ctx context.Context) error {
	w := b.w
	ln, err := w.Listen(ctx, "origin", "tcp", hostPort(w, "origin", portOrigin))
	if err != nil {
		return err
	}
	go origin.New(origin.Config{}, nil).Serve(ctx, ln)
	for _, s := range []string{"s1", "s2"} {
		p, err := startNginx(ctx, w, s, surrogateConf, confData{Dir: filepath.Join(b.cfg.Dir, s), Listen: hostPort(w, s, portCache), Origin: hostPort(w, "origin", portOrigin)})
		if err != nil {
			return err
		}
		b.procs["cache-"+s] = p
	}
	lb, err := startNginx(ctx, w, "rr", lbConf, confData{Dir: filepath.Join(b.cfg.Dir, "lb"), Listen: hostPort(w, "rr", portLB), S1: hostPort(w, "s1", portCache), S2: hostPort(w, "s2", portCache)})
	if err != nil {
		return err
	}
	b.procs["nginx-lb"] = lb
	surr := []string{"--surrogate", "s1=" + hostPort(w, "s1", portCache), "--surrogate", "s2=" + hostPort(w, "s2", portCache)}
	if b.cfg.Geo {
		surr = []string{"--rtt-matrix", "wonderproxy", "--surrogate", "s1=" + hostPort(w, "s1", portCache) + "@" + geoSites["s1"],
			"--surrogate", "s2=" + hostPort(w, "s2", portCache) + "@" + geoSites["s2"]}
		for _, h := range b.cfg.Hops {
			surr = append(surr, "--near", w.Addr(clientName(h)).String()+"/32@"+GeoClients[h-1])
		}
	}
	// handoff-s: the surrogate-side placement; an agent on each surrogate.
	agentArgs, err := b.startAgents(ctx)
	if err != nil {
		return err
	}
	for _, m := range []struct {
		mode string
		port int
		args []string
	}{
		{"handoff", portHandoff, nil},
		{"302", portRedirect, []string{"--dns", hostPort(w, "rr", portDNS), "--dns-name", dnsName}},
		{"proxy", portProxy, nil},
		{"handoff-s", portTriangle, agentArgs},
	} {
		mode := strings.TrimSuffix(m.mode, "-s")
		args := append([]string{"router", "--listen", hostPort(w, "rr", m.port), "--mode", mode}, surr...)
		args = append(args, m.args...)
		if b.cfg.Geo && b.cfg.RouterSite && m.mode != "302" {
			// The response crosses rr: rank surrogates from rr's site.
			args = append(args, "--site", geoSites["rr"])
		}
		cmd := w.Command(ctx, "rr", b.cfg.Mosto, args...)
		f, err := os.Create(filepath.Join(b.cfg.Dir, "router-"+m.mode+".log"))
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start mosto router %s: %w", m.mode, err)
		}
		b.procs[m.mode] = &proc{name: "router-" + m.mode, cmd: cmd}
	}
	b.procs["dns"] = b.procs["302"]
	// Wait for every listener.
	client := clientName(b.cfg.Hops[0])
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range []string{hostPort(w, "s1", portCache), hostPort(w, "s2", portCache), hostPort(w, "rr", portLB),
		hostPort(w, "rr", portHandoff), hostPort(w, "rr", portRedirect), hostPort(w, "rr", portProxy), hostPort(w, "rr", portTriangle)} {
		for {
			c, err := w.Dial(ctx, client, "tcp", a)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not listening: %w (logs in %s)", a, err, b.cfg.Dir)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// startAgents runs `mosto xagent` on s1 and s2 and returns the handoff-s
// router's arguments for them.
func (b *bench) startAgents(ctx context.Context) ([]string, error) {
	w := b.w
	key := filepath.Join(b.cfg.Dir, "agent.key")
	if err := os.WriteFile(key, []byte(fmt.Sprintf("bench key %d %d\n", time.Now().UnixNano(), os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	args := []string{"--placement", "surrogate", "--agent-key-file", key}
	for _, s := range []string{"s1", "s2"} {
		cmd := w.Command(ctx, s, b.cfg.Mosto, "xagent", "--listen", hostPort(w, s, portAgent), "--key-file", key)
		f, err := os.Create(filepath.Join(b.cfg.Dir, "xagent-"+s+".log"))
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start mosto xagent on %s: %w", s, err)
		}
		b.procs["xagent-"+s] = &proc{name: "xagent-" + s, cmd: cmd}
		args = append(args, "--agent", w.Addr(s).String()+"="+hostPort(w, s, portAgent))
	}
	return args, nil
}

func target(seed int, size int64) string {
	return "/obj?size=" + strconv.FormatInt(size, 10) + "&seed=" + strconv.Itoa(seed)
}

// warm fetches every object once from both surrogates.
func (b *bench) warm(ctx context.Context) error {
	var targets []string
	for r := range b.cfg.Runs * btoi(!b.cfg.BulkOnly) {
		targets = append(targets, target(r, b.cfg.Size))
	}
	for r := range b.cfg.Requests * btoi(!b.cfg.BulkOnly) {
		targets = append(targets, target(1000+r, b.cfg.Size))
	}
	if b.cfg.BulkRuns > 0 {
		targets = append(targets, target(2000, b.cfg.BulkSize))
	}
	return b.w.Do(clientName(b.cfg.Hops[0]), func() error {
		for _, s := range []string{"s1", "s2"} {
			cl := &client{dial: (&net.Dialer{}).DialContext, keepAlive: true}
			for _, t := range targets {
				size, _ := strconv.ParseInt(strings.TrimPrefix(strings.Split(t, "&")[0], "/obj?size="), 10, 64)
				fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
				_, err := cl.fetch(fctx, hostPort(b.w, s, portCache), t, size)
				cancel()
				if err != nil {
					cl.close()
					return fmt.Errorf("warm %s%s: %w", s, t, err)
				}
			}
			cl.close()
		}
		return nil
	})
}

// addr returns where mode's client connects (resolving for dns).
func (b *bench) addr(ctx context.Context, mode string) (string, error) {
	w := b.w
	switch mode {
	case "direct":
		if b.cfg.Geo {
			return hostPort(w, geoNearest(b.cur), portCache), nil
		}
		return hostPort(w, "s1", portCache), nil
	case "dns":
		ip, err := resolve(ctx, (&net.Dialer{}).DialContext, hostPort(w, "rr", portDNS))
		if err != nil {
			return "", err
		}
		return net.JoinHostPort(ip.String(), strconv.Itoa(portCache)), nil
	case "302":
		return hostPort(w, "rr", portRedirect), nil
	case "proxy":
		return hostPort(w, "rr", portProxy), nil
	case "handoff":
		return hostPort(w, "rr", portHandoff), nil
	case "handoff-s":
		return hostPort(w, "rr", portTriangle), nil
	case "nginx-lb":
		return hostPort(w, "rr", portLB), nil
	}
	return "", fmt.Errorf("mode %q", mode)
}

// one measures one fetch of mode from the calling thread's namespace.
func (b *bench) one(ctx context.Context, mode, tgt string, size int64) (sample, error) {
	fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	start := time.Now()
	a, err := b.addr(fctx, mode)
	if err != nil {
		return sample{}, err
	}
	lookup := time.Since(start)
	cl := &client{dial: (&net.Dialer{}).DialContext}
	s, err := cl.fetch(fctx, a, tgt, size)
	s.Total += lookup
	return s, err
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (b *bench) latency(ctx context.Context, out io.Writer) error {
	ttfb := map[string]map[int][]float64{} // mode -> hops -> ms
	for _, m := range b.cfg.Modes {
		ttfb[m] = map[int][]float64{}
	}
	for _, h := range b.cfg.Hops {
		hs := map[string][]float64{}
		tot := map[string][]float64{}
		b.cur = h
		err := b.w.Do(clientName(h), func() error {
			for r := range b.cfg.Runs {
				order := slices.Clone(b.cfg.Modes)
				rot := r % len(order)
				order = append(order[rot:], order[:rot]...)
				for _, m := range order {
					s, err := b.one(ctx, m, target(r, b.cfg.Size), b.cfg.Size)
					if err != nil {
						return fmt.Errorf("%d hops, %s, run %d: %w", h, m, r, err)
					}
					hs[m] = append(hs[m], ms(s.Handshake))
					ttfb[m][h] = append(ttfb[m][h], ms(s.TTFB))
					tot[m] = append(tot[m], ms(s.Total))
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "## %s\n\n", b.label(h))
		ref := b.cfg.Ref
		fmt.Fprintf(out, "| mode | handshake ms (median) | GET to first byte ms (median, p10-p90) | total ms (median) | TTFB A12 %s vs mode | Mann-Whitney p |\n|---|---|---|---|---|---|\n", ref)
		for _, m := range b.cfg.Modes {
			x := ttfb[m][h]
			a12, p := "", ""
			if m != ref && len(ttfb[ref][h]) > 0 {
				a12 = fmt.Sprintf("%.2f", stats.A12(ttfb[ref][h], x))
				if mw, err := stats.MannWhitneyU(ttfb[ref][h], x); err == nil {
					p = fmt.Sprintf("%.2g", mw.P)
				}
			}
			fmt.Fprintf(out, "| %s | %.3f | %.3f (%.3f-%.3f) | %.3f | %s | %s |\n", m, stats.Median(hs[m]), stats.Median(x),
				stats.Percentile(x, 10), stats.Percentile(x, 90), stats.Median(tot[m]), a12, p)
		}
		fmt.Fprintln(out)
	}
	if len(b.cfg.Hops) > 1 {
		fmt.Fprintf(out, "## Start-transfer delay (GET to first byte, median ms) by %s\n\n| mode |", map[bool]string{false: "hop count", true: "client"}[b.cfg.Geo])
		for _, h := range b.cfg.Hops {
			fmt.Fprintf(out, " %d |", h)
		}
		fmt.Fprintf(out, "\n|---|%s\n", strings.Repeat("---|", len(b.cfg.Hops)))
		for _, m := range b.cfg.Modes {
			fmt.Fprintf(out, "| %s |", m)
			for _, h := range b.cfg.Hops {
				fmt.Fprintf(out, " %.3f |", stats.Median(ttfb[m][h]))
			}
			fmt.Fprintln(out)
		}
		fmt.Fprintln(out)
	}
	return nil
}

// sessions: the seed's L7 scenarios, Requests objects per session with a
// connection per request or one keep-alive connection.
func (b *bench) sessions(ctx context.Context, out io.Writer) error {
	h := b.cfg.Hops[0]
	modes := []string{}
	for _, m := range b.cfg.Modes {
		if m != "dns" {
			modes = append(modes, m)
		}
	}
	res := map[bool]map[string][]float64{false: {}, true: {}}
	b.cur = h
	err := b.w.Do(clientName(h), func() error {
		for r := range b.cfg.Runs {
			for _, ka := range []bool{false, true} {
				order := slices.Clone(modes)
				rot := r % len(order)
				order = append(order[rot:], order[:rot]...)
				for _, m := range order {
					a, err := b.addr(ctx, m)
					if err != nil {
						return err
					}
					fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
					start := time.Now()
					cl := &client{dial: (&net.Dialer{}).DialContext, keepAlive: ka}
					for q := range b.cfg.Requests {
						if _, err := cl.fetch(fctx, a, target(1000+q, b.cfg.Size), b.cfg.Size); err != nil {
							cl.close()
							cancel()
							return fmt.Errorf("session %s keep-alive=%v run %d: %w", m, ka, r, err)
						}
					}
					res[ka][m] = append(res[ka][m], ms(time.Since(start)))
					cl.close()
					cancel()
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "## L7 scenarios: %d requests of %d B per session, %s, %d sessions per mode\n\n", b.cfg.Requests, b.cfg.Size, b.label(h), b.cfg.Runs)
	fmt.Fprintf(out, "| mode | connection per request: ms (median) | A12 handoff vs mode | p | keep-alive: ms (median) | A12 handoff vs mode | p |\n|---|---|---|---|---|---|---|\n")
	for _, m := range modes {
		fmt.Fprintf(out, "| %s |", m)
		for _, ka := range []bool{false, true} {
			x := res[ka][m]
			a12, p := "", ""
			if m != "handoff" {
				a12 = fmt.Sprintf("%.2f", stats.A12(res[ka]["handoff"], x))
				if mw, err := stats.MannWhitneyU(res[ka]["handoff"], x); err == nil {
					p = fmt.Sprintf("%.2g", mw.P)
				}
			}
			fmt.Fprintf(out, " %.2f | %s | %s |", stats.Median(x), a12, p)
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintln(out)
	return nil
}

// bulk: BulkSize downloads, time and the RR's CPU per GB.
func (b *bench) bulk(ctx context.Context, out io.Writer) error {
	h := b.cfg.Hops[0]
	tm := map[string][]float64{}
	cpu := map[string][]float64{}
	var progNs, progRuns, progBytes float64 // the handoff's translation (eBPF run time)
	if slices.Contains(b.cfg.Modes, "handoff") {
		const knob = "/proc/sys/kernel/bpf_stats_enabled"
		if old, err := os.ReadFile(knob); err == nil && os.WriteFile(knob, []byte("1"), 0) == nil {
			defer os.WriteFile(knob, old, 0)
		}
	}
	b.cur = h
	err := b.w.Do(clientName(h), func() error {
		for r := range b.cfg.BulkRuns {
			order := slices.Clone(b.cfg.Modes)
			rot := r % len(order)
			order = append(order[rot:], order[:rot]...)
			for _, m := range order {
				p := b.procs[m]
				c0 := p.cpu()
				pt0, pc0 := p.progStats()
				s, err := b.one(ctx, m, target(2000, b.cfg.BulkSize), b.cfg.BulkSize)
				if err != nil {
					return fmt.Errorf("bulk %s run %d: %w", m, r, err)
				}
				if m == "handoff" {
					pt1, pc1 := p.progStats()
					progNs += float64(pt1 - pt0)
					progRuns += float64(pc1 - pc0)
					progBytes += float64(b.cfg.BulkSize)
				}
				tm[m] = append(tm[m], s.Total.Seconds())
				cpu[m] = append(cpu[m], (p.cpu()-c0).Seconds()/(float64(b.cfg.BulkSize)/1e9))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "## Bulk: %d B, %s, %d runs per mode\n\n", b.cfg.BulkSize, b.label(h), b.cfg.BulkRuns)
	fmt.Fprintf(out, "| mode | time s (median) | p10-p90 | vs direct | paired vs direct: median (p10-p90) | Mbit/s | RR process CPU s per GB (median, schedstat ns) |\n|---|---|---|---|---|---|---|\n")
	direct := stats.Median(tm["direct"])
	for _, m := range b.cfg.Modes {
		t := stats.Median(tm[m])
		vs, paired := "", ""
		if direct > 0 {
			vs = fmt.Sprintf("%.3f", t/direct)
		}
		if r := pairedRatios(tm[m], tm["direct"]); len(r) > 0 && m != "direct" {
			paired = fmt.Sprintf("%.3f (%.3f-%.3f)", stats.Median(r), stats.Percentile(r, 10), stats.Percentile(r, 90))
		}
		rrcpu := "-"
		if m != "direct" {
			rrcpu = fmt.Sprintf("%.4f", stats.Median(cpu[m]))
			if pc := stats.Median(cpu["proxy"]); pc > 0 && m != "proxy" {
				rrcpu += fmt.Sprintf(" (%.1f%% of proxy)", 100*stats.Median(cpu[m])/pc)
			}
		}
		fmt.Fprintf(out, "| %s | %.3f | %.3f-%.3f | %s | %s | %.0f | %s |\n", m, t, stats.Percentile(tm[m], 10), stats.Percentile(tm[m], 90), vs, paired, float64(b.cfg.BulkSize)*8/t/1e6, rrcpu)
	}
	fmt.Fprintln(out)
	for _, m := range b.cfg.Modes {
		fmt.Fprintf(out, "%s runs (s): %s\n", m, formatRuns(tm[m]))
	}
	fmt.Fprintln(out)
	if progNs > 0 {
		// Goodput per core of translation: the bytes handed off over the
		// time the program ran (kernel.bpf_stats_enabled), both directions'
		// packets (data and ACKs) counted in that time.
		fmt.Fprintf(out, "Handoff translation (xlate's tc programs on rr, both directions, run time from kernel.bpf_stats_enabled): %.4f s per GB, %.1f Gbit/s of response per core of program time; %d program runs, %.0f B of response per run (GRO/GSO aggregates).\n\n",
			progNs/1e9/(progBytes/1e9), progBytes*8/progNs, int64(progRuns), progBytes/max(progRuns, 1))
	}
	return nil
}

// pairedRatios divides each round's time by the reference's time of the
// same round (the modes of a round run back to back, so a change of the
// machine's load between rounds cancels).
func pairedRatios(xs, ref []float64) []float64 {
	var r []float64
	for i := range min(len(xs), len(ref)) {
		if ref[i] > 0 {
			r = append(r, xs[i]/ref[i])
		}
	}
	return r
}

// formatRuns lists times in run order.
func formatRuns(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.3f", x)
	}
	return strings.Join(parts, " ")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
