package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/offloadbench"
	"github.com/mosto-net/mosto/internal/proxybench"
	"github.com/mosto-net/mosto/internal/report"
)

// runBenchOffload runs `mosto bench offload fig3|veth`.
func runBenchOffload(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || (args[0] != "fig3" && args[0] != "veth") {
		fmt.Fprint(env.Stderr, `usage: mosto bench offload fig3|veth [flags]

  fig3  goodput over time of one flow through a relay offloaded mid-flow (emulator; root)
  veth  direct TCP vs splice relay vs offloaded relay vs HAProxy on veths (root)
`)
		return usageErrorf("want fig3 or veth")
	}
	if args[0] == "veth" {
		return runBenchOffloadVeth(ctx, env, args[1:])
	}
	fs := newFlagSet(env, "bench offload fig3")
	rtts := fs.String("rtt", "50ms,100ms", "end-to-end RTTs (each leg has half)")
	ccs := fs.String("cc", "cubic,bbr", "congestion controls")
	modes := fs.String("modes", "relay,plain,gradual,mosto", "modes: direct (no relay: end-to-end TCP over one link with the whole path's delay, the same rate and queue), relay (never offloaded), plain (offloaded, no mitigation), gradual (seed: 10 ms delay steps), gradual-freeze (gradual, then the frozen early join), probe (window probes at the join), now (probes carrying the reopened windows), mosto (the relay's default policy and handover: wait while a window would limit the joined flow, then the frozen early join, no drain bound), mosto-drain (the policy with the handover of sessions 9-12, offload.handover: drain: the drain bound, then as now), mosto-nobound (mosto-drain without the drain bound), mosto-tail (mosto-drain with the early join: xlate.Config.Tail), mosto-raise (mosto-tail with the join's probes offering the other peer's free window), mosto-freeze (mosto-tail with the handover's window edge frozen by the program: xlate.Config.Freeze), now-freeze (offloaded at once with the early join and the frozen edge), mosto-freeze-nobound (mosto-freeze without the drain bound)")
	dur := fs.Duration("duration", 8*time.Second, "flow duration")
	at := fs.Duration("at", 4*time.Second, "offload time")
	rate := fs.Float64("rate", 200, "rate of both links, Mbit/s (0: unlimited)")
	queue := fs.Float64("queue-ms", 20, "queue of both links, ms at rate")
	loss := fs.Float64("loss", 0, "random loss on both links each way, percent")
	verbose := fs.Bool("v", false, "print every trace")
	traceSender := fs.Bool("trace-sender", false, "print peer2's TCP_INFO (cwnd, window, limits) at every interval")
	stepEvery := fs.Duration("step-every", 0, "modes gradual and gradual-freeze: time between two 10 ms delay steps (0: 1.5 RTTs)")
	drainPace := fs.Float64("drain-pace", 0, "modes with the frozen edge: cap the relay's out-leg pacing at this fraction of its rate during the handover (xlate.Config.DrainPace; 0: the mode's own, -1: off)")
	preDrain := fs.Float64("pre-drain", 0, "modes with the frozen edge: first drain the relay's backlog toward the receiver down to this many in-leg RTTs of the flow (xlate.Config.PreDrain; 0: the mode's own, -1: off)")
	firstRound := fs.Float64("first-round", 0, "modes with the frozen edge: cap the window the join offers the stopped sender at this fraction of the joined BDP (xlate.Config.FirstRound; 0: off)")
	svg := fs.String("svg", "", "write the goodput traces as SVG, one file per RTT and cc: PREFIX-<rtt>-<cc>.svg")
	pos, err := parseFlags(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *at <= 0 || *at >= *dur {
		return usageErrorf("-at must be inside (0, -duration)")
	}
	tab := report.Table{Header: []string{"RTT", "cc", "mode", "pre-offload Mbit/s", "after Mbit/s", "worst 100 ms / pre", "RTOs", "retrans", "waited (held by)", "handover", "stopped / quiet / joined", "longest stall"},
		Align: []report.Align{report.Right, report.Left, report.Left, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right}}
	plots := map[string]*report.Plot{}
	var order []string
	for _, rs := range strings.Split(*rtts, ",") {
		rtt, err := time.ParseDuration(strings.TrimSpace(rs))
		if err != nil || rtt <= 0 {
			return usageErrorf("-rtt %q: want durations", *rtts)
		}
		for _, cc := range strings.Split(*ccs, ",") {
			for _, mode := range strings.Split(*modes, ",") {
				cfg := offloadbench.Fig3Config{RTT: rtt, CC: strings.TrimSpace(cc), Mode: strings.TrimSpace(mode),
					Duration: *dur, OffloadAt: *at, RateMbit: *rate, QueueMS: *queue, LossPct: *loss, TraceSender: *traceSender, StepEvery: *stepEvery, DrainPace: *drainPace, FirstRound: *firstRound, PreDrain: *preDrain, Log: env.Log}
				tr, err := offloadbench.RunFig3(ctx, cfg)
				if err != nil {
					return fmt.Errorf("fig3 %v %s %s: %w", rtt, cc, mode, err)
				}
				if *verbose {
					fmt.Fprintf(env.Stderr, "%v %s %s:", rtt, cfg.CC, cfg.Mode)
					for i, v := range tr.Mbps {
						if i == tr.OffloadIdx {
							fmt.Fprint(env.Stderr, " |")
						}
						fmt.Fprintf(env.Stderr, " %.0f", v)
					}
					fmt.Fprintln(env.Stderr)
				}
				if *traceSender {
					fmt.Fprintf(env.Stderr, "%v %s %s: sender per interval (t ms: state cwnd/ssthresh segs, srtt ms, in flight segs, peer window KB, not sent KB, retrans, rwnd-/sndbuf-limited/busy ms in the interval, pacing/delivery Mbit/s)\n", rtt, cfg.CC, cfg.Mode)
					var prev offloadbench.SenderSample
					for i, x := range tr.Sender {
						ms := func(d time.Duration) int64 { return d.Milliseconds() }
						mark := ""
						if i == tr.OffloadIdx {
							mark = " |"
						}
						fmt.Fprintf(env.Stderr, "  %5d%s: %d %d/%d %d %d %d %d %d %d/%d/%d %.0f/%.0f\n", (i+1)*int(tr.Cfg.Interval/time.Millisecond), mark,
							x.CaState, x.Cwnd, x.Ssthresh, ms(x.SRTT), x.Unacked, x.SndWnd>>10, x.NotSent>>10, x.Retrans,
							ms(x.RwndLimited-prev.RwndLimited), ms(x.SndbufLimited-prev.SndbufLimited), ms(x.Busy-prev.Busy),
							float64(x.PacingRate)*8/1e6, float64(x.DeliveryRate)*8/1e6)
						prev = x
					}
				}
				rtos := fmt.Sprint(tr.RTOs)
				if tr.RTOs < 0 {
					rtos = "?"
				}
				ho := "-"
				if tr.Handover > 0 {
					ho = tr.Handover.Round(time.Millisecond).String()
				}
				phases := "-"
				if tr.Phases.Joined > 0 {
					ms := func(d time.Duration) string { return fmt.Sprint(d.Milliseconds()) }
					phases = fmt.Sprintf("%s / %s / %s ms (%d)", ms(tr.Phases.Stopped), ms(tr.Phases.Quiet), ms(tr.Phases.Joined), tr.Phases.Attempts)
					if tr.Phases.PreDrain > 0 {
						phases += fmt.Sprintf(", pre-drain %s ms", ms(tr.Phases.PreDrain))
					}
					if tr.Phases.Tail > 0 {
						phases += fmt.Sprintf(", tail %s ms", ms(tr.Phases.Tail))
					}
					if tr.HeldDrops > 0 {
						phases += fmt.Sprintf(", %d held", tr.HeldDrops)
					}
					phases += fmt.Sprintf(", qdrops %d + %d after (1 s before: %d; in-leg %d)", tr.QueueDrops, tr.QueueDropsAfter, tr.QueueDropsPre, tr.QueueDropsIn)
				}
				waited := "-"
				if _, ok := offloadbench.PolicyConfig(cfg.Mode); ok {
					waited = tr.Waited.Round(time.Millisecond).String()
					if tr.Held != "" {
						waited += " (" + tr.Held + ", not offloaded)"
					}
				}
				tab.AddRow(rtt.String(), cfg.CC, cfg.Mode, fmt.Sprintf("%.0f", tr.Pre), fmt.Sprintf("%.0f", tr.Post), fmt.Sprintf("%.2f", tr.MinRatio), rtos, fmt.Sprint(tr.Retrans), waited, ho, phases, tr.MaxGap.Round(time.Millisecond).String())
				key := fmt.Sprintf("%v %s", rtt, cfg.CC)
				p, ok := plots[key]
				if !ok {
					p = &report.Plot{Title: fmt.Sprintf("Goodput at peer1, %v RTT split in half, %s, offload at %v", rtt, cfg.CC, *at),
						XLabel: "time (s)", YLabel: "goodput (Mbit/s, 100 ms)"}
					plots[key] = p
					order = append(order, key)
				}
				s := report.Series{Name: cfg.Mode}
				for i, v := range tr.Mbps {
					s.Points = append(s.Points, report.Point{X: float64(i+1) * cfg.Interval.Seconds(), Y: v})
				}
				if cfg.Interval == 0 {
					s.Points = s.Points[:0]
					for i, v := range tr.Mbps {
						s.Points = append(s.Points, report.Point{X: float64(i+1) / 10, Y: v})
					}
				}
				p.Series = append(p.Series, s)
			}
		}
	}
	fmt.Fprintf(env.Stdout, "Fig. 3: one flow peer2 -> relay -> peer1, links %.0f Mbit/s, queue %.0f ms, loss %g%%, offload at %v of %v\n\n", *rate, *queue, *loss, *at, *dur)
	if err := tab.WriteMarkdown(env.Stdout); err != nil {
		return err
	}
	if *svg != "" {
		for _, key := range order {
			name := strings.TrimSuffix(*svg, ".svg") + "-" + strings.NewReplacer(" ", "-").Replace(key) + ".svg"
			f, err := os.Create(name)
			if err != nil {
				return err
			}
			err = plots[key].WriteSVG(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "\nwrote %s (%s)\n", name, key)
		}
	}
	return nil
}

func runBenchOffloadVeth(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "bench offload veth")
	modes := fs.String("modes", "direct,splice,offload,haproxy,nginx", "modes: direct (routed), splice (mosto proxy), offload (mosto proxy, offload after 1 MB), haproxy and nginx (tuned as in bench proxy)")
	threads := fs.Int("threads", 0, "threads of every relay: mosto's GOMAXPROCS, HAProxy's nbthread, nginx's workers (default: one per CPU)")
	dur := fs.Duration("duration", 5*time.Second, "iperf3 time per mode")
	streams := fs.Int("streams", 1, "parallel flows")
	rounds := fs.Int("rounds", 1, "rounds of all modes, interleaved (round k starts with the k-th mode)")
	hops := fs.Int("hops", 1, "relays in the chain (each offloads its own flow; direct is routed through the same namespaces)")
	mosto := fs.String("mosto", "", "mosto binary (default: this executable)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 || *dur < time.Second || *streams < 1 || *rounds < 1 || *hops < 1 || *hops > 8 {
		return usageErrorf("want -duration >= 1s, -streams >= 1, -rounds >= 1, -hops 1-8, no arguments")
	}
	if *mosto == "" {
		if *mosto, err = os.Executable(); err != nil {
			return err
		}
	}
	hap, _ := exec.LookPath("haproxy")
	ngx, _ := exec.LookPath("nginx")
	mod := ""
	if _, err := os.Stat(proxybench.DebianStreamModule); err == nil {
		mod = proxybench.DebianStreamModule
	}
	tab := report.Table{Header: []string{"round", "mode", "Gbit/s", "vs direct", "vs best peer", "relay CPU s/GB", "eBPF s/GB", "total s/GB", "vs best peer", "joined per relay"},
		Align: []report.Align{report.Right, report.Left, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Right, report.Left}}
	ms := strings.Split(*modes, ",")
	for round := 1; round <= *rounds; round++ {
		// Round k starts with the k-th mode, so no mode always follows
		// the same one.
		k := (round - 1) % len(ms)
		order := append(slices.Clone(ms[k:]), ms[:k]...)
		res, err := offloadbench.RunVeth(ctx, offloadbench.VethConfig{Mosto: *mosto, HAProxy: hap, Nginx: ngx, NginxMod: mod, Threads: *threads, Duration: *dur, Streams: *streams, Hops: *hops, Modes: order})
		if err != nil {
			return err
		}
		// The best tuned peer of the round, per figure: the most Gbit/s,
		// the least CPU per GB.
		direct, peerGbps, peerCPU := 0.0, 0.0, 0.0
		for _, r := range res {
			if r.Err != nil || r.Bytes <= 0 {
				continue
			}
			if r.Mode == offloadbench.VethDirect {
				direct = r.Gbps
			}
			if offloadbench.IsVethPeer(r.Mode) {
				peerGbps = max(peerGbps, r.Gbps)
				if c := (r.RelayCPU + r.ProgCPU).Seconds() / (float64(r.Bytes) / 1e9); peerCPU == 0 || c < peerCPU {
					peerCPU = c
				}
			}
		}
		for _, r := range res {
			if r.Err != nil {
				tab.AddRow(fmt.Sprint(round), r.Mode, "error: "+r.Err.Error())
				continue
			}
			ratio := "-"
			if direct > 0 {
				ratio = fmt.Sprintf("%.2f", r.Gbps/direct)
			}
			gb := float64(r.Bytes) / 1e9
			total := (r.RelayCPU + r.ProgCPU).Seconds() / gb
			vsGbps, vsCPU := "-", "-"
			if peerGbps > 0 && r.Mode != offloadbench.VethDirect {
				vsGbps = fmt.Sprintf("%.2fx", r.Gbps/peerGbps)
			}
			if peerCPU > 0 && r.Mode != offloadbench.VethDirect {
				vsCPU = fmt.Sprintf("%.2fx", total/peerCPU)
			}
			joined := "-"
			if r.Joined != nil {
				js := make([]string, len(r.Joined))
				for i, j := range r.Joined {
					js[i] = fmt.Sprint(j)
					if j < 0 {
						js[i] = "?"
					}
				}
				joined = strings.Join(js, "/")
			}
			tab.AddRow(fmt.Sprint(round), r.Mode, fmt.Sprintf("%.2f", r.Gbps), ratio, vsGbps,
				fmt.Sprintf("%.3f", r.RelayCPU.Seconds()/gb), fmt.Sprintf("%.4f", r.ProgCPU.Seconds()/gb), fmt.Sprintf("%.3f", total), vsCPU, joined)
		}
	}
	fmt.Fprintf(env.Stdout, "peer2 -> %d relay(s) -> peer1 over veths, iperf3 -R, %d flow(s), %v per mode; relay CPU (with child processes) and eBPF summed over all relays; vs best peer: to the better tuned peer (haproxy, nginx) of the same round, Gbit/s and total CPU per GB each\n\n", *hops, *streams, *dur)
	return tab.WriteMarkdown(env.Stdout)
}
