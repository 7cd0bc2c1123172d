package planeval

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/topo"
)

// randomMatrix returns a symmetric n x n RTT matrix with triangle-inequality
// violations, missing links (probability miss) and ties.
func randomMatrix(rng *rand.Rand, n int, miss float64) [][]float64 {
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			v := math.Inf(1)
			if rng.Float64() >= miss {
				v = float64(rng.IntN(20)) * 5 // ties and zeros
				if rng.IntN(4) == 0 {
					v = rng.Float64() * 300
				}
			}
			m[i][j], m[j][i] = v, v
		}
	}
	return m
}

// TestBaselinesMatchPathcomp checks the per-source baselines against
// pathcomp's per-pair ShortestPath and Minimax.
func TestBaselinesMatchPathcomp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 300; iter++ {
		n := 1 + rng.IntN(12)
		rtt := randomMatrix(rng, n, rng.Float64()*0.6)
		q := quantise(rtt)
		bl := newBaseliner(n)
		sp, mm, mh, tr := make([]route, n), make([]route, n), make([]route, n), make([]route, n)
		tree := mst(q)
		for i := 0; i < n; i++ {
			bl.baselines(q, i, sp, mm, mh)
			treeRoutes(q, tree, i, tr, nil)
			for j := 0; j < n; j++ {
				if i == j {
					continue
				}
				want, ok := pathcomp.ShortestPath(rtt, i, j)
				if ok != sp[j].ok {
					t.Fatalf("iter %d: %d->%d: shortest reachable %v; pathcomp says %v", iter, i, j, sp[j].ok, ok)
				}
				if !ok {
					if mm[j].ok || tr[j].ok {
						t.Fatalf("iter %d: %d->%d unreachable but minimax found a chain", iter, i, j)
					}
					continue
				}
				if ms(sp[j].sum) != want.Sum || sp[j].proxies() != want.Proxies() {
					t.Errorf("iter %d: %d->%d shortest sum %v proxies %d; pathcomp %v %d", iter, i, j, ms(sp[j].sum), sp[j].proxies(), want.Sum, want.Proxies())
				}
				wm, _ := pathcomp.Minimax(rtt, i, j)
				if ms(mm[j].max) != wm.Max || ms(mm[j].sum) != wm.Sum || mm[j].proxies() != wm.Proxies() {
					t.Errorf("iter %d: %d->%d minimax (max %v sum %v proxies %d); pathcomp (%v %v %d)", iter, i, j, ms(mm[j].max), ms(mm[j].sum), mm[j].proxies(), wm.Max, wm.Sum, wm.Proxies())
				}
				// Fewest-hops minimax: same max, no more hops, no smaller sum.
				if !mh[j].ok || mh[j].max != mm[j].max || mh[j].hops > mm[j].hops || mh[j].sum < mm[j].sum {
					t.Errorf("iter %d: %d->%d fewest-hops minimax %+v; minimax %+v", iter, i, j, mh[j], mm[j])
				}
				// The tree path is a minimax path too, but may be longer.
				if !tr[j].ok || tr[j].max != mm[j].max || tr[j].sum < mm[j].sum {
					t.Errorf("iter %d: %d->%d tree route %+v; minimax %+v", iter, i, j, tr[j], mm[j])
				}
			}
		}
	}
}

func ms(us int64) float64 { return float64(us) / 1000 }

func TestRunRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var graphs []topo.Graph
	for k := 0; k < 20; k++ {
		n := 2 + rng.IntN(15)
		graphs = append(graphs, topo.Graph{Name: "random", Matrix: &topo.Matrix{Names: make([]string, n), RTT: randomMatrix(rng, n, 0.3)}})
	}
	res, err := Run(context.Background(), graphs, []int{1, 3, 10})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res)
	// Count reachable ordered pairs independently.
	want := 0
	for _, g := range graphs {
		n := g.Matrix.Len()
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				if _, ok := pathcomp.ShortestPath(g.Matrix.RTT, i, j); ok && i != j {
					want++
				}
			}
		}
	}
	if res.Pairs != want {
		t.Errorf("Pairs = %d; want %d reachable ordered pairs", res.Pairs, want)
	}
}

// checkResult asserts what must hold for any correct planner.
func checkResult(t *testing.T, res *Result) {
	t.Helper()
	for _, s := range res.Series {
		if s.Worse != 0 {
			t.Errorf("rounds %d: %d pairs where the planner lost to a baseline", s.Rounds, s.Worse)
		}
		for _, c := range s.curves() {
			if len(c.xs) != res.Pairs {
				t.Errorf("rounds %d %s: %d samples; want %d", s.Rounds, c.label, len(c.xs), res.Pairs)
			}
			if len(c.xs) > 0 && c.xs[0] < 0 {
				t.Errorf("rounds %d %s: negative improvement %v", s.Rounds, c.label, c.xs[0])
			}
		}
		if s.Rounds == 1 {
			// One round: the planner's optimum is the shortest path.
			if q := Quantile(s.VsShortest, 1); q != 0 {
				t.Errorf("1 round: max improvement over shortest path %v; want 0", q)
			}
			if s.ProxiesOurs != s.ProxiesShortest {
				t.Errorf("1 round: %v proxies; shortest path uses %v", s.ProxiesOurs, s.ProxiesShortest)
			}
		}
		if s.ProxiesHopsMinimax > s.ProxiesMinimax+1e-12 || s.ProxiesHopsMinimax > s.ProxiesMSTMinimax+1e-12 {
			t.Errorf("rounds %d: fewest-hops minimax %v proxies > minimax %v or MST %v", s.Rounds, s.ProxiesHopsMinimax, s.ProxiesMinimax, s.ProxiesMSTMinimax)
		}
	}
}

func TestRunEmbedded(t *testing.T) {
	graphs, err := topo.EvalGraphs(7, 115)
	if err != nil {
		t.Fatal(err)
	}
	if testing.Short() {
		graphs = graphs[:10]
	}
	res, err := Run(context.Background(), graphs, DefaultRounds())
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res)
	if len(res.Graphs) != len(graphs) {
		t.Errorf("%d graphs evaluated; want %d", len(res.Graphs), len(graphs))
	}
	// Metric full meshes: for 1 round the shortest path is the direct link,
	// and minimax chains are worse for a sizeable share of pairs (the paper:
	// more than 40% worse for 10% of pairs).
	s1 := res.Series[0]
	if s1.ProxiesShortest != 0 {
		t.Errorf("1 round: shortest paths use %v proxies on a metric closure; want 0", s1.ProxiesShortest)
	}
	if f := FractionAbove(s1.VsMinimax, 0.10); f < 0.05 {
		t.Errorf("1 round: minimax worse by > 10%% for %.3f of pairs; want a sizeable share", f)
	}
	// More rounds: mosto beats the shortest path for most pairs and uses
	// fewer proxies than minimax.
	for _, s := range res.Series[1:] {
		if f := FractionAbove(s.VsShortest, 0); f < 0.5 {
			t.Errorf("%d rounds: better than shortest path for %.3f of pairs; want most", s.Rounds, f)
		}
		if s.ProxiesOurs > s.ProxiesMinimax {
			t.Errorf("%d rounds: %v proxies > minimax %v", s.Rounds, s.ProxiesOurs, s.ProxiesMinimax)
		}
	}
}

func TestRunErrors(t *testing.T) {
	g := []topo.Graph{{Name: "g", Matrix: &topo.Matrix{Names: []string{"a", "b"}, RTT: [][]float64{{0, 1}, {1, 0}}}}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, g, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Run(cancelled) = %v; want context.Canceled", err)
	}
	if _, err := Run(context.Background(), nil, nil); err == nil {
		t.Error("Run(no graphs) succeeded")
	}
	if _, err := Run(context.Background(), g, []int{0}); err == nil {
		t.Error("Run(rounds 0) succeeded")
	}
	asym := []topo.Graph{{Name: "bad", Matrix: &topo.Matrix{Names: []string{"a", "b"}, RTT: [][]float64{{0, 1}, {2, 0}}}}}
	if _, err := Run(context.Background(), asym, nil); err == nil || !strings.Contains(err.Error(), "bad") {
		t.Errorf("Run(asymmetric) = %v; want an error naming the graph", err)
	}
	disc := []topo.Graph{{Name: "d", Matrix: &topo.Matrix{Names: []string{"a", "b"}, RTT: [][]float64{{0, math.Inf(1)}, {math.Inf(1), 0}}}}}
	if _, err := Run(context.Background(), disc, nil); err == nil {
		t.Error("Run(disconnected only) succeeded")
	}
}

func TestQuantile(t *testing.T) {
	xs := []float64{0, 0, 0.1, 0.2, 0.5}
	tests := []struct {
		q, want float64
	}{{0, 0}, {0.4, 0}, {0.5, 0.1}, {0.8, 0.2}, {1, 0.5}}
	for _, tt := range tests {
		if got := Quantile(xs, tt.q); got != tt.want {
			t.Errorf("Quantile(%v) = %v; want %v", tt.q, got, tt.want)
		}
	}
	above := []struct{ x, want float64 }{{-1, 1}, {0, 0.6}, {0.1, 0.4}, {0.15, 0.4}, {0.5, 0}}
	for _, tt := range above {
		if got := FractionAbove(xs, tt.x); got != tt.want {
			t.Errorf("FractionAbove(%v) = %v; want %v", tt.x, got, tt.want)
		}
	}
	if !math.IsNaN(Quantile(nil, 0.5)) || !math.IsNaN(FractionAbove(nil, 0)) {
		t.Error("empty input: want NaN")
	}
}

func TestReports(t *testing.T) {
	graphs, err := topo.EvalGraphs(7, 30)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), graphs[:4], DefaultRounds())
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := res.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML with one polyline per curve and panel.
	d := xml.NewDecoder(&svg)
	polylines := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 9 {
		t.Errorf("SVG has %d polylines; want 3 panels x 3 curves", polylines)
	}
	var md bytes.Buffer
	if err := res.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 1 | shortest path | 0.0% |", "| 5 | minimax |", "| 10 | minimax (MST path) |", "## Number of proxies", "| " + graphs[0].Name + " |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	var sum bytes.Buffer
	if err := res.WriteSummary(&sum); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sum.String(), "4 graphs") {
		t.Errorf("summary: %s", sum.String())
	}
}

func TestXDecades(t *testing.T) {
	tests := []struct {
		xs []float64
		hi int
	}{{[]float64{0, 0.5}, 0}, {[]float64{0, 3.4}, 1}, {[]float64{10}, 1}, {[]float64{0, 11, math.Inf(1)}, 2}}
	for _, tt := range tests {
		lo, hi := xDecades([]curve{{xs: tt.xs}})
		if lo != -3 || hi != tt.hi {
			t.Errorf("xDecades(%v) = %d, %d; want -3, %d", tt.xs, lo, hi, tt.hi)
		}
	}
}
