package pathcomp

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// allPaths enumerates the simple paths from i to j.
func allPaths(rtt [][]float64, i, j int) [][]int {
	var out [][]int
	var walk func(p []int, seen []bool)
	walk = func(p []int, seen []bool) {
		u := p[len(p)-1]
		if u == j {
			out = append(out, slices.Clone(p))
			return
		}
		for v := range rtt {
			if v != u && !seen[v] && !math.IsInf(rtt[u][v], 1) {
				seen[v] = true
				walk(append(p, v), seen)
				seen[v] = false
			}
		}
	}
	seen := make([]bool, len(rtt))
	seen[i] = true
	walk([]int{i}, seen)
	return out
}

func sparseMatrix(rng *rand.Rand, n int) [][]float64 {
	rtt := make([][]float64, n)
	for a := range rtt {
		rtt[a] = make([]float64, n)
	}
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			v := math.Inf(1)
			if rng.IntN(4) != 0 {
				v = float64(1+rng.IntN(200)) / 2
			}
			rtt[a][b], rtt[b][a] = v, v
		}
	}
	return rtt
}

// TestYenPoolMatchesBruteForce: for one round (additive cost) Yen's pool
// is exactly the cheapest loopless paths; for more rounds its first path
// is the cheapest and every path is loopless and distinct.
func TestYenPoolMatchesBruteForce(t *testing.T) {
	m := Model{}
	for seed := uint64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		n := 2 + rng.IntN(6)
		rtt := sparseMatrix(rng, n)
		i, j := 0, n-1
		all := allPaths(rtt, i, j)
		for _, rounds := range []int{1, 4} {
			costs := make([]float64, len(all))
			for c, p := range all {
				costs[c] = m.Cost(chainOf(rtt, p), rounds)
			}
			sort.Float64s(costs)
			want := 1 + rng.IntN(8)
			pool := yenPool(rtt, i, j, want, rounds)
			if len(all) == 0 {
				if pool != nil {
					t.Fatalf("seed %d: paths for an unreachable pair", seed)
				}
				continue
			}
			if len(pool) != min(want, len(all)) {
				t.Fatalf("seed %d rounds %d: %d paths; want %d of %d", seed, rounds, len(pool), min(want, len(all)), len(all))
			}
			seen := map[string]bool{}
			for k, p := range pool {
				if p.path[0] != i || p.path[len(p.path)-1] != j || seen[pathKey(p.path)] {
					t.Fatalf("seed %d: path %v not a new %d->%d path", seed, p.path, i, j)
				}
				seen[pathKey(p.path)] = true
				nodes := map[int]bool{}
				for _, v := range p.path {
					if nodes[v] {
						t.Fatalf("seed %d: path %v has a loop", seed, p.path)
					}
					nodes[v] = true
				}
				got := m.Cost(chainOf(rtt, p.path), rounds)
				if rounds == 1 && math.Abs(got-costs[k]) > 1e-6 {
					t.Fatalf("seed %d: path %d costs %v; the %d-th cheapest costs %v", seed, k, got, k, costs[k])
				}
			}
			if got := m.Cost(chainOf(rtt, pool[0].path), rounds); math.Abs(got-costs[0]) > 1e-6 {
				t.Fatalf("seed %d rounds %d: first path costs %v; cheapest is %v", seed, rounds, got, costs[0])
			}
		}
	}
}

// TestKChainsPrefersDisjoint: a cheap chain through the same middle link
// loses to a disjoint one, and Shared names the common link.
func TestKChainsPrefersDisjoint(t *testing.T) {
	inf := math.Inf(1)
	// 0 -> 1 -> 2 -> 5 (cheapest), 0 -> 1 -> 3 -> 5... and 0 -> 4 -> 5 (disjoint, dearer).
	rtt := [][]float64{
		{0, 10, inf, inf, 40, inf},
		{10, 0, 10, 12, inf, inf},
		{inf, 10, 0, inf, inf, 10},
		{inf, 12, inf, 0, inf, 10},
		{40, inf, inf, inf, 0, 40},
		{inf, inf, 10, 10, 40, 0},
	}
	got := KChains(rtt, 0, 5, 3, 1, Model{})
	if len(got) != 3 {
		t.Fatalf("KChains = %d chains; want 3", len(got))
	}
	if !slices.Equal(got[0].Path, []int{0, 1, 2, 5}) || got[0].Shared != nil {
		t.Errorf("first = %v shared %v; want [0 1 2 5] sharing nothing", got[0].Path, got[0].Shared)
	}
	if !slices.Equal(got[1].Path, []int{0, 4, 5}) || got[1].Shared != nil {
		t.Errorf("second = %v shared %v; want the disjoint [0 4 5]", got[1].Path, got[1].Shared)
	}
	if !slices.Equal(got[2].Path, []int{0, 1, 3, 5}) || !slices.Equal(got[2].Shared, [][2]int{{0, 1}}) {
		t.Errorf("third = %v shared %v; want [0 1 3 5] sharing link 0-1", got[2].Path, got[2].Shared)
	}
	if got[0].Cost != 15 {
		t.Errorf("cost of the first = %v; want 15 (half of 30 ms, one round)", got[0].Cost)
	}
	for _, bad := range []struct{ i, j, k int }{{0, 0, 1}, {0, 5, 0}, {-1, 5, 1}, {0, 6, 1}} {
		if KChains(rtt, bad.i, bad.j, bad.k, 1, Model{}) != nil {
			t.Errorf("KChains(%d, %d, k=%d) not nil", bad.i, bad.j, bad.k)
		}
	}
}
