package stats

import (
	"math"
	"testing"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestDescriptive(t *testing.T) {
	tests := []struct {
		name string
		fn   func([]float64) float64
		xs   []float64
		want float64
	}{
		{"mean", Mean, []float64{1, 2, 3, 4}, 2.5},
		{"sd", SD, []float64{2, 4, 4, 4, 5, 5, 7, 9}, math.Sqrt(32.0 / 7)},
		{"sd one", SD, []float64{3}, 0},
		{"median odd", Median, []float64{5, 1, 3}, 3},
		{"median even", Median, []float64{4, 1, 3, 2}, 2.5},
		{"p5", func(x []float64) float64 { return Percentile(x, 5) }, []float64{1, 2, 3, 4, 5}, 1.2},
		{"p95", func(x []float64) float64 { return Percentile(x, 95) }, []float64{5, 4, 3, 2, 1}, 4.8},
		{"p100", func(x []float64) float64 { return Percentile(x, 100) }, []float64{5, 4, 3, 2, 1}, 5},
		{"p0", func(x []float64) float64 { return Percentile(x, 0) }, []float64{5, 4, 3, 2, 1}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.fn(tc.xs); !near(got, tc.want, 1e-12) {
				t.Errorf("%s(%v) = %v; want %v", tc.name, tc.xs, got, tc.want)
			}
		})
	}
	for _, fn := range []func([]float64) float64{Mean, SD, Median} {
		if got := fn(nil); !math.IsNaN(got) {
			t.Errorf("statistic of no samples = %v; want NaN", got)
		}
	}
	if got := Percentile([]float64{1}, 101); !math.IsNaN(got) {
		t.Errorf("Percentile(101) = %v; want NaN", got)
	}
}

func TestSummarize(t *testing.T) {
	xs := []float64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5}
	s, err := Summarize(xs)
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{N: 10, Mean: 5.5, SD: math.Sqrt(82.5 / 9), Min: 1, P5: 1.45, Median: 5.5, P95: 9.55, Max: 10}
	if s.N != want.N || !near(s.Mean, want.Mean, 1e-12) || !near(s.SD, want.SD, 1e-12) || s.Min != want.Min ||
		!near(s.P5, want.P5, 1e-12) || s.Median != want.Median || !near(s.P95, want.P95, 1e-12) || s.Max != want.Max {
		t.Errorf("Summarize(%v) = %+v; want %+v", xs, s, want)
	}
	if xs[0] != 10 {
		t.Errorf("Summarize modified its input")
	}
	if _, err := Summarize(nil); err == nil {
		t.Errorf("Summarize(nil) succeeded; want error")
	}
	if _, err := Summarize([]float64{1, math.NaN()}); err == nil {
		t.Errorf("Summarize with NaN succeeded; want error")
	}
}

func TestA12(t *testing.T) {
	tests := []struct {
		name   string
		x1, x2 []float64
		want   float64
	}{
		// Pairs (a,b) with a>b: (3,2); ties: (2,2),(3,3). (1 + 2/2) / 9.
		{"brief example", []float64{1, 2, 3}, []float64{2, 3, 4}, 2.0 / 9},
		{"reverse", []float64{2, 3, 4}, []float64{1, 2, 3}, 7.0 / 9},
		{"same", []float64{1, 2, 3}, []float64{1, 2, 3}, 0.5},
		{"all smaller", []float64{1, 2}, []float64{3, 4, 5}, 0},
		{"all larger", []float64{10}, []float64{3, 4, 5}, 1},
		{"all tied", []float64{7, 7}, []float64{7, 7, 7}, 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := A12(tc.x1, tc.x2); !near(got, tc.want, 1e-12) {
				t.Errorf("A12(%v, %v) = %v; want %v", tc.x1, tc.x2, got, tc.want)
			}
		})
	}
	if got := A12(nil, []float64{1}); !math.IsNaN(got) {
		t.Errorf("A12(nil, ...) = %v; want NaN", got)
	}
}

func TestMannWhitneyU(t *testing.T) {
	tests := []struct {
		name   string
		x1, x2 []float64
		u1     float64
		p      float64
		exact  bool
	}{
		// Fully separated samples of 3: 2 of the C(6,3)=20 arrangements are as
		// extreme, so the two-sided exact p is 0.1.
		{"separated", []float64{1, 2, 3}, []float64{4, 5, 6}, 0, 0.1, true},
		// R's ?wilcox.test example (Hollander & Wolfe 1973, p. 69):
		// W = 35, one-sided p = 0.1272; two-sided = 764/3003.
		{"R example",
			[]float64{0.80, 0.83, 1.89, 1.04, 1.45, 1.38, 1.91, 1.64, 0.73, 1.46},
			[]float64{1.15, 0.88, 0.90, 0.74, 1.21},
			35, 764.0 / 3003, true},
		// With ties: U1 = 7 by counting pairs, tie term 2 groups of 2 -> 12,
		// var = 30/12*(12 - 12/110) = 29.3182, z = (|7-15|-0.5)/sqrt(var) =
		// 1.38514, p = erfc(z/√2) = 0.166011 (computed by hand).
		{"ties normal", []float64{1, 2, 2, 3, 7}, []float64{2, 4, 5, 5, 6, 8}, 7, 0.16601056437093303, false},
		{"identical", []float64{5, 5, 5}, []float64{5, 5}, 3, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MannWhitneyU(tc.x1, tc.x2)
			if err != nil {
				t.Fatal(err)
			}
			n := float64(len(tc.x1) * len(tc.x2))
			if got.U1 != tc.u1 || got.U1+got.U2 != n || got.Exact != tc.exact || !near(got.P, tc.p, 1e-9) {
				t.Errorf("MannWhitneyU(%v, %v) = %+v; want U1=%v P=%v exact=%v", tc.x1, tc.x2, got, tc.u1, tc.p, tc.exact)
			}
		})
	}
	if _, err := MannWhitneyU(nil, []float64{1}); err == nil {
		t.Errorf("MannWhitneyU(nil, ...) succeeded; want error")
	}
}

// TestMannWhitneyLarge checks the normal approximation on large samples
// without ties against its closed form and against the exact p-value of a
// sample just small enough to be exact.
func TestMannWhitneyLarge(t *testing.T) {
	var x1, x2 []float64
	for i := 0; i < 30; i++ {
		x1 = append(x1, float64(2*i))   // evens
		x2 = append(x2, float64(2*i+3)) // odds shifted up
	}
	got, err := MannWhitneyU(x1, x2)
	if err != nil {
		t.Fatal(err)
	}
	// U1 = #pairs 2i > 2j+3  <=> i - j >= 2: sum over i of max(0, i-1).
	var u1 float64
	for i := 0; i < 30; i++ {
		u1 += math.Max(0, float64(i-1))
	}
	sigma := math.Sqrt(30 * 30 * 61 / 12.0)
	z := (math.Abs(u1-450) - 0.5) / sigma
	if got.Exact || got.U1 != u1 || !near(got.P, math.Erfc(z/math.Sqrt2), 1e-12) {
		t.Errorf("MannWhitneyU(large) = %+v; want U1=%v P=%v normal", got, u1, math.Erfc(z/math.Sqrt2))
	}
	if got.Z >= 0 {
		t.Errorf("Z = %v; want negative (x1 smaller)", got.Z)
	}
	// Exact and normal agree roughly at n1 = n2 = 20.
	y1, y2 := x1[:20], x2[:20]
	ex, _ := MannWhitneyU(y1, y2)
	if !ex.Exact {
		t.Fatalf("20x20 not exact")
	}
	n := 40.0
	zz := (math.Abs(ex.U1-200) - 0.5) / math.Sqrt(400/12.0*(n+1))
	if pn := math.Erfc(zz / math.Sqrt2); math.Abs(pn-ex.P) > 0.01 {
		t.Errorf("exact p %v and normal p %v differ by more than 0.01", ex.P, pn)
	}
}

func FuzzMannWhitney(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte{4, 5, 6})
	f.Add([]byte{1, 1, 1}, []byte{1})
	f.Add([]byte{9, 3, 200, 7}, []byte{3, 3, 4})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if len(a) == 0 || len(b) == 0 || len(a) > 64 || len(b) > 64 {
			return
		}
		x1, x2 := make([]float64, len(a)), make([]float64, len(b))
		for i, v := range a {
			x1[i] = float64(v)
		}
		for i, v := range b {
			x2[i] = float64(v)
		}
		r, err := MannWhitneyU(x1, x2)
		if err != nil {
			t.Fatal(err)
		}
		n := float64(len(a) * len(b))
		if r.U1 < 0 || r.U2 < 0 || math.Abs(r.U1+r.U2-n) > 1e-9 {
			t.Fatalf("U1=%v U2=%v n1n2=%v", r.U1, r.U2, n)
		}
		if !(r.P > 0 && r.P <= 1) {
			t.Fatalf("P = %v; want in (0,1]", r.P)
		}
		r2, _ := MannWhitneyU(x2, x1)
		if math.Abs(r2.P-r.P) > 1e-9 {
			t.Fatalf("P not symmetric: %v vs %v", r.P, r2.P)
		}
		if a12, a21 := A12(x1, x2), A12(x2, x1); math.Abs(a12+a21-1) > 1e-9 || math.Abs(a12-r.U1/n) > 1e-9 {
			t.Fatalf("A12=%v A21=%v U1/n=%v", a12, a21, r.U1/n)
		}
	})
}
