package pathcomp

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// endSizes returns sizes at both ends of every (chain rounds, end rounds)
// class of m up to maxR rounds of either window.
func endSizes(t testing.TB, m Model, maxR int) []int64 {
	var out []int64
	for r := 1; r <= maxR; r++ {
		for _, mm := range []Model{{ICW: m.ICW, MSS: m.MSS}, {ICW: m.EndICW, MSS: m.MSS}} {
			s := sizeForRounds(t, mm, r)
			out = append(out, s, s-1, s+1)
		}
	}
	out = slices.DeleteFunc(out, func(s int64) bool { return s < 1 })
	slices.Sort(out)
	return slices.Compact(out)
}

// TestLookupEndsBruteForce checks the per-segment window model against a
// brute force over every simple path: for tuned hops and fresh ends, at
// sizes on both sides of every class boundary of either window, the
// table's lookup (and Fronts.BestEnds) return a chain whose CostEnds is
// the least of all simple paths of the pair.
func TestLookupEndsBruteForce(t *testing.T) {
	for seed := range uint64(9) {
		rng := rand.New(rand.NewPCG(seed, 18))
		rtt := randomMatrix(rng, 7, int(seed%3), 0.25)
		names := make([]string, len(rtt))
		for i := range names {
			names[i] = string(rune('A' + i))
		}
		model := Model{ICW: []int{40, 100, 1000}[seed%3], MSS: 1000, EndICW: []int{4, 10}[seed%2], EndRTT: []float64{0, 7.5, 40, 150}[seed%4]}
		f, err := Precompute(rtt, Options{Model: model})
		if err != nil {
			t.Fatal(err)
		}
		sizes := endSizes(t, model, 8)
		tf := BuildTable(names, f, sizes)
		var buf bytes.Buffer
		if err := json.NewEncoder(&buf).Encode(tf); err != nil {
			t.Fatal(err)
		}
		read, err := ReadTableFile(&buf)
		if err != nil {
			t.Fatalf("table with end segments does not read back: %v", err)
		}
		ix, err := NewIndex(read)
		if err != nil {
			t.Fatal(err)
		}
		e := micros(model.EndRTT)
		for i := range rtt {
			stats := allPathStats(rtt, i, 0)
			for j := range rtt {
				if i == j {
					continue
				}
				for _, size := range sizes {
					r, re := model.Rounds(size), model.EndRounds(size)
					want := int64(-1)
					for _, p := range stats[j] {
						if c := model.twiceEnds(p.sum, p.mx, r, re, e, e); want < 0 || c < want {
							want = c
						}
					}
					got, ok := ix.Lookup(names[i], names[j], size)
					if ok != (want >= 0) {
						t.Fatalf("seed %d %s->%s: lookup found %v, brute force found a path %v", seed, names[i], names[j], ok, want >= 0)
					}
					if !ok {
						continue
					}
					if got.Rounds != r || got.EndRounds != re {
						t.Fatalf("seed %d %s->%s size %d: rounds %d/%d, want %d/%d", seed, names[i], names[j], size, got.Rounds, got.EndRounds, r, re)
					}
					if c := model.twiceEnds(micros(got.SumMS), micros(got.MaxMS), r, re, e, e); c != want || int64(math.Round(got.CostMS*2000)) != want {
						t.Fatalf("seed %d %s->%s size %d (rounds %d, end rounds %d): lookup's chain %v costs %d us x2 (says %v ms); brute force over all simple paths %d",
							seed, names[i], names[j], size, r, re, got.Path, c, got.CostMS, want)
					}
					idx := make([]int, len(got.Path))
					for k, p := range got.Path {
						idx[k] = int(p[0] - 'A')
					}
					checkPath(t, rtt, i, j, Chain{Path: idx, Sum: got.SumMS, Max: got.MaxMS})
					be, _ := f.BestEnds(i, j, size, model.EndRTT, model.EndRTT)
					if c := model.twiceEnds(micros(be.Sum), micros(be.Max), r, re, e, e); c != want {
						t.Fatalf("seed %d %d->%d size %d: BestEnds costs %d, brute force %d", seed, i, j, size, c, want)
					}
				}
			}
		}
	}
}

// TestEndsChangeTheChoice: a direct link of 100 ms against two hops of 60
// ms. With the hops' window for every segment the split wins (its 60 ms
// rounds); once the fresh ends' rounds (40 ms ends, window 10) bound the
// transfer anyway, the split's extra 20 ms of sum make it lose.
func TestEndsChangeTheChoice(t *testing.T) {
	rtt := [][]float64{{0, 100, 60}, {100, 0, 60}, {60, 60, 0}}
	names := []string{"A", "B", "C"}
	size := int64(200_000) // 2 rounds at ICW 100, 4 at ICW 10 (MSS 1460): direct 210 ms, split 220
	for _, tc := range []struct {
		model Model
		want  string
	}{
		{Model{ICW: 100}, "A,C,B"},
		{Model{ICW: 100, EndICW: 100, EndRTT: 40}, "A,C,B"},
		{Model{ICW: 100, EndICW: 10, EndRTT: 40}, "A,B"},
	} {
		f, err := Precompute(rtt, Options{Model: tc.model})
		if err != nil {
			t.Fatal(err)
		}
		ix, err := NewIndex(BuildTable(names, f, []int64{size}))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := ix.Lookup("A", "B", size)
		if !ok || strings.Join(got.Path, ",") != tc.want {
			t.Errorf("model %+v: chain %v (cost %v ms), want %s", tc.model, got.Path, got.CostMS, tc.want)
		}
	}
}

func TestEndsModelErrors(t *testing.T) {
	rtt := [][]float64{{0, 1}, {1, 0}}
	for _, m := range []Model{{EndICW: -1}, {EndRTT: 5}, {EndICW: 10, EndRTT: -1}} {
		if _, err := Precompute(rtt, Options{Model: m}); err == nil {
			t.Errorf("Precompute accepted model %+v", m)
		}
	}
	for _, doc := range []string{
		`{"end_icw":-1,"locations":["A"],"chains":[]}`,
		`{"end_rtt_ms":10,"locations":["A"],"chains":[]}`,
		`{"end_icw":10,"locations":["A","B"],"chains":[{"from":"A","to":"B","size":1,"rounds":1,"end_rounds":1,"path":["A","B"]},{"from":"A","to":"B","size":2,"rounds":1,"end_rounds":1,"path":["A","B"]}]}`,
	} {
		if _, err := ReadTableFile(strings.NewReader(doc)); err == nil {
			t.Errorf("table accepted: %s", doc)
		}
	}
	// Same chain rounds, different end rounds: two classes, both kept.
	ok := `{"end_icw":10,"locations":["A","B"],"chains":[{"from":"A","to":"B","size":1,"rounds":1,"end_rounds":1,"path":["A","B"]},{"from":"A","to":"B","size":20000,"rounds":1,"end_rounds":2,"path":["A","B"]}]}`
	if _, err := ReadTableFile(strings.NewReader(ok)); err != nil {
		t.Errorf("table with two end classes: %v", err)
	}
}

// TestLookupEndsAtEveryRounds checks the per-segment window lookup by brute
// force at every rounds value, not only at the classes the table was built
// for: a table of three sparse sizes is asked for a size inside every
// (chain rounds, end rounds) combination up to 12 rounds of either window
// (both ends of each range and its middle). The entry it returns carries
// the size's own rounds, and its cost there equals the least cost of the
// pair's entries at those rounds (the cost the entry's sum and max give,
// not the cost of the class it was built for); a lookup that costed the
// next class up fails it. Where the size's rounds are one of the table's
// classes, it is also the optimum over every simple path.
func TestLookupEndsAtEveryRounds(t *testing.T) {
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 1818))
		rtt := randomMatrix(rng, 7, int(seed%3), 0.2)
		names := make([]string, len(rtt))
		for i := range names {
			names[i] = string(rune('A' + i))
		}
		model := Model{ICW: []int{40, 100, 400}[seed%3], MSS: 1000, EndICW: []int{4, 10}[seed%2], EndRTT: []float64{0, 7.5, 40}[seed%3]}
		f, err := Precompute(rtt, Options{Model: model})
		if err != nil {
			t.Fatal(err)
		}
		endModel := Model{ICW: model.EndICW, MSS: model.MSS}
		// Sparse classes: 1, 6 and 11 end rounds.
		sparse := []int64{1, sizeForRounds(t, endModel, 6), sizeForRounds(t, endModel, 11)}
		ix, err := NewIndex(BuildTable(names, f, sparse))
		if err != nil {
			t.Fatal(err)
		}
		classes := map[[2]int]bool{}
		for _, s := range sparse {
			classes[[2]int{model.Rounds(s), model.EndRounds(s)}] = true
		}
		// Every size where either window's rounds change, and the middle
		// of every range between two such sizes.
		const maxR = 12
		var sizes []int64
		for r := 1; r <= maxR+1; r++ {
			for _, m := range []Model{{ICW: model.ICW, MSS: model.MSS}, endModel} {
				s := sizeForRounds(t, m, r)
				sizes = append(sizes, s, s-1)
			}
		}
		slices.Sort(sizes)
		sizes = slices.Compact(slices.DeleteFunc(sizes, func(s int64) bool { return s < 1 }))
		for k := len(sizes) - 1; k > 0; k-- {
			if mid := (sizes[k-1] + sizes[k]) / 2; mid > sizes[k-1] {
				sizes = slices.Insert(sizes, k, mid)
			}
		}
		e := micros(model.EndRTT)
		seen := map[[2]int]bool{}
		for i := range rtt {
			stats := allPathStats(rtt, i, 0)
			for j := range rtt {
				if i == j {
					continue
				}
				entries := ix.entries[ix.start[i*ix.n+j]:ix.start[i*ix.n+j+1]]
				for _, size := range sizes {
					r, re := model.Rounds(size), model.EndRounds(size)
					if r > maxR || re > maxR {
						continue
					}
					seen[[2]int{r, re}] = true
					got, ok := ix.Lookup(names[i], names[j], size)
					if ok != (len(entries) > 0) {
						t.Fatalf("seed %d %s->%s: lookup found %v with %d entries", seed, names[i], names[j], ok, len(entries))
					}
					if !ok {
						continue
					}
					want := int64(-1)
					for _, c := range entries {
						if v := model.twiceEnds(micros(c.SumMS), micros(c.MaxMS), r, re, e, e); want < 0 || v < want {
							want = v
						}
					}
					if got.Rounds != r || got.EndRounds != re {
						t.Fatalf("seed %d %s->%s size %d: rounds %d/%d; want the size's own %d/%d", seed, names[i], names[j], size, got.Rounds, got.EndRounds, r, re)
					}
					if c := model.twiceEnds(micros(got.SumMS), micros(got.MaxMS), r, re, e, e); c != want || int64(math.Round(got.CostMS*2000)) != want {
						t.Fatalf("seed %d %s->%s size %d (rounds %d/%d): chain %v costs %d us x2 (says %v ms); the least of the pair's entries at these rounds %d",
							seed, names[i], names[j], size, r, re, got.Path, c, got.CostMS, want)
					}
					if !slices.ContainsFunc(entries, func(c ChainEntry) bool { return slices.Equal(c.Path, got.Path) }) {
						t.Fatalf("seed %d: lookup returned path %v, not one of the pair's entries", seed, got.Path)
					}
					if classes[[2]int{r, re}] {
						opt := int64(-1)
						for _, p := range stats[j] {
							if c := model.twiceEnds(p.sum, p.mx, r, re, e, e); opt < 0 || c < opt {
								opt = c
							}
						}
						if want != opt {
							t.Fatalf("seed %d %s->%s size %d: at its class %d/%d the lookup costs %d, every simple path's optimum %d", seed, names[i], names[j], size, r, re, want, opt)
						}
					}
				}
			}
		}
		if len(seen) < maxR {
			t.Fatalf("seed %d: only %d (rounds, end rounds) combinations checked", seed, len(seen))
		}
	}
}
