package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pathcomp/planbench"
	"github.com/mosto-net/mosto/internal/topo"
)

const planUsage = `usage:
  mosto plan --from A --to B --size 500KB [--rtt FILE] [--format F] [--icw 10] [--mss 1460]
             [--end-icw 10 --end-rtt 20]   (pooled, tuned hops (--icw) and fresh end segments)
  mosto plan table [--rtt FILE] [--format F] [--sizes 14KB,450KB,14935KB] [--json] [-o FILE]
  mosto plan eval [flags]      Fig. 2 reproduction (run 'mosto plan eval -h')
  mosto plan bench [--max-n 1000] [--runs 3] [--plain-max-n 246]

Without --rtt the input is the embedded 30-city WonderProxy subset.
Input formats (--format, default by extension .csv/.intra/.gml): ` + topo.Formats + `
Sizes are bytes with an optional unit: 14KB (SI, 1000), 1.5MB, 64KiB, 500.
`

// runPlan dispatches `mosto plan` and its subcommands table, eval and bench.
func runPlan(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "table":
			return runPlanTable(ctx, env, args[1:])
		case "eval":
			return runPlanEval(ctx, env, args[1:])
		case "bench":
			return runPlanBench(ctx, env, args[1:])
		case "help":
			fmt.Fprint(env.Stdout, planUsage)
			return nil
		}
	}
	return runPlanChain(ctx, env, args)
}

// inputFlags are the flags that choose the RTT matrix and the model.
type inputFlags struct {
	rtt, format string
	icw, mss    int
	maxProxies  int
	endICW      int
	endRTT      float64
}

func (in *inputFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&in.rtt, "rtt", "", "network input `file` (RTT matrix CSV, Rocketfuel latencies.intra, Topology Zoo GML); default: embedded WonderProxy subset")
	fs.StringVar(&in.format, "format", "", "input `format`: "+topo.Formats+"; default: by extension")
	fs.IntVar(&in.icw, "icw", 10, "initial congestion window in segments")
	fs.IntVar(&in.mss, "mss", 1460, "maximum segment size in bytes")
	fs.IntVar(&in.endICW, "end-icw", 0, "initial window in segments of the two end segments (client - InP, EgP - origin: fresh connections) when the chain's hops are pooled and tuned (--icw); 0: the ends ramp like the chain (docs/planner.md, per-segment windows)")
	fs.Float64Var(&in.endRTT, "end-rtt", 0, "RTT in `ms` assumed for each end segment (with --end-icw)")
	fs.IntVar(&in.maxProxies, "max-proxies", 0, "at most `N` intermediate proxies per chain (1-14; 0 = unlimited)")
}

// options returns the planner options the flags select.
func (in *inputFlags) options(model pathcomp.Model) (pathcomp.Options, error) {
	if in.maxProxies < 0 || in.maxProxies > 14 {
		return pathcomp.Options{}, usageErrorf("--max-proxies must be 0 (unlimited) to 14, got %d", in.maxProxies)
	}
	return pathcomp.Options{Model: model, MaxProxies: in.maxProxies}, nil
}

func (in *inputFlags) model() (pathcomp.Model, error) {
	if in.icw < 1 || in.mss < 1 {
		return pathcomp.Model{}, usageErrorf("--icw and --mss must be >= 1 (got %d, %d)", in.icw, in.mss)
	}
	if in.endICW < 0 || in.endRTT < 0 || in.endRTT > pathcomp.MaxRTT || in.endRTT != in.endRTT {
		return pathcomp.Model{}, usageErrorf("--end-icw %d, --end-rtt %v: want >= 0 (end rtt at most %v ms)", in.endICW, in.endRTT, float64(pathcomp.MaxRTT))
	}
	if in.endRTT > 0 && in.endICW == 0 {
		return pathcomp.Model{}, usageErrorf("--end-rtt needs --end-icw (the ends' window)")
	}
	return pathcomp.Model{ICW: in.icw, MSS: in.mss, EndICW: in.endICW, EndRTT: in.endRTT}, nil
}

// planned is the chosen matrix (desc describes it) with its fronts
// precomputed under the flags' model.
type planned struct {
	model pathcomp.Model
	m     *topo.Matrix
	desc  string
	f     *pathcomp.Fronts
}

// precompute loads the chosen matrix and precomputes its fronts with the
// options the flags select.
func (in *inputFlags) precompute(env *Env) (planned, error) {
	model, err := in.model()
	if err != nil {
		return planned{}, err
	}
	m, desc, err := in.load(env)
	if err != nil {
		return planned{}, err
	}
	opt, err := in.options(model)
	if err != nil {
		return planned{}, err
	}
	f, err := pathcomp.Precompute(m.RTT, opt)
	if err != nil {
		return planned{}, fmt.Errorf("plan %s: %w", desc, err)
	}
	return planned{model, m, desc, f}, nil
}

// load returns the chosen matrix and a description of it, printing the
// reader's warnings on stderr.
func (in *inputFlags) load(env *Env) (*topo.Matrix, string, error) {
	if in.rtt == "" {
		if in.format != "" {
			return nil, "", usageErrorf("--format needs --rtt")
		}
		m := topo.Default()
		return m, fmt.Sprintf("embedded WonderProxy subset (%d locations)", m.Len()), nil
	}
	m, warnings, err := topo.Load(in.rtt, in.format)
	if err != nil {
		return nil, "", err
	}
	for _, w := range warnings {
		fmt.Fprintf(env.Stderr, "warning: %s\n", w)
	}
	if err := m.Validate(); err != nil {
		return nil, "", fmt.Errorf("%s: %w", in.rtt, err)
	}
	return m, fmt.Sprintf("%s (%d locations)", in.rtt, m.Len()), nil
}

func runPlanChain(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "plan")
	fs.Usage = func() {
		fmt.Fprint(env.Stderr, planUsage+"\nflags of mosto plan:\n")
		fs.PrintDefaults()
	}
	var in inputFlags
	in.register(fs)
	from := fs.String("from", "", "source `location` (the InP side)")
	to := fs.String("to", "", "destination `location` (the EgP side)")
	sizeFlag := fs.String("size", "", "transfer `size`, e.g. 500KB")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q (subcommands: table, eval, bench)", pos[0])
	}
	if *from == "" || *to == "" || *sizeFlag == "" {
		return usageErrorf("--from, --to and --size are required (see mosto plan -h)")
	}
	size, err := pathcomp.ParseSize(*sizeFlag)
	if err != nil {
		return usageErrorf("--size: %v", err)
	}
	p, err := in.precompute(env)
	if err != nil {
		return err
	}
	model, m, desc, f := p.model, p.m, p.desc, p.f
	i, err := findLocation(m.Names, *from)
	if err != nil {
		return err
	}
	j, err := findLocation(m.Names, *to)
	if err != nil {
		return err
	}
	rounds := model.Rounds(size)
	icw := model.ICW
	fmt.Fprintf(env.Stdout, "%s -> %s, %s: %d slow-start rounds (ICW %d x MSS %d)", m.Names[i], m.Names[j], *sizeFlag, rounds, icw, model.MSS)
	if model.EndICW > 0 {
		fmt.Fprintf(env.Stdout, "; ends: %d rounds (ICW %d), %.2f ms each", model.EndRounds(size), model.EndICW, model.EndRTT)
	}
	fmt.Fprintf(env.Stdout, "\ninput: %s\n\n", desc)
	costOf := func(c pathcomp.Chain) float64 {
		if model.EndICW > 0 {
			return model.CostEnds(c, size, model.EndRTT, model.EndRTT)
		}
		return model.Cost(c, rounds)
	}

	type row struct {
		name string
		c    pathcomp.Chain
		ok   bool
	}
	var rows []row
	best, ok := f.Best(i, j, rounds)
	if model.EndICW > 0 {
		best, ok = f.BestEnds(i, j, size, model.EndRTT, model.EndRTT)
	}
	rows = append(rows, row{"mosto", best, ok})
	direct := pathcomp.Chain{Path: []int{i, j}, Sum: m.RTT[i][j], Max: m.RTT[i][j]}
	if i == j {
		direct = pathcomp.Chain{Path: []int{i}}
	}
	rows = append(rows, row{"direct", direct, !math.IsInf(m.RTT[i][j], 1)})
	sp, ok := pathcomp.ShortestPath(m.RTT, i, j)
	rows = append(rows, row{"shortest", sp, ok})
	mm, ok := pathcomp.Minimax(m.RTT, i, j)
	rows = append(rows, row{"minimax", mm, ok})

	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	// With the ends modelled, the whole fetch too: the client's handshake
	// and the request's trip on top of the predicted time (pooled hops and
	// origin connection; pathcomp.Model.FetchChain).
	ends := model.EndICW > 0
	if ends {
		fmt.Fprintln(tw, "chain\tpredicted ms\tvs mosto\tproxies\tsum ms\tmax ms\tfetch ms\tpath")
	} else {
		fmt.Fprintln(tw, "chain\tpredicted ms\tvs mosto\tproxies\tsum ms\tmax ms\tpath")
	}
	for _, r := range rows {
		if !r.ok {
			if ends {
				fmt.Fprint(tw, "-\t")
			}
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tno chain: %s\n", r.name, noChainReason(r.name))
			continue
		}
		cost := costOf(r.c)
		vs := "-"
		if rows[0].ok && r.name != "mosto" {
			if base := costOf(rows[0].c); base > 0 {
				vs = fmt.Sprintf("%+.1f%%", 100*(cost-base)/base)
			}
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%s\t%d\t%.2f\t%.2f\t", r.name, cost, vs, r.c.Proxies(), r.c.Sum, r.c.Max)
		if ends {
			e := model.EndRTT
			fmt.Fprintf(tw, "%.2f\t", model.FetchChain(r.c, size, pathcomp.Segment{RTT: e}, pathcomp.Segment{RTT: e, Open: true}))
		}
		fmt.Fprintf(tw, "%s\n", pathNames(m.Names, r.c.Path))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !rows[0].ok {
		return fmt.Errorf("no chain from %s to %s: they are not connected in %s", m.Names[i], m.Names[j], desc)
	}
	return nil
}

func noChainReason(name string) string {
	if name == "direct" {
		return "no direct link"
	}
	return "not connected"
}

func pathNames(names []string, path []int) string {
	s := make([]string, len(path))
	for k, p := range path {
		s[k] = names[p]
	}
	return strings.Join(s, " > ")
}

// findLocation returns the index of name: an exact match, else the only match
// ignoring case, spaces and punctuation. Otherwise the error lists close
// matches.
func findLocation(names []string, name string) (int, error) {
	for i, n := range names {
		if n == name {
			return i, nil
		}
	}
	key := foldName(name)
	found := -1
	for i, n := range names {
		if foldName(n) == key {
			if found >= 0 {
				found = -2
				break
			}
			found = i
		}
	}
	if found >= 0 {
		return found, nil
	}
	type cand struct {
		name string
		dist int
	}
	var cands []cand
	for _, n := range names {
		fn := foldName(n)
		d := editDistance(key, fn)
		if key != "" && (strings.Contains(fn, key) || strings.Contains(key, fn)) {
			d = 0
		}
		if d <= max(2, len(key)/3) {
			cands = append(cands, cand{n, d})
		}
	}
	sort.SliceStable(cands, func(a, b int) bool { return cands[a].dist < cands[b].dist })
	if len(cands) > 8 {
		cands = cands[:8]
	}
	if len(cands) == 0 {
		if len(names) <= 40 {
			return 0, usageErrorf("unknown location %q; the %d locations are: %s", name, len(names), strings.Join(names, ", "))
		}
		return 0, usageErrorf("unknown location %q and no close match among %d locations ('mosto plan table' lists them)", name, len(names))
	}
	var s []string
	for _, c := range cands {
		s = append(s, c.name)
	}
	return 0, usageErrorf("unknown location %q; close matches: %s", name, strings.Join(s, ", "))
}

func foldName(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func runPlanTable(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "plan table")
	var in inputFlags
	in.register(fs)
	sizesFlag := fs.String("sizes", "14KB,450KB,14935KB", "comma-separated transfer `sizes`; one chain per pair and rounds class")
	asJSON := fs.Bool("json", false, "write the TableFile JSON document (for lookup proxies and the controller)")
	out := fs.String("o", "", "write to `file` instead of standard output")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	var sizes []int64
	for _, s := range strings.Split(*sizesFlag, ",") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		v, err := pathcomp.ParseSize(s)
		if err != nil {
			return usageErrorf("--sizes: %v", err)
		}
		sizes = append(sizes, v)
	}
	if len(sizes) == 0 {
		return usageErrorf("--sizes: no size given")
	}
	p, err := in.precompute(env)
	if err != nil {
		return err
	}
	tf := pathcomp.BuildTable(p.m.Names, p.f, sizes)

	w := env.Stdout
	var file *os.File
	if *out != "" {
		file, err = os.Create(*out)
		if err != nil {
			return fmt.Errorf("plan table: %w", err)
		}
		defer file.Close()
		w = file
	}
	if *asJSON {
		err = writeTableJSON(w, tf)
	} else {
		err = writeTableText(w, tf, p.desc)
	}
	if err != nil {
		return fmt.Errorf("plan table: write: %w", err)
	}
	if file != nil {
		if err := file.Close(); err != nil {
			return fmt.Errorf("plan table: %w", err)
		}
	}
	return nil
}

// writeTableJSON writes tf as one JSON document with one chain per line.
func writeTableJSON(w io.Writer, tf *pathcomp.TableFile) error {
	bw := bufio.NewWriter(w)
	locs, err := json.Marshal(tf.Locations)
	if err != nil {
		return err
	}
	bw.WriteString("{")
	if tf.Version != 0 {
		fmt.Fprintf(bw, "\"version\":%d,\n", tf.Version)
	}
	if tf.ICW != 0 || tf.MSS != 0 {
		fmt.Fprintf(bw, "\"icw\":%d,\"mss\":%d,\n", tf.ICW, tf.MSS)
	}
	if tf.EndICW != 0 {
		fmt.Fprintf(bw, "\"end_icw\":%d,\"end_rtt_ms\":%s,\n", tf.EndICW, strconv.FormatFloat(tf.EndRTTMS, 'f', -1, 64))
	}
	fmt.Fprintf(bw, "\"locations\":%s,\n\"chains\":[", locs)
	for k, c := range tf.Chains {
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		if k > 0 {
			bw.WriteString(",")
		}
		bw.WriteString("\n")
		bw.Write(b)
	}
	bw.WriteString("\n]}\n")
	return bw.Flush()
}

func writeTableText(w io.Writer, tf *pathcomp.TableFile, desc string) error {
	fmt.Fprintf(w, "input: %s; %d chains\n\n", desc, len(tf.Chains))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "from\tto\tsize\trounds\tcost ms\tsum ms\tmax ms\tproxies\tpath")
	for _, c := range tf.Chains {
		rounds := strconv.Itoa(c.Rounds)
		if tf.EndICW > 0 {
			rounds += "/" + strconv.Itoa(c.EndRounds) // chain / ends
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.2f\t%.2f\t%.2f\t%d\t%s\n", c.From, c.To, c.Size, rounds, c.CostMS, c.SumMS, c.MaxMS, max(0, len(c.Path)-2), strings.Join(c.Path, " > "))
	}
	return tw.Flush()
}

func runPlanBench(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "plan bench")
	maxN := fs.Int("max-n", 1000, "largest number of locations to measure (inputs: Rocketfuel maps, WonderProxy subsets 25/50/115/246, synthetic 500/1000)")
	plainMaxN := fs.Int("plain-max-n", 246, "largest n on which the plain (unpruned) program also runs; -1: never")
	runs := fs.Int("runs", 3, "precomputations per input; the fastest is reported")
	seed := fs.Uint64("seed", 1, "seed of the random subsets and synthetic matrices")
	lookups := fs.Int("lookups", 1<<20, "lookups timed per lookup method")
	noRocketfuel := fs.Bool("no-rocketfuel", false, "skip the Rocketfuel maps")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	if *maxN < 1 || *runs < 1 {
		return usageErrorf("--max-n and --runs must be >= 1")
	}
	if *plainMaxN == 0 {
		*plainMaxN = -1
	}
	rep, err := planbench.Run(ctx, planbench.Config{
		MaxN:       *maxN,
		PlainMaxN:  *plainMaxN,
		Runs:       *runs,
		Seed:       *seed,
		Rocketfuel: !*noRocketfuel,
		Lookups:    *lookups,
		Log:        env.Log,
	})
	if err != nil {
		return fmt.Errorf("plan bench: %w", err)
	}
	fmt.Fprintf(env.Stdout, "mosto plan bench: %d CPUs, GOMAXPROCS %d; times are the fastest of %d runs (wall clock, and CPU time of the computing thread)\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), *runs)
	return rep.WriteText(env.Stdout)
}
