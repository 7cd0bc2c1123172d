package pathcomp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var inf = math.Inf(1)

// randomMatrix returns a symmetric n x n RTT matrix. kind selects the value
// distribution: small integers (many ties and zeros), decimals with
// triangle-inequality violations, or Euclidean points (metric, few ties).
// missing is the probability of a missing link.
func randomMatrix(rng *rand.Rand, n, kind int, missing float64) [][]float64 {
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
	}
	xs := make([]float64, n)
	ys := make([]float64, n)
	for i := range xs {
		xs[i], ys[i] = rng.Float64()*100, rng.Float64()*100
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			var v float64
			switch kind {
			case 0:
				v = float64(rng.IntN(6))
			case 1:
				v = math.Round(rng.Float64()*200*1000) / 1000
			default:
				v = math.Round(math.Hypot(xs[i]-xs[j], ys[i]-ys[j])*1000)/1000 + float64(rng.IntN(3))
			}
			if rng.Float64() < missing {
				v = inf
			}
			m[i][j], m[j][i] = v, v
		}
	}
	return m
}

// pathStat is the measure of one simple path.
type pathStat struct{ sum, mx, hops int64 }

// allPathStats enumerates every simple path from i of at most maxHops links
// (0: any) and returns, per destination and per possible Max value
// (ascending), the path with the smallest sum, and the fewest hops among
// those (sum < 0: no such path).
func allPathStats(rtt [][]float64, i, maxHops int) [][]pathStat {
	n := len(rtt)
	var vals []int64
	for u := range rtt {
		for v := range rtt {
			if u != v && !math.IsInf(rtt[u][v], 1) {
				vals = append(vals, micros(rtt[u][v]))
			}
		}
	}
	vals = append(vals, 0)
	slices.Sort(vals)
	vals = slices.Compact(vals)
	rank := make([][]int, n)
	for u := range rank {
		rank[u] = make([]int, n)
		for v := range rank[u] {
			rank[u][v] = -1
			if u != v && !math.IsInf(rtt[u][v], 1) {
				rank[u][v], _ = slices.BinarySearch(vals, micros(rtt[u][v]))
			}
		}
	}
	out := make([][]pathStat, n)
	for v := range out {
		out[v] = make([]pathStat, len(vals))
		for k := range out[v] {
			out[v][k] = pathStat{sum: -1, mx: vals[k]}
		}
	}
	out[i][0] = pathStat{}
	on := make([]bool, n)
	on[i] = true
	var walk func(u int, sum int64, mr int, hops int64)
	walk = func(u int, sum int64, mr int, hops int64) {
		if maxHops > 0 && hops >= int64(maxHops) {
			return
		}
		for v := 0; v < n; v++ {
			r := rank[u][v]
			if on[v] || r < 0 {
				continue
			}
			s, m := sum+vals[r], max(mr, r)
			if b := &out[v][m]; b.sum < 0 || s < b.sum || s == b.sum && hops+1 < b.hops {
				b.sum, b.hops = s, hops+1
			}
			on[v] = true
			walk(v, s, m, hops+1)
			on[v] = false
		}
	}
	walk(i, 0, 0, 0)
	for v := range out {
		out[v] = slices.DeleteFunc(out[v], func(p pathStat) bool { return p.sum < 0 })
	}
	return out
}

// checkPath fails unless c.Path is a simple path from i to j over existing
// links whose measured Sum and Max are c's.
func checkPath(t testing.TB, rtt [][]float64, i, j int, c Chain) {
	t.Helper()
	p := c.Path
	if len(p) == 0 || p[0] != i || p[len(p)-1] != j {
		t.Fatalf("path %v does not run from %d to %d", p, i, j)
	}
	seen := map[int]bool{}
	for k, v := range p {
		if seen[v] {
			t.Fatalf("path %v is not simple", p)
		}
		seen[v] = true
		if k > 0 && math.IsInf(rtt[p[k-1]][v], 1) {
			t.Fatalf("path %v uses missing link %d-%d", p, p[k-1], v)
		}
	}
	got := chainOf(rtt, p)
	if got.Sum != c.Sum || got.Max != c.Max {
		t.Fatalf("path %v measures sum %v max %v; chain says %v %v", p, got.Sum, got.Max, c.Sum, c.Max)
	}
}

// twiceCost is 2*Model.Cost in whole microseconds, exact.
func twiceCost(c Chain, rounds int) int64 {
	return micros(c.Sum) + int64(2*(rounds-1))*micros(c.Max)
}

func checkAgainstBruteForce(t testing.TB, rtt [][]float64, f *Fronts) {
	t.Helper()
	n := len(rtt)
	maxHops := 0
	if f.MaxProxies() > 0 {
		maxHops = f.MaxProxies() + 1
	}
	rounds := make([]int, 12)
	for r := range rounds {
		rounds[r] = r + 1
	}
	picks := make([]int, len(rounds))
	for i := 0; i < n; i++ {
		stats := allPathStats(rtt, i, maxHops)
		for j := 0; j < n; j++ {
			paths := stats[j]
			front := f.Front(i, j)
			// The brute-force front: going up in Max, keep each best path
			// whose sum is below all kept so far; list by increasing Sum.
			var bf []pathStat
			for _, p := range paths {
				if len(bf) == 0 || p.sum < bf[len(bf)-1].sum {
					bf = append(bf, p)
				}
			}
			slices.Reverse(bf)
			if len(front) != len(bf) {
				t.Fatalf("Front(%d,%d) has %d entries, brute force %d\nfront %v\nbrute %v\nrtt %v", i, j, len(front), len(bf), front, bf, rtt)
			}
			for k := range front {
				g, w := front[k], bf[k]
				if micros(g.Sum) != w.sum || micros(g.Max) != w.mx || int64(len(g.Path)-1) != w.hops {
					t.Fatalf("Front(%d,%d)[%d] = %v; brute force %v\nrtt %v", i, j, k, g, w, rtt)
				}
				checkPath(t, rtt, i, j, g)
			}
			okEach := f.BestEach(i, j, rounds, picks)
			if okEach != (len(paths) > 0 && i != j) {
				t.Fatalf("BestEach(%d,%d) ok = %v with %d paths", i, j, okEach, len(paths))
			}
			for r := 1; r <= 12; r++ {
				c, ok := f.Best(i, j, r)
				if okEach {
					if pc := f.AppendPick(nil, i, j, picks[r-1]); pc.Sum != c.Sum || pc.Max != c.Max || !slices.Equal(pc.Path, c.Path) {
						t.Fatalf("AppendPick(BestEach(%d,%d)[%d]) = %v; Best %v", i, j, r, pc, c)
					}
				}
				if ok != (len(paths) > 0) {
					t.Fatalf("Best(%d,%d,%d) ok = %v with %d paths", i, j, r, ok, len(paths))
				}
				if !ok {
					continue
				}
				checkPath(t, rtt, i, j, c)
				r2 := int64(2 * (r - 1))
				want := paths[0]
				for _, p := range paths[1:] {
					if tc, tw := p.sum+r2*p.mx, want.sum+r2*want.mx; tc < tw || tc == tw && p.hops < want.hops {
						want = p
					}
				}
				if twiceCost(c, r) != want.sum+r2*want.mx || int64(len(c.Path)-1) != want.hops {
					t.Fatalf("Best(%d,%d,%d) = %v; want %v\nrtt %v", i, j, r, c, want, rtt)
				}
			}
		}
	}
}

func TestBruteForceExported(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for it := 0; it < 50; it++ {
		rtt := randomMatrix(rng, 1+rng.IntN(7), it%3, 0.2)
		f, err := Precompute(rtt, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range rtt {
			for j := range rtt {
				bf, fr := BruteForce(rtt, i, j), f.Front(i, j)
				if len(bf) != len(fr) {
					t.Fatalf("BruteForce(%d,%d) = %v; Front %v", i, j, bf, fr)
				}
				for k := range bf {
					checkPath(t, rtt, i, j, bf[k])
					if bf[k].Sum != fr[k].Sum || bf[k].Max != fr[k].Max || len(bf[k].Path) != len(fr[k].Path) {
						t.Fatalf("BruteForce(%d,%d) = %v; Front %v", i, j, bf, fr)
					}
				}
			}
		}
	}
}

func TestFrontsMatchBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	count := 2000
	switch {
	case testing.Short():
		count = 200
	case raceEnabled:
		count = 600
	}
	for it := 0; it < count; it++ {
		n := 1 + rng.IntN(8)
		if it%50 == 0 {
			n = 9
		}
		kind := it % 3
		missing := []float64{0, 0.2, 0.5}[rng.IntN(3)]
		rtt := randomMatrix(rng, n, kind, missing)
		plain := it%2 == 1
		f, err := Precompute(rtt, Options{Plain: plain})
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstBruteForce(t, rtt, f)
	}
}

// sameFronts fails unless two precomputations hold identical fronts.
func sameFronts(t testing.TB, a, b *Fronts) {
	t.Helper()
	if !slices.Equal(a.start, b.start) || !slices.Equal(a.key, b.key) || !slices.Equal(a.link, b.link) {
		t.Fatalf("fronts differ: %d vs %d entries", len(a.key), len(b.key))
	}
	for i := 0; i < a.n; i++ {
		for j := 0; j < a.n; j++ {
			fa, fb := a.Front(i, j), b.Front(i, j)
			if fmt.Sprint(fa) != fmt.Sprint(fb) {
				t.Fatalf("Front(%d,%d): %v vs %v", i, j, fa, fb)
			}
		}
	}
}

func TestPrunedEqualsPlain(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	sizes := []int{10, 20, 35, 60}
	for _, n := range sizes {
		for kind := 0; kind < 3; kind++ {
			for _, missing := range []float64{0, 0.3} {
				rtt := randomMatrix(rng, n, kind, missing)
				p, err := Precompute(rtt, Options{})
				if err != nil {
					t.Fatal(err)
				}
				q, err := Precompute(rtt, Options{Plain: true})
				if err != nil {
					t.Fatal(err)
				}
				sameFronts(t, p, q)
				// Spot-check against the baselines: the 1-round best is the
				// shortest path, and the last front entry's Max is the
				// minimax value.
				for k := 0; k < 20; k++ {
					i, j := rng.IntN(n), rng.IntN(n)
					sp, ok1 := ShortestPath(rtt, i, j)
					b, ok2 := p.Best(i, j, 1)
					if ok1 != ok2 || ok1 && (sp.Sum != b.Sum || len(sp.Path) != len(b.Path)) {
						t.Fatalf("n=%d Best(%d,%d,1) = %v %v; ShortestPath %v %v", n, i, j, b, ok2, sp, ok1)
					}
					mm, ok3 := Minimax(rtt, i, j)
					fr := p.Front(i, j)
					if ok3 != (len(fr) > 0) || ok3 && (mm.Max != fr[len(fr)-1].Max || mm.Sum != fr[len(fr)-1].Sum) {
						t.Fatalf("n=%d Minimax(%d,%d) = %v; front %v", n, i, j, mm, fr)
					}
				}
			}
		}
	}
}

func TestDegenerate(t *testing.T) {
	tests := []struct {
		name    string
		rtt     [][]float64
		i, j    int
		ok      bool
		sum     float64
		path    []int
		wantErr bool
	}{
		{name: "empty", rtt: [][]float64{}, i: 0, j: 0, ok: false},
		{name: "n=1", rtt: [][]float64{{0}}, i: 0, j: 0, ok: true, path: []int{0}},
		{name: "n=2 linked", rtt: [][]float64{{0, 5}, {5, 0}}, i: 0, j: 1, ok: true, sum: 5, path: []int{0, 1}},
		{name: "n=2 disconnected", rtt: [][]float64{{0, inf}, {inf, 0}}, i: 1, j: 0, ok: false},
		{name: "zero rtts", rtt: [][]float64{{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}, i: 2, j: 0, ok: true, path: []int{2, 0}},
		{name: "huge rtts", rtt: [][]float64{{0, MaxRTT, 1}, {MaxRTT, 0, MaxRTT}, {1, MaxRTT, 0}}, i: 0, j: 1, ok: true, sum: MaxRTT, path: []int{0, 1}},
		{name: "disconnected components", rtt: [][]float64{{0, 1, inf, inf}, {1, 0, inf, inf}, {inf, inf, 0, 2}, {inf, inf, 2, 0}}, i: 0, j: 3, ok: false},
		{name: "out of range", rtt: [][]float64{{0, 1}, {1, 0}}, i: 0, j: 2, ok: false},
		{name: "negative", rtt: [][]float64{{0, -1}, {-1, 0}}, wantErr: true},
		{name: "NaN", rtt: [][]float64{{0, math.NaN()}, {math.NaN(), 0}}, wantErr: true},
		{name: "too huge", rtt: [][]float64{{0, 2 * MaxRTT}, {2 * MaxRTT, 0}}, wantErr: true},
		{name: "asymmetric", rtt: [][]float64{{0, 1}, {2, 0}}, wantErr: true},
		{name: "ragged", rtt: [][]float64{{0, 1}, {1}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, plain := range []bool{false, true} {
				f, err := Precompute(tt.rtt, Options{Plain: plain})
				if (err != nil) != tt.wantErr {
					t.Fatalf("Precompute error = %v; want error %v", err, tt.wantErr)
				}
				if err != nil {
					return
				}
				for r := 1; r <= 3; r++ {
					c, ok := f.Best(tt.i, tt.j, r)
					if ok != tt.ok {
						t.Fatalf("Best(%d,%d,%d) ok = %v; want %v", tt.i, tt.j, r, ok, tt.ok)
					}
					if ok && (c.Sum != tt.sum || !slices.Equal(c.Path, tt.path)) {
						t.Fatalf("Best(%d,%d,%d) = %v; want sum %v path %v", tt.i, tt.j, r, c, tt.sum, tt.path)
					}
				}
				if c, ok := f.Best(tt.i, tt.j, math.MaxInt); ok != tt.ok || ok && !slices.Equal(c.Path, tt.path) {
					t.Fatalf("Best(%d,%d,MaxInt) = %v, %v; want path %v", tt.i, tt.j, c, ok, tt.path)
				}
				if !tt.ok && len(f.Front(tt.i, tt.j)) != 0 {
					t.Fatalf("Front(%d,%d) = %v; want empty", tt.i, tt.j, f.Front(tt.i, tt.j))
				}
			}
		})
	}
}

func TestBestAppendAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rtt := randomMatrix(rng, 60, 1, 0)
	f, err := Precompute(rtt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]int, 0, 64)
	var sink float64
	allocs := testing.AllocsPerRun(1000, func() {
		for r := 1; r <= 10; r++ {
			c, _ := f.BestAppend(buf, 3, 41, r)
			sink += c.Sum
		}
	})
	if allocs != 0 {
		t.Errorf("BestAppend allocates %v times per run; want 0", allocs)
	}
	_ = sink
}

// FuzzFronts checks the planner's invariants on small matrices built from
// the fuzzer's bytes: fronts equal the brute-force fronts, Best is optimal,
// pruned equals plain.
func FuzzFronts(f *testing.F) {
	f.Add([]byte{3, 1, 2, 3})
	f.Add([]byte{5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{6, 255, 10, 20, 30, 40, 50, 255, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{5, 1, 9, 9, 9, 1, 9, 9, 1, 9, 1, 1})                // a line of cheap links, 1 proxy
	f.Add([]byte{6, 1, 8, 8, 8, 8, 1, 8, 8, 8, 1, 8, 8, 1, 8, 1, 2}) // 2 proxies
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		n := int(data[0])%7 + 1
		data = data[1:]
		rtt := make([][]float64, n)
		for i := range rtt {
			rtt[i] = make([]float64, n)
		}
		k := 0
		for i := 0; i < n; i++ {
			for j := i + 1; j < n; j++ {
				v := inf
				if k < len(data) && data[k] != 255 {
					v = float64(data[k]) / 4
				}
				k++
				rtt[i][j], rtt[j][i] = v, v
			}
		}
		// The byte after the matrix, if any, bounds the proxies (0-3).
		mp := 0
		if k < len(data) {
			mp = int(data[k]) % 4
		}
		p, err := Precompute(rtt, Options{MaxProxies: mp})
		if err != nil {
			t.Fatal(err)
		}
		q, err := Precompute(rtt, Options{Plain: true, MaxProxies: mp})
		if err != nil {
			t.Fatal(err)
		}
		sameFronts(t, p, q)
		checkAgainstBruteForce(t, rtt, p)
	})
}
