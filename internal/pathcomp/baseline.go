package pathcomp

import (
	"cmp"
	"math"
	"slices"
)

// The baselines work on the same microsecond-quantised RTTs as Precompute,
// so that their sums compare exactly. They return false for an invalid
// matrix (see Precompute), an index out of range or an unreachable pair.

// ShortestPath returns the chain from i to j with the smallest Sum (the
// optimum for one round), with the fewest hops among those.
func ShortestPath(rtt [][]float64, i, j int) (Chain, bool) {
	if !baselineOK(rtt, i, j) {
		return Chain{}, false
	}
	return dijkstra(rtt, i, j, math.Inf(1))
}

// Minimax returns the bottleneck chain from i to j: the smallest Max, then
// the smallest Sum, then the fewest hops.
func Minimax(rtt [][]float64, i, j int) (Chain, bool) {
	if !baselineOK(rtt, i, j) {
		return Chain{}, false
	}
	n := len(rtt)
	// Bottleneck distances from i (Prim-like, O(n^2)).
	bott := make([]int64, n)
	done := make([]bool, n)
	for k := range bott {
		bott[k] = infKey
	}
	bott[i] = 0
	for {
		u := -1
		for k := 0; k < n; k++ {
			if !done[k] && bott[k] < infKey && (u < 0 || bott[k] < bott[u]) {
				u = k
			}
		}
		if u < 0 {
			break
		}
		done[u] = true
		for v := 0; v < n; v++ {
			if v == u || done[v] || math.IsInf(rtt[u][v], 1) {
				continue
			}
			if b := max(bott[u], micros(rtt[u][v])); b < bott[v] {
				bott[v] = b
			}
		}
	}
	if bott[j] == infKey {
		return Chain{}, false
	}
	return dijkstra(rtt, i, j, millis(bott[j]))
}

func baselineOK(rtt [][]float64, i, j int) bool {
	n := len(rtt)
	return i >= 0 && j >= 0 && i < n && j < n && checkMatrix(rtt) == nil
}

// dijkstra returns the smallest (sum, hops) path from i to j over links whose
// quantised RTT is at most limit (ms).
func dijkstra(rtt [][]float64, i, j int, limit float64) (Chain, bool) {
	n := len(rtt)
	lim := int64(math.MaxInt64)
	if !math.IsInf(limit, 1) {
		lim = micros(limit)
	}
	dist := make([]int64, n)
	prev := make([]int, n)
	done := make([]bool, n)
	for k := range dist {
		dist[k], prev[k] = infKey, -1
	}
	dist[i] = 0
	for {
		u := -1
		for k := 0; k < n; k++ {
			if !done[k] && dist[k] < infKey && (u < 0 || dist[k] < dist[u]) {
				u = k
			}
		}
		if u < 0 || u == j {
			break
		}
		done[u] = true
		for v := 0; v < n; v++ {
			if v == u || done[v] || math.IsInf(rtt[u][v], 1) {
				continue
			}
			w := micros(rtt[u][v])
			if w > lim {
				continue
			}
			if c := dist[u] + (w<<hopBits + 1); c < dist[v] {
				dist[v], prev[v] = c, u
			}
		}
	}
	if dist[j] == infKey {
		return Chain{}, false
	}
	var path []int
	for v := j; v >= 0; v = prev[v] {
		path = append(path, v)
	}
	slices.Reverse(path)
	return chainOf(rtt, path), true
}

// chainOf measures path on rtt.
func chainOf(rtt [][]float64, path []int) Chain {
	var sum, mx int64
	for k := 1; k < len(path); k++ {
		w := micros(rtt[path[k-1]][path[k]])
		sum += w
		mx = max(mx, w)
	}
	return Chain{Path: path, Sum: millis(sum), Max: millis(mx)}
}

// BruteForce enumerates every simple path from i to j and returns their
// Pareto front over (Sum, Max), sorted by increasing Sum, with the fewest
// hops for each point. It takes time exponential in n: use it for n <= 10.
func BruteForce(rtt [][]float64, i, j int) []Chain {
	if !baselineOK(rtt, i, j) {
		return nil
	}
	if i == j {
		return []Chain{{Path: []int{i}}}
	}
	n := len(rtt)
	type cand struct {
		sum, mx int64
		path    []int
	}
	var all []cand
	onPath := make([]bool, n)
	path := []int{i}
	onPath[i] = true
	var walk func(u int, sum, mx int64)
	walk = func(u int, sum, mx int64) {
		for v := 0; v < n; v++ {
			if onPath[v] || math.IsInf(rtt[u][v], 1) {
				continue
			}
			w := micros(rtt[u][v])
			s, m := sum+w, max(mx, w)
			path = append(path, v)
			if v == j {
				all = append(all, cand{s, m, slices.Clone(path)})
			} else {
				onPath[v] = true
				walk(v, s, m)
				onPath[v] = false
			}
			path = path[:len(path)-1]
		}
	}
	walk(i, 0, 0)
	// Sort by Sum, then Max, then hops; keep each candidate whose Max is
	// below every Max kept so far.
	slices.SortFunc(all, func(x, y cand) int {
		return cmp.Or(cmp.Compare(x.sum, y.sum), cmp.Compare(x.mx, y.mx), cmp.Compare(len(x.path), len(y.path)))
	})
	var out []Chain
	best := int64(math.MaxInt64)
	for _, c := range all {
		if c.mx < best {
			best = c.mx
			out = append(out, Chain{Path: c.path, Sum: millis(c.sum), Max: millis(c.mx)})
		}
	}
	return out
}
