package topo

import (
	"container/heap"
	"fmt"
	"math"
)

// graph is an undirected graph with one-way link delays in milliseconds.
type graph struct {
	names []string
	adj   [][]arc
}

type arc struct {
	to int
	ms float64
}

func newGraph(names []string) *graph {
	return &graph{names: names, adj: make([][]arc, len(names))}
}

// link adds an undirected link, keeping the smaller delay for parallel links.
func (g *graph) link(u, v int, ms float64) {
	if u == v {
		return
	}
	for k, a := range g.adj[u] {
		if a.to == v {
			if ms < a.ms {
				g.adj[u][k].ms = ms
				for l, b := range g.adj[v] {
					if b.to == u {
						g.adj[v][l].ms = ms
					}
				}
			}
			return
		}
	}
	g.adj[u] = append(g.adj[u], arc{v, ms})
	g.adj[v] = append(g.adj[v], arc{u, ms})
}

// largestComponent returns the nodes of the largest connected component in
// increasing order; ties go to the component holding the lowest node.
func (g *graph) largestComponent() []int {
	comp := make([]int, len(g.names))
	for i := range comp {
		comp[i] = -1
	}
	var best []int
	for s := range g.names {
		if comp[s] >= 0 {
			continue
		}
		members := []int{s}
		comp[s] = s
		for k := 0; k < len(members); k++ {
			for _, a := range g.adj[members[k]] {
				if comp[a.to] < 0 {
					comp[a.to] = s
					members = append(members, a.to)
				}
			}
		}
		if len(members) > len(best) {
			best = members
		}
	}
	// members are in BFS order; return them sorted by index.
	in := make([]bool, len(g.names))
	for _, v := range best {
		in[v] = true
	}
	out := best[:0]
	for v, ok := range in {
		if ok {
			out = append(out, v)
		}
	}
	return out
}

// fullMesh turns the graph into an RTT matrix over its largest connected
// component: the RTT of two locations is twice the one-way delay of the
// shortest path between them. It also returns a warning naming the nodes it
// dropped (outside the largest component), or "".
func (g *graph) fullMesh(name string) (*Matrix, string) {
	keep := g.largestComponent()
	warn := ""
	if len(keep) < len(g.names) {
		in := make([]bool, len(g.names))
		for _, v := range keep {
			in[v] = true
		}
		var dropped []string
		for v, ok := range in {
			if !ok {
				dropped = append(dropped, g.names[v])
			}
		}
		warn = fmt.Sprintf("%s: kept the largest connected component (%d of %d nodes); dropped %s", name, len(keep), len(g.names), listed(dropped))
	}
	pos := make([]int, len(g.names))
	for i := range pos {
		pos[i] = -1
	}
	m := &Matrix{Names: make([]string, len(keep)), RTT: make([][]float64, len(keep))}
	for k, v := range keep {
		pos[v] = k
		m.Names[k] = g.names[v]
	}
	dist := make([]float64, len(g.names))
	for k, s := range keep {
		g.dijkstra(s, dist)
		row := make([]float64, len(keep))
		for l, v := range keep {
			row[l] = 2 * dist[v]
		}
		m.RTT[k] = row
	}
	// Dijkstra's sums can differ in the last bit between directions.
	for i := range m.RTT {
		for j := i + 1; j < len(m.RTT); j++ {
			v := math.Min(m.RTT[i][j], m.RTT[j][i])
			m.RTT[i][j], m.RTT[j][i] = v, v
		}
	}
	return m, warn
}

// dijkstra fills dist with the one-way shortest-path delays from s.
func (g *graph) dijkstra(s int, dist []float64) {
	for i := range dist {
		dist[i] = math.Inf(1)
	}
	dist[s] = 0
	q := &arcHeap{{s, 0}}
	for q.Len() > 0 {
		it := heap.Pop(q).(arc)
		if it.ms > dist[it.to] {
			continue
		}
		for _, a := range g.adj[it.to] {
			if d := it.ms + a.ms; d < dist[a.to] {
				dist[a.to] = d
				heap.Push(q, arc{a.to, d})
			}
		}
	}
}

// arcHeap is a min-heap of (node, distance) entries.
type arcHeap []arc

func (h arcHeap) Len() int           { return len(h) }
func (h arcHeap) Less(i, j int) bool { return h[i].ms < h[j].ms }
func (h arcHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *arcHeap) Push(x any)        { *h = append(*h, x.(arc)) }
func (h *arcHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
