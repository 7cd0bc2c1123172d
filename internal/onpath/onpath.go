package onpath

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/intercept"
	"github.com/mosto-net/mosto/internal/pathcomp"
)

// Path is one declared on-path path: the flows from Sources to Dests
// (server ports Ports) cross the relays Relays, in order from the client.
type Path struct {
	Name    string   `yaml:"name"`
	Relays  []string `yaml:"relays"`
	Sources []string `yaml:"sources"`
	Dests   []string `yaml:"dests"`
	Ports   string   `yaml:"ports"`
	// Size is the transfer size (bytes) the choice minimises the time
	// of; 0 means DefaultSize.
	Size int64 `yaml:"size"`
	// RateMbit is the bottleneck rate of every segment; 0: unlimited.
	RateMbit float64 `yaml:"rate_mbit"`
	// Pin fixes the decision instead of planning it: "all" (every relay
	// intercepts) or "none"; "" plans.
	Pin string `yaml:"pin"`
}

// Config configures a Planner.
type Config struct {
	Paths []Path `yaml:"paths"`
	// Gain: a decision changes only when the model predicts the new
	// choice takes less than (1 - Gain) of the current one's time;
	// 0 means 0.10.
	Gain float64 `yaml:"gain"`
	// Hold is the shortest time between two changes of one path's
	// decision; 0 means 1 minute.
	Hold time.Duration `yaml:"hold"`
	// MinSegs are the data segments a leg's figures must cover before
	// they update the loss estimate; 0 means 1000.
	MinSegs float64 `yaml:"min_segs"`
	// Model is the slow-start model (ICW, MSS); zero: pathcomp's default.
	Model pathcomp.Model `yaml:"-"`
}

// DefaultSize is the transfer size decisions optimise by default.
const DefaultSize = 10_000_000

// alpha is the weight of a new figure in the hop estimates.
const alpha = 0.5

// Validate checks c and fills defaults.
func (c *Config) Validate() error {
	if c.Gain == 0 {
		c.Gain = 0.10
	}
	if c.Gain < 0 || c.Gain >= 1 {
		return fmt.Errorf("onpath: gain %v: want 0..1", c.Gain)
	}
	if c.Hold == 0 {
		c.Hold = time.Minute
	}
	if c.Hold < 0 {
		return fmt.Errorf("onpath: hold %v: want >= 0", c.Hold)
	}
	if c.MinSegs == 0 {
		c.MinSegs = 1000
	}
	if c.MinSegs < 0 || math.IsNaN(c.MinSegs) {
		return fmt.Errorf("onpath: min_segs %v: want > 0", c.MinSegs)
	}
	if c.Model.ICW == 0 {
		c.Model = pathcomp.Model{ICW: 10, MSS: 1448}
	}
	names := map[string]bool{}
	for i := range c.Paths {
		p := &c.Paths[i]
		if err := api.ValidateID(p.Name); err != nil {
			return fmt.Errorf("onpath: path %d name: %w", i, err)
		}
		if names[p.Name] {
			return fmt.Errorf("onpath: path %s: declared twice", p.Name)
		}
		names[p.Name] = true
		if len(p.Relays) == 0 || len(p.Relays) > pathcomp.MaxLossHops-1 {
			return fmt.Errorf("onpath: path %s: %d relays; want 1..%d", p.Name, len(p.Relays), pathcomp.MaxLossHops-1)
		}
		seen := map[string]bool{}
		for _, r := range p.Relays {
			if err := api.ValidateID(r); err != nil {
				return fmt.Errorf("onpath: path %s relay: %w", p.Name, err)
			}
			if seen[r] {
				return fmt.Errorf("onpath: path %s: relay %s twice", p.Name, r)
			}
			seen[r] = true
		}
		if _, err := intercept.ParsePrefixes(p.Sources); err != nil {
			return fmt.Errorf("onpath: path %s sources: %w", p.Name, err)
		}
		if _, err := intercept.ParsePrefixes(p.Dests); err != nil {
			return fmt.Errorf("onpath: path %s dests: %w", p.Name, err)
		}
		if p.Ports != "" {
			if _, err := intercept.ParsePorts(p.Ports); err != nil {
				return fmt.Errorf("onpath: path %s ports: %w", p.Name, err)
			}
		}
		if p.Size == 0 {
			p.Size = DefaultSize
		}
		if p.Size < 0 {
			return fmt.Errorf("onpath: path %s size %d: want > 0", p.Name, p.Size)
		}
		if p.Pin != "" && p.Pin != "all" && p.Pin != "none" {
			return fmt.Errorf("onpath: path %s pin %q: want all, none or nothing", p.Name, p.Pin)
		}
		if p.RateMbit < 0 || math.IsNaN(p.RateMbit) {
			return fmt.Errorf("onpath: path %s rate_mbit %v: want >= 0", p.Name, p.RateMbit)
		}
	}
	return nil
}

// hop is the estimate of one hop.
type hop struct {
	rtt  float64 // ms; 0: not measured yet
	loss float64 // per packet
}

// pending accumulates a span's figures until they cover MinSegs.
type pending struct {
	segs, retrans float64
}

// state is one path's estimates and decision.
type state struct {
	p        Path
	hops     []hop // len(relays)+1; relay i sits between hop i and i+1
	pend     map[[2]int]*pending
	active   []bool    // current decision
	changed  time.Time // when active last changed
	pred     float64   // predicted time of the current decision (ms)
	measured bool      // every hop has an RTT and some leg a loss figure: the decision rests on measurements
	lossSeen bool      // some leg's loss was folded in (>= MinSegs segments)
	best     float64   // predicted time of the best choice (ms)
}

// Planner keeps the estimates and decisions of every path. It is safe for
// concurrent use.
type Planner struct {
	cfg   Config
	mu    sync.Mutex
	paths map[string]*state
	order []string
}

// New validates cfg and returns a Planner whose paths start with every
// relay active (each leg is then one hop: the first reports measure every
// hop).
func New(cfg Config, now time.Time) (*Planner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pl := &Planner{cfg: cfg, paths: map[string]*state{}}
	for _, p := range cfg.Paths {
		st := &state{p: p, hops: make([]hop, len(p.Relays)+1), pend: map[[2]int]*pending{},
			active: make([]bool, len(p.Relays)), changed: now}
		for i := range st.active {
			st.active[i] = p.Pin != "none"
		}
		pl.paths[p.Name] = st
		pl.order = append(pl.order, p.Name)
	}
	slices.Sort(pl.order)
	return pl, nil
}

// span returns the hops [a, b] a leg from..to covers.
func (st *state) span(from, to string) (int, int, error) {
	n := len(st.p.Relays)
	a, b := 0, n
	if from != "" {
		i := slices.Index(st.p.Relays, from)
		if i < 0 {
			return 0, 0, fmt.Errorf("%s is not a relay of path %s", from, st.p.Name)
		}
		a = i + 1
	}
	if to != "" {
		j := slices.Index(st.p.Relays, to)
		if j < 0 {
			return 0, 0, fmt.Errorf("%s is not a relay of path %s", to, st.p.Name)
		}
		b = j
	}
	if a > b {
		return 0, 0, fmt.Errorf("path %s: leg %q-%q runs backwards", st.p.Name, from, to)
	}
	return a, b, nil
}

// ErrUnknown is wrapped by Observe's error for samples about paths or
// relays the planner does not know.
var ErrUnknown = errors.New("onpath: unknown path or relay")

// Observe folds the samples fep reported into the estimates and revisits
// the decisions of their paths. It returns whether a decision changed
// (the tables must be recomputed) and the samples it refused.
func (pl *Planner) Observe(now time.Time, fep string, samples []api.SegmentSample) (bool, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var errs []error
	touched := map[string]bool{}
	for _, s := range samples {
		st, ok := pl.paths[s.Path]
		if !ok {
			errs = append(errs, fmt.Errorf("%w: path %q", ErrUnknown, s.Path))
			continue
		}
		if err := s.Validate(fep); err != nil {
			errs = append(errs, err)
			continue
		}
		a, b, err := st.span(s.From, s.To)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %v", ErrUnknown, err))
			continue
		}
		st.foldRTT(a, b, s.MinRTTMS)
		pd := st.pend[[2]int{a, b}]
		if pd == nil {
			pd = &pending{}
			st.pend[[2]int{a, b}] = pd
		}
		pd.segs += s.SegsOut
		pd.retrans += s.Retrans
		if pd.segs >= pl.cfg.MinSegs {
			st.foldLoss(a, b, pd.retrans/pd.segs)
			st.lossSeen = true
			*pd = pending{}
		}
		touched[s.Path] = true
	}
	changed := false
	for name := range touched {
		if pl.decide(pl.paths[name], now) {
			changed = true
		}
	}
	return changed, errors.Join(errs...)
}

// foldRTT updates hops a..b with a measured RTT of their sum: one hop
// directly; several by scaling the known hops (unknown ones share what
// the known ones leave, or an equal part).
func (st *state) foldRTT(a, b int, rtt float64) {
	if a == b {
		h := &st.hops[a]
		if h.rtt == 0 {
			h.rtt = rtt
		} else {
			h.rtt = (1-alpha)*h.rtt + alpha*rtt
		}
		return
	}
	var known float64
	unknown := 0
	for i := a; i <= b; i++ {
		if st.hops[i].rtt > 0 {
			known += st.hops[i].rtt
		} else {
			unknown++
		}
	}
	switch {
	case unknown == 0:
		target := (1-alpha)*known + alpha*rtt
		for i := a; i <= b; i++ {
			st.hops[i].rtt *= target / known
		}
	case rtt > known:
		for i := a; i <= b; i++ {
			if st.hops[i].rtt == 0 {
				st.hops[i].rtt = (rtt - known) / float64(unknown)
			}
		}
	default:
		// The known hops already account for the whole span: share
		// it equally.
		for i := a; i <= b; i++ {
			st.hops[i].rtt = rtt / float64(b-a+1)
		}
	}
}

// foldLoss updates hops a..b with a measured loss of the span: one hop
// directly; several by scaling each hop's share of -log(1-p) (equal
// shares when none has loss).
func (st *state) foldLoss(a, b int, p float64) {
	p = min(max(p, 0), 0.5)
	if a == b {
		h := &st.hops[a]
		h.loss = (1-alpha)*h.loss + alpha*p
		return
	}
	var cur float64
	for i := a; i <= b; i++ {
		cur += -math.Log1p(-st.hops[i].loss)
	}
	target := (1-alpha)*cur + alpha*(-math.Log1p(-p))
	for i := a; i <= b; i++ {
		share := 1 / float64(b-a+1)
		if cur > 0 {
			share = -math.Log1p(-st.hops[i].loss) / cur
		}
		st.hops[i].loss = -math.Expm1(-target * share)
	}
}

// lossHops returns the hops for the model, or false while a hop has no
// RTT yet.
func (st *state) lossHops() ([]pathcomp.LossHop, bool) {
	hs := make([]pathcomp.LossHop, len(st.hops))
	for i, h := range st.hops {
		if h.rtt <= 0 {
			return nil, false
		}
		hs[i] = pathcomp.LossHop{RTT: h.rtt, Loss: h.loss}
	}
	return hs, true
}

// decide revisits st's decision. The wanted choice is the one with the
// fewest relays whose predicted time is within Gain of the fastest (a
// relay must pay for itself); the decision moves to it when the last
// change is older than Hold and either the current choice is slower than
// it by more than Gain, or it drops relays for at most Gain/2 of the
// current time. Between those two thresholds nothing changes, so noisy
// estimates near one of them do not flap.
func (pl *Planner) decide(st *state, now time.Time) bool {
	hs, ok := st.lossHops()
	if !ok || !st.lossSeen {
		// Not before every hop has an RTT and some leg carried enough
		// data for a loss figure: a decision on RTTs alone would drop
		// relays on a lossy path (and an inactive relay measures
		// nothing more).
		return false
	}
	m := pathcomp.LossModel{Model: pl.cfg.Model, RateMbit: st.p.RateMbit}
	n := len(st.active)
	times := make([]float64, 1<<n)
	bestT := math.Inf(1)
	for mask := range times {
		t, err := m.Time(pathcomp.Merge(hs, maskSet(mask, n)), st.p.Size)
		if err != nil {
			return false
		}
		times[mask] = t
		bestT = min(bestT, t)
	}
	want := -1
	for mask, t := range times {
		if t > (1+pl.cfg.Gain)*bestT {
			continue
		}
		if want < 0 || bits(mask) < bits(want) || bits(mask) == bits(want) && t < times[want] {
			want = mask
		}
	}
	cur := setMask(st.active)
	st.pred, st.best = times[cur], times[want]
	st.measured = true
	if st.p.Pin != "" || want == cur || now.Sub(st.changed) < pl.cfg.Hold {
		return false
	}
	faster := times[cur] > (1+pl.cfg.Gain)*times[want]
	fewer := bits(want) < bits(cur) && times[want] <= (1+pl.cfg.Gain/2)*times[cur]
	if !faster && !fewer {
		return false
	}
	st.active, st.changed, st.pred = maskSet(want, n), now, times[want]
	return true
}

func maskSet(mask, n int) []bool {
	a := make([]bool, n)
	for i := range a {
		a[i] = mask&(1<<i) != 0
	}
	return a
}

func setMask(a []bool) int {
	m := 0
	for i, on := range a {
		if on {
			m |= 1 << i
		}
	}
	return m
}

func bits(m int) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

// Intercepts returns the decisions, sorted by FEP then path: one entry per
// relay of every path.
func (pl *Planner) Intercepts() []api.Intercept {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var out []api.Intercept
	for _, name := range pl.order {
		st := pl.paths[name]
		for i, r := range st.p.Relays {
			in := api.Intercept{FEP: r, Path: name, Active: st.active[i], Measured: st.measured,
				Sources: st.p.Sources, Dests: st.p.Dests, Ports: st.p.Ports}
			for j := i - 1; j >= 0; j-- {
				if st.active[j] {
					in.Prev = st.p.Relays[j]
					break
				}
			}
			for j := i + 1; j < len(st.p.Relays); j++ {
				if st.active[j] {
					in.Next = st.p.Relays[j]
					break
				}
			}
			out = append(out, in)
		}
	}
	slices.SortStableFunc(out, func(x, y api.Intercept) int {
		if x.FEP != y.FEP {
			if x.FEP < y.FEP {
				return -1
			}
			return 1
		}
		return 0
	})
	return out
}

// Status is one path's estimates and decision, for logs and tests.
type Status struct {
	Path   string
	Hops   []pathcomp.LossHop // RTT 0: not measured yet
	Active []bool
	// PredMS and BestMS are the model's times for the current decision
	// and the best choice (0 before every hop has an RTT).
	PredMS, BestMS float64
	Changed        time.Time
	Measured       bool // every hop has an RTT
}

// Status returns every path's status, sorted by name.
func (pl *Planner) Status() []Status {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var out []Status
	for _, name := range pl.order {
		st := pl.paths[name]
		s := Status{Path: name, Active: slices.Clone(st.active), PredMS: st.pred, BestMS: st.best, Changed: st.changed, Measured: st.measured}
		for _, h := range st.hops {
			s.Hops = append(s.Hops, pathcomp.LossHop{RTT: h.rtt, Loss: h.loss})
		}
		out = append(out, s)
	}
	return out
}

// ParseConfig reads a Config from YAML (`paths:`, `gain:`, `hold:`,
// `min_segs:`); unknown fields are errors.
func ParseConfig(r io.Reader) (Config, error) {
	var raw struct {
		Paths   []Path  `yaml:"paths"`
		Gain    float64 `yaml:"gain"`
		Hold    string  `yaml:"hold"`
		MinSegs float64 `yaml:"min_segs"`
	}
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("onpath: %w", err)
	}
	c := Config{Paths: raw.Paths, Gain: raw.Gain, MinSegs: raw.MinSegs}
	if raw.Hold != "" {
		d, err := time.ParseDuration(raw.Hold)
		if err != nil {
			return Config{}, fmt.Errorf("onpath: hold: %w", err)
		}
		c.Hold = d
	}
	return c, c.Validate()
}
