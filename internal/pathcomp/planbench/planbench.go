package planbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/topo"
)

// Config selects what Run measures.
type Config struct {
	MaxN       int    // largest n measured (inputs above it are skipped); 0 means 1000
	PlainMaxN  int    // largest n on which the plain program also runs; 0 means 246, < 0 never
	Runs       int    // precomputations per input, the fastest is reported; 0 means 3
	Seed       uint64 // for the random subsets and synthetic matrices
	Rocketfuel bool   // include the embedded Rocketfuel maps
	Lookups    int    // lookups timed per method; 0 means 1<<20
	Log        *slog.Logger
}

// Input is one matrix to measure.
type Input struct {
	Name string
	RTT  [][]float64
}

// Timing is the fastest of several runs of one program on one input.
type Timing struct {
	Wall, CPU time.Duration
	AllocMiB  float64 // bytes allocated by the fastest run
}

// Row is the measurement of one input.
type Row struct {
	Name           string
	N, Links       int
	Pruned         Timing
	Plain          *Timing // nil when not run
	EntriesPerPair float64
	FrontMiB       float64 // memory retained by the fronts
}

// Ratio returns plain/pruned thread CPU time (wall time if no CPU time was
// measured), or 0 when the plain program did not run.
func (r Row) Ratio() float64 {
	switch {
	case r.Plain == nil:
		return 0
	case r.Pruned.CPU > 0 && r.Plain.CPU > 0:
		return float64(r.Plain.CPU) / float64(r.Pruned.CPU)
	case r.Pruned.Wall > 0:
		return float64(r.Plain.Wall) / float64(r.Pruned.Wall)
	}
	return 0
}

// Report is the result of Run.
type Report struct {
	Rows        []Row
	LookupN     int
	BestNs      float64 // Fronts.BestAppend with path reconstruction, ns per call
	BestCPUNs   float64 // the same in thread CPU time
	BestAllocs  float64 // allocations per BestAppend call
	IndexCPUNs  float64
	IndexNs     float64 // TableFile Index.Lookup, ns per call
	IndexAllocs float64
}

func (c *Config) defaults() {
	if c.MaxN == 0 {
		c.MaxN = 1000
	}
	if c.PlainMaxN == 0 {
		c.PlainMaxN = 246
	}
	if c.Runs <= 0 {
		c.Runs = 3
	}
	if c.Lookups <= 0 {
		c.Lookups = 1 << 20
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Inputs returns the benchmark inputs for cfg: the Rocketfuel maps (router
// and city level), random subsets of n = 25, 50, 115 and the whole
// 246-city WonderProxy matrix, and, for n = 500 and 1000, the WonderProxy
// matrix grown by jittered copies (pathcomp.JitteredCopies) and synthetic
// great-circle matrices (pathcomp.SyntheticRTT), up to cfg.MaxN.
func Inputs(cfg Config) ([]Input, error) {
	cfg.defaults()
	var ins []Input
	if cfg.Rocketfuel {
		for _, as := range topo.RocketfuelASes() {
			for _, cities := range []bool{true, false} {
				m, err := topo.Rocketfuel(as, cities)
				if err != nil {
					return nil, err
				}
				level := "routers"
				if cities {
					level = "cities"
				}
				if m.Len() <= cfg.MaxN {
					ins = append(ins, Input{fmt.Sprintf("rocketfuel AS%s %s", as, level), m.RTT})
				}
			}
		}
	}
	wp := topo.WonderProxy()
	rng := rand.New(rand.NewPCG(cfg.Seed, 246))
	for _, n := range []int{25, 50, 115, wp.Len()} {
		if n > cfg.MaxN || n > wp.Len() {
			continue
		}
		names := slices.Clone(wp.Names)
		rng.Shuffle(len(names), func(a, b int) { names[a], names[b] = names[b], names[a] })
		sub, err := wp.Subset(names[:n])
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("wonderproxy random %d", n)
		if n == wp.Len() {
			name = fmt.Sprintf("wonderproxy all %d", n)
		}
		ins = append(ins, Input{name, sub.RTT})
	}
	for _, n := range []int{500, 1000} {
		if n <= cfg.MaxN {
			ins = append(ins, Input{fmt.Sprintf("wonderproxy jittered %d", n), pathcomp.JitteredCopies(wp.RTT, n, cfg.Seed+uint64(n))})
		}
	}
	for _, n := range []int{500, 1000} {
		if n <= cfg.MaxN {
			ins = append(ins, Input{fmt.Sprintf("synthetic great-circle %d", n), pathcomp.SyntheticRTT(n, cfg.Seed+uint64(n))})
		}
	}
	return ins, nil
}

// Run measures every input of cfg and the lookup cost.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	ins, err := Inputs(cfg)
	if err != nil {
		return nil, err
	}
	rep := &Report{}
	for _, in := range ins {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		row, err := Measure(ctx, in, cfg)
		if err != nil {
			return nil, err
		}
		cfg.Log.Info("measured", "input", in.Name, "n", row.N, "pruned", row.Pruned.Wall)
		rep.Rows = append(rep.Rows, row)
	}
	if err := measureLookup(rep, cfg); err != nil {
		return nil, err
	}
	return rep, nil
}

// Measure times the precomputation of one input, pruned and (if n <=
// cfg.PlainMaxN) plain.
func Measure(ctx context.Context, in Input, cfg Config) (Row, error) {
	cfg.defaults()
	n := len(in.RTT)
	row := Row{Name: in.Name, N: n}
	f, t, err := timePrecompute(ctx, in.RTT, pathcomp.Options{}, cfg.Runs)
	if err != nil {
		return Row{}, fmt.Errorf("%s: %w", in.Name, err)
	}
	row.Pruned = t
	row.Links = f.Links()
	if pairs := n * (n - 1) / 2; pairs > 0 {
		row.EntriesPerPair = float64(f.Entries()) / float64(pairs)
	}
	row.FrontMiB = float64(f.Bytes()) / (1 << 20)
	if n <= cfg.PlainMaxN {
		_, pt, err := timePrecompute(ctx, in.RTT, pathcomp.Options{Plain: true}, cfg.Runs)
		if err != nil {
			return Row{}, fmt.Errorf("%s plain: %w", in.Name, err)
		}
		row.Plain = &pt
	}
	return row, nil
}

func timePrecompute(ctx context.Context, rtt [][]float64, opt pathcomp.Options, runs int) (*pathcomp.Fronts, Timing, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var best Timing
	var f *pathcomp.Fronts
	for r := 0; r < runs; r++ {
		if err := ctx.Err(); err != nil {
			return nil, Timing{}, err
		}
		f = nil
		runtime.GC()
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		cpu0 := threadCPU()
		t0 := time.Now()
		var err error
		f, err = pathcomp.Precompute(rtt, opt)
		wall := time.Since(t0)
		cpu := threadCPU() - cpu0
		runtime.ReadMemStats(&ms1)
		if err != nil {
			return nil, Timing{}, err
		}
		if r == 0 || wall < best.Wall {
			best = Timing{Wall: wall, CPU: cpu, AllocMiB: float64(ms1.TotalAlloc-ms0.TotalAlloc) / (1 << 20)}
		}
	}
	return f, best, nil
}

// threadCPU returns the CPU time of the calling OS thread
// (CLOCK_THREAD_CPUTIME_ID, nanosecond resolution).
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// measureLookup times Fronts.BestAppend on the WonderProxy matrix and
// Index.Lookup on a table built from it.
func measureLookup(rep *Report, cfg Config) error {
	wp := topo.WonderProxy()
	n := wp.Len()
	f, err := pathcomp.Precompute(wp.RTT, pathcomp.Options{})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	calls := cfg.Lookups
	type q struct{ i, j, r int }
	qs := make([]q, 4096)
	for k := range qs {
		qs[k] = q{rng.IntN(n), rng.IntN(n), 1 + rng.IntN(12)}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]int, 0, n)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	c0 := threadCPU()
	t0 := time.Now()
	sink := 0
	for k := 0; k < calls; k++ {
		x := qs[k&4095]
		c, _ := f.BestAppend(buf, x.i, x.j, x.r)
		sink += len(c.Path)
	}
	el := time.Since(t0)
	rep.BestCPUNs = float64((threadCPU() - c0).Nanoseconds()) / float64(calls)
	runtime.ReadMemStats(&ms1)
	rep.LookupN = n
	rep.BestNs = float64(el.Nanoseconds()) / float64(calls)
	rep.BestAllocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(calls)

	sizes := []int64{14_000, 450_000, 14_935_000}
	ix, err := pathcomp.NewIndex(pathcomp.BuildTable(wp.Names, f, sizes))
	if err != nil {
		return err
	}
	type lq struct {
		from, to string
		size     int64
	}
	lqs := make([]lq, 4096)
	for k := range lqs {
		lqs[k] = lq{wp.Names[rng.IntN(n)], wp.Names[rng.IntN(n)], sizes[rng.IntN(3)]}
	}
	runtime.ReadMemStats(&ms0)
	c0 = threadCPU()
	t0 = time.Now()
	for k := 0; k < calls; k++ {
		x := lqs[k&4095]
		e, _ := ix.Lookup(x.from, x.to, x.size)
		sink += e.Rounds
	}
	el = time.Since(t0)
	rep.IndexCPUNs = float64((threadCPU() - c0).Nanoseconds()) / float64(calls)
	runtime.ReadMemStats(&ms1)
	rep.IndexNs = float64(el.Nanoseconds()) / float64(calls)
	rep.IndexAllocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(calls)
	if sink < 0 {
		return fmt.Errorf("unreachable")
	}
	return nil
}

// WriteText writes rep as a table.
func (rep *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "input\tn\tlinks\tpruned ms\tcpu ms\tplain ms\tcpu ms\tplain/pruned\tentries/pair\tfronts MiB\talloc MiB\t")
	for _, r := range rep.Rows {
		plain, plainCPU, ratio := "-", "-", "-"
		if r.Plain != nil {
			plain, plainCPU, ratio = ms(r.Plain.Wall), ms(r.Plain.CPU), fmt.Sprintf("%.1fx", r.Ratio())
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.1f\t\n", r.Name, r.N, r.Links,
			ms(r.Pruned.Wall), ms(r.Pruned.CPU), plain, plainCPU, ratio, r.EntriesPerPair, r.FrontMiB, r.Pruned.AllocMiB)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nlookup on %d locations, random pairs and sizes:\n  Index.Lookup (table file, as proxies use it)  %.0f ns/op wall, %.0f ns/op cpu, %.2f allocs/op\n  Fronts.BestAppend (cost scan + path rebuild)  %.0f ns/op wall, %.0f ns/op cpu, %.2f allocs/op\n",
		rep.LookupN, rep.IndexNs, rep.IndexCPUNs, rep.IndexAllocs, rep.BestNs, rep.BestCPUNs, rep.BestAllocs)
	return err
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
