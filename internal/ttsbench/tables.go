package ttsbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/intercept"
)

// TableResult holds the seed-table samples: Times[cc][row][mode] in
// seconds, and failed transfers per (cc, row, mode).
type TableResult struct {
	Size   int64
	Rows   []Row
	CCs    []string
	Modes  []Mode
	Sample map[key][]float64
	Failed map[key]int
	Load   string // load average before and after
}

type key struct {
	CC   string
	Row  int
	Mode Mode
}

// tableSpec is the seed's topology: client - relay - server, the pair
// client-server routed through the relay.
func tableSpec(r Row, cc string, cfg *Config) *emu.Spec {
	l1, l2 := r.link(cfg, true), r.link(cfg, false)
	spec := &emu.Spec{
		Name:   "tts",
		Hosts:  []emu.HostSpec{{Name: "c"}, {Name: "r1"}, {Name: "s"}},
		Routes: []emu.RouteSpec{{From: "c", To: "s", Via: []string{"r1"}}},
		TCP:    emu.TCP{Congestion: cc},
	}
	for _, e := range []struct {
		a, b string
		l    emu.Link
	}{{"c", "r1", l1}, {"r1", "s", l2}} {
		ls := linkSpec(e.a, e.b, e.l.DelayMS, e.l.JitterMS, e.l.LossPct, e.l.RateMbit, e.l.JitterGSO)
		ls.LimitPkts = &e.l.LimitPkts
		spec.Links = append(spec.Links, ls)
	}
	return spec
}

// link is the row's first (client - relay) or second link.
func (r Row) link(cfg *Config, first bool) emu.Link {
	l := emu.Link{DelayMS: r.D2, JitterMS: r.J2, LossPct: r.L2, RateMbit: cfg.RateMbit, QueuePkts: netemLimit, Reorder: true, JitterGSO: cfg.JitterGSO}
	if first {
		l.DelayMS, l.JitterMS, l.LossPct = r.D1, r.J1, r.L1
	}
	if cfg.NetemLimit {
		l.LimitPkts = netemLimit
	}
	return l
}

// netemLimit is netem's default limit (packets), Mininet's TCLink queue.
const netemLimit = 1000

// RunTables runs the seed's rows: for every congestion control
// cfg.Parallel worlds at once (one by default), each running the rows one
// after another (links changed in place) with its share of the trials,
// modes interleaved in a random order per trial.
func RunTables(ctx context.Context, cfg Config) (*TableResult, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	res := &TableResult{Size: cfg.Size, Rows: cfg.Rows, CCs: cfg.CCs, Modes: cfg.Modes, Sample: map[key][]float64{}, Failed: map[key]int{}}
	tl, err := openTrialLog(filepath.Join(cfg.Dir, TrialsFile))
	if err != nil {
		return nil, err
	}
	defer tl.close()
	if k := cfg.Parallel; k > 1 {
		// emu.Up raises GOMAXPROCS for one world's locked threads (a
		// reader and a delivery thread per host); k worlds need k times
		// as many, or waking threads wait for a P.
		if want := runtime.NumCPU() + 2*3*k; runtime.GOMAXPROCS(0) < want {
			runtime.GOMAXPROCS(want)
		}
		cfg.Progress = &lockedWriter{w: cfg.Progress}
	}
	var mu sync.Mutex // guards res
	for _, cc := range cfg.CCs {
		ctx, cancel := context.WithCancel(ctx)
		errs := make([]error, cfg.Parallel)
		var wg sync.WaitGroup
		for wi := range cfg.Parallel {
			wg.Go(func() {
				errs[wi] = runTablesCC(ctx, &cfg, cc, wi, res, &mu, tl)
				if errs[wi] != nil {
					cancel() // one world failed: stop the others
				}
			})
		}
		wg.Wait()
		cancel()
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
	}
	return res, nil
}

// lockedWriter serializes the progress lines of parallel worlds.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// runTablesCC runs world wi of cfg.Parallel: trials wi+1, wi+1+Parallel, ...
// of every row.
func runTablesCC(ctx context.Context, cfg *Config, cc string, wi int, res *TableResult, mu *sync.Mutex, tl *trialLog) error {
	w, err := emu.UpWith(ctx, tableSpec(cfg.Rows[0], cc, cfg), cfg.Log, emu.UpOptions{Realtime: cfg.Realtime})
	if err != nil {
		return err
	}
	l := &lab{cfg: cfg, w: w, size: cfg.Size}
	defer l.close()
	if err := l.sysctls(ctx); err != nil {
		return err
	}
	for _, p := range []uint16{portTTS, portDirect, portPEPsal} {
		if err := l.serve(ctx, p); err != nil {
			return err
		}
	}
	bdpPorts := map[Mode]uint16{}
	for _, m := range cfg.Modes {
		if _, ok := m.BDPGain(); ok {
			bdpPorts[m] = portBDP + uint16(len(bdpPorts))
			if err := l.serve(ctx, bdpPorts[m]); err != nil {
				return err
			}
		}
	}
	if slices.Contains(cfg.Modes, PEPsal) {
		if err := l.pepsal(ctx, "r1"); err != nil {
			return err
		}
	}
	s := w.Addr("s")
	split := [2]netip.AddrPort{netip.AddrPortFrom(w.Addr("r1"), portSplit), netip.AddrPortFrom(s, portDirect)}
	relayCC := cc
	if cfg.RelayCC != "" {
		relayCC = cfg.RelayCC
	}
	if err := l.proxy(ctx, "r1", proxyConf("r1", []int{portTTS}, &split, relayCC, cfg), split[0]); err != nil {
		return err
	}
	for _, m := range cfg.Modes {
		if err := l.bdpProxy(ctx, m, bdpPorts[m], relayCC); err != nil {
			return err
		}
	}
	target := map[Mode]netip.AddrPort{
		E2E:    netip.AddrPortFrom(s, portDirect),
		TTS:    netip.AddrPortFrom(s, portTTS),
		Split:  split[0],
		PEPsal: netip.AddrPortFrom(s, portPEPsal),
	}
	for m, p := range bdpPorts {
		target[m] = netip.AddrPortFrom(s, p)
	}
	seed := rand.Uint64()
	order := rand.New(rand.NewPCG(seed, seed>>1))
	setup := cfg.setup()
	world := ""
	if cfg.Parallel > 1 {
		world = fmt.Sprintf(" world %d/%d", wi+1, cfg.Parallel)
	}
	for ri, row := range cfg.Rows {
		if err := w.SetLink("c", "r1", row.link(cfg, true)); err != nil {
			return err
		}
		if err := w.SetLink("r1", "s", row.link(cfg, false)); err != nil {
			return err
		}
		start := time.Now()
		n := 0
		for trial := wi; trial < cfg.Trials; trial += cfg.Parallel {
			n++
			var line strings.Builder
			fmt.Fprintf(&line, "tables: %s %s trial %d%s:", cc, row.Name, trial+1, world)
			for _, m := range shuffledWith(order, cfg.Modes) {
				if err := ctx.Err(); err != nil {
					return err
				}
				k0 := l.kernelSnapshot(ctx)
				late0 := w.Lateness()
				d, err := l.fetch(ctx, target[m])
				late := w.Lateness().Sub(late0)
				kd := kernelDelta(k0, l.kernelSnapshot(ctx))
				k := key{cc, ri, m}
				rec := Trial{UTC: time.Now().UTC(), Run: w.RunID(), World: "tables", Setup: setup, CC: cc, Row: row.spec(), Mode: m, Size: cfg.Size, Trial: trial + 1, Seed: seed, Load: loadAvg(),
					Parallel: cfg.Parallel, Emu: emuLate(late), Kernel: kd}
				if err != nil && ctx.Err() != nil {
					return ctx.Err() // stopped (another world failed): not a failed transfer
				}
				mu.Lock()
				if err != nil {
					res.Failed[k]++
				} else {
					res.Sample[k] = append(res.Sample[k], secs(d))
				}
				mu.Unlock()
				if err != nil {
					cfg.Log.Warn("transfer failed", "cc", cc, "row", row.Name, "mode", m, "err", err)
					fmt.Fprintf(&line, " %s failed", m)
					rec.Err = err.Error()
				} else {
					fmt.Fprintf(&line, " %s %.3f s", m, secs(d))
					rec.Secs = secs(d)
				}
				if err := tl.add(rec); err != nil {
					return err
				}
			}
			fmt.Fprintln(cfg.Progress, line.String())
		}
		fmt.Fprintf(cfg.Progress, "tables: %s %-16s %d trials%s in %v\n", cc, row.Name, n, world, time.Since(start).Round(time.Second))
	}
	return nil
}

// emuLate summarizes the emulator's lateness over one transfer.
func emuLate(l emu.Lateness) *EmuLate {
	if l.Packets == 0 {
		return nil
	}
	n := float64(l.Packets)
	return &EmuLate{Packets: l.Packets, Over500us: float64(l.Over500us) / n, Over2ms: float64(l.Over2ms) / n, MeanUs: float64(l.SumNs) / n / 1e3}
}

// bdpProxy starts the second proxy of mode m (tts-bdpG; nothing for the
// other modes) in r1: a tproxy entry with the first one's settings plus
// window_bdp: G, intercepting server port port, and waits until its rules
// are installed.
func (l *lab) bdpProxy(ctx context.Context, m Mode, port uint16, cc string) error {
	g, ok := m.BDPGain()
	if !ok {
		return nil
	}
	i := int(port - portBDP)
	id := fmt.Sprintf("r1bdp%d", i)
	x := extraTProxy{listen: portBDPTP + uint16(i), mark: bdpMark + 2*i, table: bdpTable + 2*i, windowBDP: g}
	if err := l.proxy(ctx, "r1", proxyConfWith(id, []int{int(port)}, nil, cc, l.cfg, x), netip.AddrPortFrom(l.w.Addr("r1"), x.listen)); err != nil {
		return err
	}
	// Its listener accepts before Run installs the rules: wait for them.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ts, err := intercept.Tables(ctx, l.w.NetNS("r1"))
		if err == nil && slices.Contains(ts, "mosto_tp_"+id) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ttsbench: proxy %s installed no rules in 30 s (tables %v, %v)", id, ts, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
