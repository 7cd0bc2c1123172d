package planeval

import (
	"math"
	"slices"
)

// The baselines below are computed per source for all destinations at once,
// which is what makes the evaluation fast: the per-pair functions of
// pathcomp (ShortestPath, Minimax) each cost Theta(n^2), so calling them for
// every ordered pair costs Theta(n^4) per graph with large constants. Like
// pathcomp, they work on RTTs quantised to whole microseconds so that sums
// compare exactly; the tests check them against pathcomp's.

// route is a baseline chain from the source, in microseconds.
type route struct {
	sum, max int64
	hops     int
	ok       bool
}

// costMs is the model's transfer time of r over rounds rounds, in ms.
func (r route) costMs(rounds int) float64 {
	return (0.5*float64(r.sum) + float64(rounds-1)*float64(r.max)) / 1000
}

// proxies is the number of intermediate locations of r.
func (r route) proxies() int { return max(0, r.hops-1) }

// quantise returns rtt in whole microseconds, -1 for no link.
func quantise(rtt [][]float64) [][]int64 {
	q := make([][]int64, len(rtt))
	for i, row := range rtt {
		q[i] = make([]int64, len(row))
		for j, v := range row {
			if math.IsInf(v, 1) || i == j {
				q[i][j] = -1
			} else {
				q[i][j] = int64(math.Round(v * 1000))
			}
		}
	}
	return q
}

// baselines computes, for source s, the shortest-path chain (smallest sum,
// then fewest hops, then smallest max), the minimax chain (smallest max,
// then smallest sum, then fewest hops) and the fewest-hops minimax chain
// (smallest max, then fewest hops, then smallest sum) to every destination.
// sp, mm and mh must have len(q) entries; scratch buffers are reused through b.
func (b *baseliner) baselines(q [][]int64, s int, sp, mm, mh []route) {
	n := len(q)
	b.dijkstra(q, s, math.MaxInt64, less, sp)
	// Bottleneck value of every destination (Prim from s).
	bott := b.bott[:n]
	done := b.done[:n]
	for k := range bott {
		bott[k], done[k] = math.MaxInt64, false
	}
	bott[s] = 0
	for {
		u := -1
		for k := 0; k < n; k++ {
			if !done[k] && bott[k] < math.MaxInt64 && (u < 0 || bott[k] < bott[u]) {
				u = k
			}
		}
		if u < 0 {
			break
		}
		done[u] = true
		for v, w := range q[u] {
			if w >= 0 && !done[v] {
				if c := max(bott[u], w); c < bott[v] {
					bott[v] = c
				}
			}
		}
	}
	for k := range mm {
		mm[k], mh[k] = route{}, route{}
	}
	mm[s], mh[s] = route{ok: true}, route{ok: true}
	// One restricted Dijkstra per distinct bottleneck value.
	levels := b.levels[:0]
	for v, c := range bott {
		if v != s && c < math.MaxInt64 {
			levels = append(levels, c)
		}
	}
	slices.Sort(levels)
	levels = slices.Compact(levels)
	b.levels = levels
	tmp := b.tmp[:n]
	for _, lim := range levels {
		b.dijkstra(q, s, lim, less, tmp)
		for v, c := range bott {
			if v != s && c == lim {
				mm[v] = tmp[v]
			}
		}
		b.dijkstra(q, s, lim, lessHops, tmp)
		for v, c := range bott {
			if v != s && c == lim {
				mh[v] = tmp[v]
			}
		}
	}
}

// baseliner holds scratch space for baselines.
type baseliner struct {
	bott   []int64
	done   []bool
	levels []int64
	tmp    []route
}

func newBaseliner(n int) *baseliner {
	return &baseliner{bott: make([]int64, n), done: make([]bool, n), tmp: make([]route, n)}
}

// dijkstra fills out with the smallest chains from s in the order less over
// links of at most lim microseconds (dense O(n^2) Dijkstra). less must be
// monotone under extension: both orders below are, as every extension adds
// one hop and a non-negative RTT.
func (b *baseliner) dijkstra(q [][]int64, s int, lim int64, less func(a, b route) bool, out []route) {
	n := len(q)
	done := b.done[:n]
	for k := range out {
		out[k] = route{}
		done[k] = false
	}
	out[s] = route{ok: true}
	for {
		u := -1
		for k := 0; k < n; k++ {
			if !done[k] && out[k].ok && (u < 0 || less(out[k], out[u])) {
				u = k
			}
		}
		if u < 0 {
			return
		}
		done[u] = true
		ru := out[u]
		for v, w := range q[u] {
			if w < 0 || w > lim || done[v] {
				continue
			}
			c := route{sum: ru.sum + w, max: max(ru.max, w), hops: ru.hops + 1, ok: true}
			if !out[v].ok || less(c, out[v]) {
				out[v] = c
			}
		}
	}
}

// less orders routes by sum, then hops, then max.
func less(a, b route) bool {
	if a.sum != b.sum {
		return a.sum < b.sum
	}
	if a.hops != b.hops {
		return a.hops < b.hops
	}
	return a.max < b.max
}

// mst returns a minimum spanning forest of q as adjacency lists (Prim, ties
// to the lower index). The tree path between two locations is a minimax path:
// the classic bottleneck route, which does not care about the sum of RTTs.
func mst(q [][]int64) [][]int {
	n := len(q)
	adj := make([][]int, n)
	in := make([]bool, n)
	key := make([]int64, n)
	parent := make([]int, n)
	for root := 0; root < n; root++ {
		if in[root] {
			continue
		}
		for k := range key {
			if !in[k] {
				key[k], parent[k] = math.MaxInt64, -1
			}
		}
		key[root] = 0
		for {
			u := -1
			for k := 0; k < n; k++ {
				if !in[k] && key[k] < math.MaxInt64 && (u < 0 || key[k] < key[u]) {
					u = k
				}
			}
			if u < 0 {
				break
			}
			in[u] = true
			if p := parent[u]; p >= 0 {
				adj[u] = append(adj[u], p)
				adj[p] = append(adj[p], u)
			}
			for v, w := range q[u] {
				if w >= 0 && !in[v] && w < key[v] {
					key[v], parent[v] = w, u
				}
			}
		}
	}
	return adj
}

// treeRoutes fills out with the routes from s along the tree adj.
func treeRoutes(q [][]int64, adj [][]int, s int, out []route, stack []int) []int {
	for k := range out {
		out[k] = route{}
	}
	out[s] = route{ok: true}
	stack = append(stack[:0], s)
	for len(stack) > 0 {
		u := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, v := range adj[u] {
			if out[v].ok {
				continue
			}
			w := q[u][v]
			out[v] = route{sum: out[u].sum + w, max: max(out[u].max, w), hops: out[u].hops + 1, ok: true}
			stack = append(stack, v)
		}
	}
	return stack
}

// lessHops orders routes by hops, then sum, then max.
func lessHops(a, b route) bool {
	if a.hops != b.hops {
		return a.hops < b.hops
	}
	if a.sum != b.sum {
		return a.sum < b.sum
	}
	return a.max < b.max
}
