package pathcomp

import (
	"cmp"
	"math"
	"slices"
)

// RankedChain is one of the k chains KChains returns: the chain, its model
// cost (ms) for the requested rounds, and the links it shares with the
// chains ranked before it (pairs of location indices, lower index first).
type RankedChain struct {
	Chain
	Cost   float64
	Shared [][2]int
}

// maxKChainsLocations bounds KChains' matrix: each spur search is
// O(distinct RTTs x n^2).
const maxKChainsLocations = 256

// KChains returns up to k loop-free chains from i to j for a transfer of
// rounds slow-start rounds, for multi-path downloads (seed 003): Yen's
// k-shortest loopless paths on the chain model's cost (Model.Cost, which
// is not additive: each spur search takes the best over bottleneck
// thresholds) give a pool of 3k candidates; the first chain is the
// cheapest, each next one the candidate that shares the fewest links with
// the chains already chosen, then the cheapest. Shared says which links a
// chain shares with the ones before it: a client couples the congestion
// control of sub-flows that share links. It returns nil for an invalid
// matrix, bad indices, i == j, k < 1, more than 256 locations or an
// unreachable pair.
func KChains(rtt [][]float64, i, j, k, rounds int, m Model) []RankedChain {
	if k < 1 || i == j || len(rtt) > maxKChainsLocations || !baselineOK(rtt, i, j) {
		return nil
	}
	rounds = max(rounds, 1)
	pool := yenPool(rtt, i, j, 3*k, rounds)
	if len(pool) == 0 {
		return nil
	}

	// Choose k: fewest links shared with the chosen ones, then cost.
	used := map[[2]int]bool{}
	var out []RankedChain
	taken := make([]bool, len(pool))
	for len(out) < k {
		b, bShared := -1, 0
		for c, p := range pool {
			if taken[c] {
				continue
			}
			sh := 0
			for _, l := range links(p.path) {
				if used[l] {
					sh++
				}
			}
			if b < 0 || sh < bShared {
				b, bShared = c, sh
			}
		}
		if b < 0 {
			break
		}
		taken[b] = true
		p := pool[b]
		rc := RankedChain{Chain: chainOf(rtt, p.path), Cost: m.Cost(chainOf(rtt, p.path), rounds)}
		for _, l := range links(p.path) {
			if used[l] {
				rc.Shared = append(rc.Shared, l)
			}
		}
		for _, l := range links(p.path) {
			used[l] = true
		}
		out = append(out, rc)
	}
	return out
}

// links returns the links of path, lower index first.
func links(path []int) [][2]int {
	var out [][2]int
	for k := 1; k < len(path); k++ {
		a, b := path[k-1], path[k]
		out = append(out, [2]int{min(a, b), max(a, b)})
	}
	return out
}

func pathKey(p []int) string {
	b := make([]byte, 0, 2*len(p))
	for _, v := range p {
		b = append(b, byte(v>>8), byte(v))
	}
	return string(b)
}

// ykey is a candidate path with its quantised cost parts.
type ykey struct {
	path     []int
	cost     float64
	sum, mx  int64 // microseconds
	hopCount int
}

func (a ykey) less(b ykey) bool {
	return cmp.Or(cmp.Compare(a.cost, b.cost), cmp.Compare(a.hopCount, b.hopCount), slices.Compare(a.path, b.path)) < 0
}

// yen holds the spur-search state over the quantised matrix.
type yen struct {
	n          int
	w          [][]int64 // microseconds; -1: no link
	thresholds []int64   // distinct link RTTs, ascending
	rounds     int
	cutLinks   map[[2]int]bool
	gone       []bool
}

func newYen(rtt [][]float64, rounds int) *yen {
	n := len(rtt)
	y := &yen{n: n, w: make([][]int64, n), rounds: rounds, gone: make([]bool, n), cutLinks: map[[2]int]bool{}}
	set := map[int64]bool{}
	for a := range rtt {
		y.w[a] = make([]int64, n)
		for b := range rtt[a] {
			if a == b || math.IsInf(rtt[a][b], 1) {
				y.w[a][b] = -1
				continue
			}
			y.w[a][b] = micros(rtt[a][b])
			set[y.w[a][b]] = true
		}
	}
	for t := range set {
		y.thresholds = append(y.thresholds, t)
	}
	slices.Sort(y.thresholds)
	return y
}

func (y *yen) reset() {
	clear(y.cutLinks)
	clear(y.gone)
}

func (y *yen) cut(a, b int) { y.cutLinks[[2]int{min(a, b), max(a, b)}] = true }

func (y *yen) measure(path []int) (sum, mx int64) {
	for k := 1; k < len(path); k++ {
		w := y.w[path[k-1]][path[k]]
		sum += w
		mx = max(mx, w)
	}
	return sum, mx
}

func (y *yen) costOf(sum, mx int64) float64 {
	return 0.5*millis(sum) + float64(y.rounds-1)*millis(mx)
}

func (y *yen) ykeyOf(path []int) ykey {
	s, m := y.measure(path)
	return ykey{path: path, cost: y.costOf(s, m), sum: s, mx: m, hopCount: len(path) - 1}
}

// best returns the path from u to j avoiding gone nodes and cut links that
// minimises the cost of the whole chain, whose root before u has sum rs and
// max rm: for one round the smallest sum; otherwise the best over every
// bottleneck threshold of the smallest-sum path under it.
func (y *yen) best(u, j int, gone []bool, rs, rm int64) (ykey, bool) {
	if y.rounds == 1 {
		p, ok := y.dijkstra(u, j, gone, math.MaxInt64)
		if !ok {
			return ykey{}, false
		}
		return y.ykeyOf(p), true
	}
	var bestK ykey
	found := false
	for _, t := range y.thresholds {
		p, ok := y.dijkstra(u, j, gone, t)
		if !ok {
			continue
		}
		s, m := y.measure(p)
		k := ykey{path: p, cost: y.costOf(rs+s, max(rm, m)), sum: s, mx: m, hopCount: len(p) - 1}
		if !found || k.less(bestK) {
			bestK, found = k, true
		}
	}
	return bestK, found
}

// dijkstra returns the smallest (sum, hops) path from u to j over links of
// at most lim microseconds, avoiding gone nodes and cut links.
func (y *yen) dijkstra(u, j int, gone []bool, lim int64) ([]int, bool) {
	n := y.n
	dist := make([]int64, n)
	prev := make([]int, n)
	done := make([]bool, n)
	for k := range dist {
		dist[k], prev[k] = infKey, -1
	}
	dist[u] = 0
	for {
		a := -1
		for k := 0; k < n; k++ {
			if !done[k] && dist[k] < infKey && (a < 0 || dist[k] < dist[a]) {
				a = k
			}
		}
		if a < 0 || a == j {
			break
		}
		done[a] = true
		for b := 0; b < n; b++ {
			w := y.w[a][b]
			if w < 0 || w > lim || done[b] || (gone != nil && gone[b]) || y.cutLinks[[2]int{min(a, b), max(a, b)}] {
				continue
			}
			if c := dist[a] + (w<<hopBits + 1); c < dist[b] {
				dist[b], prev[b] = c, a
			}
		}
	}
	if dist[j] == infKey {
		return nil, false
	}
	var path []int
	for v := j; v >= 0; v = prev[v] {
		path = append(path, v)
	}
	slices.Reverse(path)
	return path, true
}

// yenPool returns up to want loopless paths from i to j in increasing
// model cost (Yen's algorithm with a threshold spur search).
func yenPool(rtt [][]float64, i, j, want, rounds int) []ykey {
	y := newYen(rtt, rounds)
	first, ok := y.best(i, j, nil, 0, 0)
	if !ok {
		return nil
	}
	pool := []ykey{first}
	seen := map[string]bool{pathKey(first.path): true}
	var cand []ykey
	for len(pool) < want {
		prev := pool[len(pool)-1].path
		for s := 0; s+1 < len(prev); s++ {
			root := prev[:s+1]
			y.reset()
			for _, p := range pool {
				if len(p.path) > s+1 && slices.Equal(p.path[:s+1], root) {
					y.cut(p.path[s], p.path[s+1])
				}
			}
			for _, v := range root[:s] {
				y.gone[v] = true
			}
			rs, rm := y.measure(root)
			spur, ok := y.best(prev[s], j, y.gone, rs, rm)
			if !ok {
				continue
			}
			path := append(slices.Clone(root[:s]), spur.path...)
			if key := pathKey(path); !seen[key] {
				seen[key] = true
				cand = append(cand, y.ykeyOf(path))
			}
		}
		if len(cand) == 0 {
			break
		}
		b := 0
		for c := range cand {
			if cand[c].less(cand[b]) {
				b = c
			}
		}
		pool = append(pool, cand[b])
		cand = slices.Delete(cand, b, b+1)
	}

	return pool
}
