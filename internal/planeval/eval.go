package planeval

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/topo"
)

// DefaultRounds are the round counts of the paper's Fig. 2: a transfer within
// the initial window (< 15 KB), and transfers of 5 and 10 rounds.
func DefaultRounds() []int { return []int{1, 5, 10} }

// Series holds the per-pair outcomes for one round count, pooled over all
// graphs and all ordered pairs of locations.
type Series struct {
	Rounds int
	// VsShortest and VsMinimax hold, per ordered pair, the relative
	// improvement of the planner's chain over the baseline:
	// (cost(baseline) - cost(ours)) / cost(ours). 0.4 means the baseline
	// takes 40% longer. Sorted ascending.
	VsShortest []float64
	VsMinimax  []float64
	// VsMSTMinimax is the same against the classic minimax route: the path
	// in a minimum spanning tree, which ignores the sum of RTTs.
	VsMSTMinimax []float64
	// VsHopsMinimax is the same against the minimax chain with the fewest
	// hops (then the smallest sum): the minimax route using fewest proxies.
	VsHopsMinimax []float64
	// Mean number of proxies (intermediate locations) per chain.
	ProxiesOurs, ProxiesMinimax, ProxiesMSTMinimax, ProxiesHopsMinimax, ProxiesShortest float64
	// Worse counts pairs where the planner's chain cost more than a
	// baseline by more than 1 µs: always 0 for a correct planner.
	Worse int
}

// GraphInfo describes one evaluated graph.
type GraphInfo struct {
	Name      string
	Locations int
	Links     int // finite entries above the diagonal
	Pairs     int // ordered pairs evaluated (reachable)
	Elapsed   time.Duration
}

// Result is the outcome of Run.
type Result struct {
	Graphs  []GraphInfo
	Series  []Series
	Pairs   int // ordered pairs per round count
	Elapsed time.Duration
}

// Run evaluates the planner on graphs for each round count in rounds. It
// stops early when ctx is cancelled.
func Run(ctx context.Context, graphs []topo.Graph, rounds []int) (*Result, error) {
	if len(graphs) == 0 {
		return nil, fmt.Errorf("planeval: no graphs to evaluate")
	}
	if len(rounds) == 0 {
		rounds = DefaultRounds()
	}
	for _, r := range rounds {
		if r < 1 {
			return nil, fmt.Errorf("planeval: rounds %d; want >= 1", r)
		}
	}
	start := time.Now()
	res := &Result{Series: make([]Series, len(rounds))}
	sums := make([][5]float64, len(rounds))
	for k, r := range rounds {
		res.Series[k].Rounds = r
	}
	model := pathcomp.Model{}
	for _, g := range graphs {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("planeval: %w", err)
		}
		t0 := time.Now()
		rtt := g.Matrix.RTT
		f, err := pathcomp.Precompute(rtt, pathcomp.Options{})
		if err != nil {
			return nil, fmt.Errorf("planeval: graph %s: %w", g.Name, err)
		}
		n := g.Matrix.Len()
		info := GraphInfo{Name: g.Name, Locations: n, Links: f.Links()}
		q := quantise(rtt)
		bl := newBaseliner(n)
		sp, mm, mh, tr := make([]route, n), make([]route, n), make([]route, n), make([]route, n)
		tree := mst(q)
		var stack []int
		var path []int
		for i := 0; i < n; i++ {
			bl.baselines(q, i, sp, mm, mh)
			stack = treeRoutes(q, tree, i, tr, stack)
			for j := 0; j < n; j++ {
				if i == j || !sp[j].ok || !mm[j].ok {
					continue
				}
				info.Pairs++
				for k, r := range rounds {
					ours, ok := f.BestAppend(path, i, j, r)
					if !ok {
						return nil, fmt.Errorf("planeval: graph %s: no chain %d->%d though the baselines found one", g.Name, i, j)
					}
					path = ours.Path
					co, cs, cm := model.Cost(ours, r), sp[j].costMs(r), mm[j].costMs(r)
					s := &res.Series[k]
					if co > cs+1e-3 || co > cm+1e-3 || co > tr[j].costMs(r)+1e-3 || co > mh[j].costMs(r)+1e-3 {
						s.Worse++
					}
					s.VsShortest = append(s.VsShortest, improvement(cs, co))
					s.VsMinimax = append(s.VsMinimax, improvement(cm, co))
					s.VsMSTMinimax = append(s.VsMSTMinimax, improvement(tr[j].costMs(r), co))
					sums[k][3] += float64(tr[j].proxies())
					s.VsHopsMinimax = append(s.VsHopsMinimax, improvement(mh[j].costMs(r), co))
					sums[k][4] += float64(mh[j].proxies())
					sums[k][0] += float64(ours.Proxies())
					sums[k][1] += float64(mm[j].proxies())
					sums[k][2] += float64(sp[j].proxies())
				}
			}
		}
		info.Elapsed = time.Since(t0)
		res.Pairs += info.Pairs
		res.Graphs = append(res.Graphs, info)
	}
	if res.Pairs == 0 {
		return nil, fmt.Errorf("planeval: no connected pair of locations in %d graphs", len(graphs))
	}
	for k := range res.Series {
		s := &res.Series[k]
		slices.Sort(s.VsShortest)
		slices.Sort(s.VsMinimax)
		slices.Sort(s.VsMSTMinimax)
		slices.Sort(s.VsHopsMinimax)
		p := float64(res.Pairs)
		s.ProxiesOurs, s.ProxiesMinimax, s.ProxiesShortest = sums[k][0]/p, sums[k][1]/p, sums[k][2]/p
		s.ProxiesMSTMinimax = sums[k][3] / p
		s.ProxiesHopsMinimax = sums[k][4] / p
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// improvement is (base - ours) / ours, 0 when both are 0, and clamped at 0
// for differences within the planner's 1 µs quantisation.
func improvement(base, ours float64) float64 {
	d := base - ours
	if math.Abs(d) <= 1e-3 {
		return 0
	}
	if ours <= 0 {
		return math.Inf(1)
	}
	return d / ours
}

// Quantile returns the q-quantile (0..1) of sorted xs (nearest rank).
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	k = max(0, min(k, len(sorted)-1))
	return sorted[k]
}

// FractionAbove returns the fraction of sorted xs strictly greater than x.
func FractionAbove(sorted []float64, x float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	k, found := slices.BinarySearch(sorted, x)
	for found && k < len(sorted) && sorted[k] == x {
		k++
	}
	return float64(len(sorted)-k) / float64(len(sorted))
}
