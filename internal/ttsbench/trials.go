package ttsbench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// TrialsFile is the name of the per-transfer results file RunTables writes
// in Config.Dir: one JSON object (a Trial) per line, appended as each
// transfer ends, so an interrupted run keeps what it measured and runs of
// several sessions can be pooled into one table (MergeTrials).
const TrialsFile = "trials.jsonl"

// Trial is one transfer of the seed's tables.
type Trial struct {
	UTC   time.Time `json:"utc"`   // when the transfer ended
	Run   string    `json:"run"`   // the emulated world's run id
	World string    `json:"world"` // "tables" (c - r1 - s)
	// Setup is everything of the world that is not the row, the
	// congestion control or the mode (rate, sysctls, relay options):
	// only trials with the same setup and size are pooled.
	Setup string  `json:"setup"`
	CC    string  `json:"cc"`
	Row   RowSpec `json:"row"`
	Mode  Mode    `json:"mode"`
	Size  int64   `json:"size"`
	Trial int     `json:"trial"` // 1-based, within the run
	// Seed is the seed of the run's mode order (the emulator's loss and
	// jitter draws are seeded from the clock).
	Seed uint64     `json:"seed"`
	Secs float64    `json:"secs,omitempty"` // time to the last byte; 0 when it failed
	Err  string     `json:"err,omitempty"`  // why the transfer failed
	Load [3]float64 `json:"load"`           // load average (1, 5, 15 min) when it ended
	// Parallel is how many worlds ran transfers at once in the run (0 in
	// runs before it was recorded: those ran one world).
	Parallel int `json:"parallel,omitempty"`
	// Emu is how late the world's emulator delivered packets during the
	// transfer (nil in runs before it was recorded).
	Emu *EmuLate `json:"emu,omitempty"`
	// Kernel is the change of TCP counters (kernelKeys, nonzero only) in
	// the server's and the relay's netns over the transfer, by host.
	Kernel map[string]map[string]int64 `json:"kernel,omitempty"`
}

// EmuLate is the emulator's delivery lateness over one transfer (all the
// world's links and directions; emu.Lateness).
type EmuLate struct {
	Packets   uint64  `json:"packets"`
	Over500us float64 `json:"over_500us"` // share of the packets delivered > 0.5 ms after their due time
	Over2ms   float64 `json:"over_2ms"`   // share > 2 ms late
	MeanUs    float64 `json:"mean_us"`    // mean lateness, microseconds
}

// Par returns the number of worlds the transfer's run had at once.
func (t Trial) Par() int { return max(t.Parallel, 1) }

// SeparateParallel appends "parallel=K" to the setup of every trial of a
// run with K > 1 worlds at once, so that MergeTrials pools them apart
// from the one-world runs.
func SeparateParallel(ts []Trial) {
	for i := range ts {
		if k := ts[i].Par(); k > 1 {
			ts[i].Setup = strings.TrimSpace(ts[i].Setup + " parallel=" + strconv.Itoa(k))
		}
	}
}

// RowSpec is a row's links as recorded in a Trial.
type RowSpec struct {
	Name string  `json:"name"`
	D1   float64 `json:"d1"`
	J1   float64 `json:"j1"`
	L1   float64 `json:"l1"`
	D2   float64 `json:"d2"`
	J2   float64 `json:"j2"`
	L2   float64 `json:"l2"`
}

func (r Row) spec() RowSpec {
	return RowSpec{Name: r.Name, D1: r.D1, J1: r.J1, L1: r.L1, D2: r.D2, J2: r.J2, L2: r.L2}
}

// row returns the Row of a recorded spec: the seed's row with the same
// links (and its figures) when there is one.
func (s RowSpec) row() Row {
	for _, r := range SeedRows() {
		if r.spec() == s {
			return r
		}
	}
	return Row{Name: s.Name, D1: s.D1, J1: s.J1, L1: s.L1, D2: s.D2, J2: s.J2, L2: s.L2}
}

// setup describes the settings of cfg that shape the tables' world other
// than the row, the congestion control and the mode, in a fixed order.
func (c *Config) setup() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("rate", strconv.FormatFloat(c.RateMbit, 'g', -1, 64))
	add("sysctl", strings.Join(c.Sysctls, ","))
	add("relay-sysctl", strings.Join(c.RelaySysctls, ","))
	add("relay-cc", c.RelayCC)
	if c.RelayNoSACK {
		add("relay-nosack", "true")
	}
	add("tproxy-cc", c.TProxyCC)
	if c.TProxyPacing {
		add("tproxy-pacing", "true")
	}
	if c.TProxyPacingMbit > 0 {
		add("tproxy-pacing-mbit", strconv.FormatFloat(c.TProxyPacingMbit, 'g', -1, 64))
	}
	if c.TProxyInitCwnd > 0 {
		add("tproxy-initcwnd", strconv.Itoa(c.TProxyInitCwnd))
	}
	if c.TProxyWindowClamp > 0 {
		add("tproxy-window-clamp", strconv.FormatInt(c.TProxyWindowClamp, 10))
	}
	if c.TProxyHandshakeHold > 0 {
		add("tproxy-handshake-hold", c.TProxyHandshakeHold.String())
	}
	if c.JitterGSO {
		add("jitter-gso", "true")
	}
	if c.NetemLimit {
		add("netem-limit", "true")
	}
	return strings.Join(parts, " ")
}

// trialLog appends Trials to a file, one line each.
type trialLog struct {
	mu sync.Mutex // parallel worlds add at once
	f  *os.File
}

func openTrialLog(path string) (*trialLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("ttsbench: open trials file: %w", err)
	}
	return &trialLog{f: f}, nil
}

func (l *trialLog) add(t Trial) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("ttsbench: write trial: %w", err)
	}
	return nil
}

func (l *trialLog) close() error { return l.f.Close() }

// loadAvg reads the load averages; zeros when /proc is not there.
func loadAvg() [3]float64 {
	var la [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return la
	}
	for i, f := range strings.Fields(string(b)) {
		if i >= 3 {
			break
		}
		la[i], _ = strconv.ParseFloat(f, 64)
	}
	return la
}

// ReadTrials reads the Trials of a trials file (JSON lines; blank lines
// are skipped).
func ReadTrials(r io.Reader) ([]Trial, error) {
	var out []Trial
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var t Trial
		if err := json.Unmarshal([]byte(line), &t); err != nil {
			return out, fmt.Errorf("ttsbench: trials line %d: %w", n, err)
		}
		if t.CC == "" || t.Mode == "" || t.Size <= 0 || t.Row.Name == "" {
			return out, fmt.Errorf("ttsbench: trials line %d: cc, mode, size or row missing", n)
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("ttsbench: read trials: %w", err)
	}
	return out, nil
}

// Pooled is the tables of trials pooled from one or more files: one
// TableResult per (setup, size), in the order of first appearance.
type Pooled struct {
	Groups []PooledGroup
}

// PooledGroup is the trials of one setup and size.
type PooledGroup struct {
	Setup   string
	Result  *TableResult
	Runs    []string  // the world run ids pooled
	First   time.Time // first and last transfer
	Last    time.Time
	LoadMin float64 // 1-minute load average over the transfers
	LoadMax float64
	Loads   []float64
	// Parallel counts the transfers by how many worlds their run had at
	// once.
	Parallel map[int]int
}

// MergeTrials pools trials into tables: trials of the same setup and size
// form one TableResult, whose rows, congestion controls and modes are those
// the trials have, in the order they first appear (E2E first among modes).
// Failed transfers count in the fails column.
func MergeTrials(trials []Trial) (*Pooled, error) {
	if len(trials) == 0 {
		return nil, errors.New("ttsbench: no trials to merge")
	}
	type gk struct {
		setup string
		size  int64
	}
	idx := map[gk]int{}
	p := &Pooled{}
	for _, t := range trials {
		k := gk{t.Setup, t.Size}
		i, ok := idx[k]
		if !ok {
			i = len(p.Groups)
			idx[k] = i
			p.Groups = append(p.Groups, PooledGroup{Setup: t.Setup, First: t.UTC, Last: t.UTC, LoadMin: t.Load[0], LoadMax: t.Load[0], Parallel: map[int]int{},
				Result: &TableResult{Size: t.Size, Sample: map[key][]float64{}, Failed: map[key]int{}}})
		}
		g := &p.Groups[i]
		r := g.Result
		ri := slices.IndexFunc(r.Rows, func(x Row) bool { return x.spec() == t.Row })
		if ri < 0 {
			ri = len(r.Rows)
			r.Rows = append(r.Rows, t.Row.row())
		}
		if !slices.Contains(r.CCs, t.CC) {
			r.CCs = append(r.CCs, t.CC)
		}
		if !slices.Contains(r.Modes, t.Mode) {
			r.Modes = append(r.Modes, t.Mode)
		}
		if !slices.Contains(g.Runs, t.Run) {
			g.Runs = append(g.Runs, t.Run)
		}
		k2 := key{t.CC, ri, t.Mode}
		if t.Err != "" || t.Secs <= 0 {
			r.Failed[k2]++
		} else {
			r.Sample[k2] = append(r.Sample[k2], t.Secs)
		}
		if t.UTC.Before(g.First) {
			g.First = t.UTC
		}
		if t.UTC.After(g.Last) {
			g.Last = t.UTC
		}
		g.LoadMin, g.LoadMax = min(g.LoadMin, t.Load[0]), max(g.LoadMax, t.Load[0])
		g.Loads = append(g.Loads, t.Load[0])
		g.Parallel[t.Par()]++
	}
	for i := range p.Groups {
		sortRows(p.Groups[i].Result)
		m := p.Groups[i].Result.Modes
		slices.SortStableFunc(m, func(a, b Mode) int {
			switch {
			case a == b:
				return 0
			case a == E2E:
				return -1
			case b == E2E:
				return 1
			}
			return 0
		})
	}
	return p, nil
}

// sortRows puts r's rows in the seed's order (rows not in the seed after
// them, in their order), moving the samples with them.
func sortRows(r *TableResult) {
	seed := SeedRows()
	rank := func(x Row) int {
		if i := slices.IndexFunc(seed, func(s Row) bool { return s.spec() == x.spec() }); i >= 0 {
			return i
		}
		return len(seed)
	}
	order := make([]int, len(r.Rows)) // new position -> old index
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return rank(r.Rows[a]) - rank(r.Rows[b]) })
	newIdx := make([]int, len(order)) // old index -> new position
	rows := make([]Row, len(order))
	for n, o := range order {
		newIdx[o] = n
		rows[n] = r.Rows[o]
	}
	sample, failed := map[key][]float64{}, map[key]int{}
	for k, v := range r.Sample {
		sample[key{k.CC, newIdx[k.Row], k.Mode}] = v
	}
	for k, v := range r.Failed {
		failed[key{k.CC, newIdx[k.Row], k.Mode}] = v
	}
	r.Rows, r.Sample, r.Failed = rows, sample, failed
}

// WriteMarkdown writes every group's tables with where they come from.
func (p *Pooled) WriteMarkdown(w io.Writer) error {
	for _, g := range p.Groups {
		setup := g.Setup
		if setup == "" {
			setup = "defaults"
		}
		slices.Sort(g.Loads)
		fmt.Fprintf(w, "\nPooled: setup %q, %d B, %d worlds (runs), transfers %s - %s UTC, 1-min load at the transfers %.2f-%.2f (median %.2f)\n",
			setup, g.Result.Size, len(g.Runs), g.First.UTC().Format("2006-01-02 15:04"), g.Last.UTC().Format("2006-01-02 15:04"),
			g.LoadMin, g.LoadMax, g.Loads[len(g.Loads)/2])
		ks := slices.Sorted(maps.Keys(g.Parallel))
		var par []string
		for _, k := range ks {
			par = append(par, fmt.Sprintf("%d world(s) at once: %d", k, g.Parallel[k]))
		}
		fmt.Fprintf(w, "Transfers by parallelism: %s\n", strings.Join(par, ", "))
		if err := g.Result.WriteMarkdown(w); err != nil {
			return err
		}
	}
	return nil
}
