package pathcomp

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// sizeForRounds returns the smallest transfer size that needs exactly r
// slow-start rounds under m.
func sizeForRounds(t testing.TB, m Model, r int) int64 {
	t.Helper()
	w := int64(10 * 1460)
	if m.ICW > 0 {
		w = int64(m.ICW) * 1460
	}
	if m.MSS > 0 {
		w = w / 1460 * int64(m.MSS)
	}
	s := int64(1)
	if r > 1 {
		s = w*(int64(1)<<(r-1)-1) + 1
	}
	if got := m.Rounds(s); got != r {
		t.Fatalf("sizeForRounds(%d) = %d needs %d rounds", r, s, got)
	}
	return s
}

// TestLookupCostAtEveryRounds checks Index.Lookup by brute force at every
// rounds value (not only the classes the table was built for): the entry
// it returns costs, at the size's own rounds, the least of all the pair's
// entries; it never costs more than the entry of the next class up (the
// lookup before); with every class in the table it is the true optimum of
// the fronts; and the size at both ends of each rounds value agrees.
func TestLookupCostAtEveryRounds(t *testing.T) {
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 77))
		rtt := randomMatrix(rng, 9, int(seed%3), 0.2)
		names := make([]string, len(rtt))
		for i := range names {
			names[i] = string(rune('A' + i))
		}
		model := Model{ICW: []int{1, 4, 10}[seed%3], MSS: 1000}
		f, err := Precompute(rtt, Options{Model: model})
		if err != nil {
			t.Fatal(err)
		}
		const maxR = 14
		sparse := []int{1, 4, 9}
		var sparseSizes, allSizes []int64
		for _, r := range sparse {
			sparseSizes = append(sparseSizes, sizeForRounds(t, model, r))
		}
		for r := 1; r <= maxR; r++ {
			allSizes = append(allSizes, sizeForRounds(t, model, r))
		}
		for _, tc := range []struct {
			name  string
			sizes []int64
		}{{"sparse classes", sparseSizes}, {"every class", allSizes}} {
			tf := BuildTable(names, f, tc.sizes)
			ix, err := NewIndex(tf)
			if err != nil {
				t.Fatal(err)
			}
			for i := range rtt {
				for j := range rtt {
					if i == j {
						continue
					}
					var entries []ChainEntry
					for _, e := range tf.Chains {
						if e.From == names[i] && e.To == names[j] {
							entries = append(entries, e)
						}
					}
					for r := 1; r <= maxR+2; r++ {
						for _, size := range []int64{sizeForRounds(t, model, r), sizeForRounds(t, model, r+1) - 1} {
							got, ok := ix.Lookup(names[i], names[j], size)
							if ok != (len(entries) > 0) {
								t.Fatalf("%s seed %d: Lookup(%s,%s,%d) ok = %v with %d entries", tc.name, seed, names[i], names[j], size, ok, len(entries))
							}
							if !ok {
								continue
							}
							// Brute force over the pair's entries at r.
							want, class := -1.0, ChainEntry{}
							for _, e := range entries {
								c := model.Cost(Chain{Sum: e.SumMS, Max: e.MaxMS}, r)
								if want < 0 || c < want {
									want = c
								}
								if class.Path == nil && e.Rounds >= r {
									class = e
								}
							}
							if class.Path == nil {
								class = entries[len(entries)-1]
							}
							if got.Rounds != r || !near(got.CostMS, want) || !near(model.Cost(Chain{Sum: got.SumMS, Max: got.MaxMS}, r), want) {
								t.Fatalf("%s seed %d: Lookup(%s,%s,%d) = rounds %d cost %v (%+v); want rounds %d cost %v", tc.name, seed, names[i], names[j], size, got.Rounds, got.CostMS, got, r, want)
							}
							if !slices.ContainsFunc(entries, func(e ChainEntry) bool { return slices.Equal(e.Path, got.Path) }) {
								t.Fatalf("Lookup returned path %v, not one of the pair's entries", got.Path)
							}
							if up := model.Cost(Chain{Sum: class.SumMS, Max: class.MaxMS}, r); got.CostMS > up+1e-9 {
								t.Fatalf("Lookup cost %v above the next class's %v", got.CostMS, up)
							}
							if tc.name == "every class" && r <= maxR {
								opt, _ := f.Best(i, j, r)
								if !near(got.CostMS, model.Cost(opt, r)) {
									t.Fatalf("seed %d: Lookup(%s,%s) at %d rounds costs %v; the fronts' optimum %v", seed, names[i], names[j], r, got.CostMS, model.Cost(opt, r))
								}
							}
						}
					}
				}
			}
		}
	}
}

func near(a, b float64) bool { d := a - b; return d < 1e-6 && d > -1e-6 }

// TestLookupBetweenClasses: a size between two classes takes whichever
// entry is cheaper at its own rounds, where the old rule took the class
// above.
func TestLookupBetweenClasses(t *testing.T) {
	tf := &TableFile{
		Locations: []string{"A", "B", "C"},
		Chains: []ChainEntry{
			// Direct: 1/2*40 + (r-1)*40.
			{From: "A", To: "C", Rounds: 1, Path: []string{"A", "C"}, SumMS: 40, MaxMS: 40},
			// Over B: 1/2*44 + (r-1)*22.
			{From: "A", To: "C", Rounds: 8, Path: []string{"A", "B", "C"}, SumMS: 44, MaxMS: 22},
		},
	}
	ix, err := NewIndex(tf)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		rounds int
		path   int // proxies
		cost   float64
	}{
		{1, 0, 20},        // direct 20, chain 22
		{2, 1, 44},        // direct 60, chain 44: the old rule took the 8-round class too
		{5, 1, 22 + 88},   // the chain
		{12, 1, 22 + 242}, // beyond the last class
	} {
		size := sizeForRounds(t, Model{}, tt.rounds)
		e, ok := ix.Lookup("A", "C", size)
		if !ok || len(e.Path)-2 != tt.path || !near(e.CostMS, tt.cost) || e.Rounds != tt.rounds {
			t.Errorf("Lookup(%d bytes, %d rounds) = %+v; want %d proxies, cost %v", size, tt.rounds, e, tt.path, tt.cost)
		}
	}
	// A table of one class 8: a 1-round transfer is still costed at 1 round.
	one := &TableFile{Locations: []string{"A", "C"}, Chains: []ChainEntry{{From: "A", To: "C", Rounds: 8, Path: []string{"A", "C"}, SumMS: 40, MaxMS: 40}}}
	ix1, err := NewIndex(one)
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := ix1.Lookup("A", "C", 1); e.Rounds != 1 || !near(e.CostMS, 20) {
		t.Errorf("Lookup(1 byte) = %+v; want rounds 1, cost 20", e)
	}
}
