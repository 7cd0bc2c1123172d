package pathcomp

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestBuildTableRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	rtt := randomMatrix(rng, 12, 1, 0.3)
	names := make([]string, len(rtt))
	for i := range names {
		names[i] = string(rune('A' + i))
	}
	f, err := Precompute(rtt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 10KB and 14KB share the 1-round class: only the first is kept.
	sizes := []int64{10_000, 14_000, 450_000, 14_935_000}
	tf := BuildTable(names, f, sizes)
	b, err := json.Marshal(tf)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadTableFile(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("ReadTableFile(BuildTable) = %v", err)
	}
	ix, err := NewIndex(back)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for i := range rtt {
		for j := range rtt {
			if i == j {
				continue
			}
			for _, sz := range []int64{1, 14_000, 100_000, 450_000, 14_935_000, 1 << 40} {
				r := Model{}.Rounds(sz)
				// The table's classes are 1, 5 and 10 rounds; a lookup takes
				// the one cheapest at the size's own rounds r.
				var want Chain
				ok := false
				for _, class := range []int{1, 5, 10} {
					c, cok := f.Best(i, j, class)
					if cok && (!ok || (Model{}).Cost(c, r) < (Model{}).Cost(want, r)) {
						want, ok = c, true
					}
				}
				got, gotOK := ix.Lookup(names[i], names[j], sz)
				if ok != gotOK {
					t.Fatalf("Lookup(%s,%s,%d) ok = %v; Best ok = %v", names[i], names[j], sz, gotOK, ok)
				}
				if !ok {
					continue
				}
				seen++
				if got.Rounds != r || !near(got.CostMS, (Model{}).Cost(want, r)) {
					t.Fatalf("Lookup(%s,%s,%d) = %+v; want rounds %d cost %v (chain %v)", names[i], names[j], sz, got, r, (Model{}).Cost(want, r), want)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no connected pair checked")
	}
	if _, ok := ix.Lookup("A", "nowhere", 1); ok {
		t.Error("Lookup of an unknown location succeeded")
	}
}

func TestReadTableFileErrors(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"unknown field", `{"locations":["A"],"chains":[],"x":1}`, "unknown field"},
		{"unknown from", `{"locations":["A","B"],"chains":[{"from":"C","to":"B","rounds":1,"path":["C","B"]}]}`, "unknown location"},
		{"bad path", `{"locations":["A","B"],"chains":[{"from":"A","to":"B","rounds":1,"path":["B","A"]}]}`, "does not run"},
		{"unknown hop", `{"locations":["A","B"],"chains":[{"from":"A","to":"B","rounds":1,"path":["A","Z","B"]}]}`, "unknown location \"Z\""},
		{"rounds", `{"locations":["A","B"],"chains":[{"from":"A","to":"B","rounds":0,"path":["A","B"]}]}`, "rounds 0"},
		{"duplicate", `{"locations":["A","B"],"chains":[{"from":"A","to":"B","rounds":2,"path":["A","B"]},{"from":"A","to":"B","rounds":2,"path":["A","B"]}]}`, "duplicate entry"},
		{"duplicate location", `{"locations":["A","A"],"chains":[]}`, "listed twice"},
		{"not json", `{"locations":`, "decode table"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadTableFile(strings.NewReader(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadTableFile = %v; want error containing %q", err, tt.want)
			}
		})
	}
}

func TestIndexLookupAllocs(t *testing.T) {
	rtt := SyntheticRTT(40, 3)
	names := make([]string, len(rtt))
	for i := range names {
		names[i] = "loc" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	f, err := Precompute(rtt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ix, err := NewIndex(BuildTable(names, f, []int64{14_000, 450_000}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	allocs := testing.AllocsPerRun(1000, func() {
		e, _ := ix.Lookup(names[3], names[17], 300_000)
		n += e.Rounds
	})
	if allocs != 0 {
		t.Errorf("Index.Lookup allocates %v times; want 0", allocs)
	}
	if e, ok := ix.Lookup(names[3], names[17], 300_000); !ok || e.Rounds != 5 {
		t.Errorf("Lookup(300KB) = %+v, %v; want the 5-round entry", e, ok)
	}
}

func TestTableKeepsModel(t *testing.T) {
	rtt := [][]float64{{0, 10, 30}, {10, 0, 10}, {30, 10, 0}}
	names := []string{"A", "B", "C"}
	// ICW 1 x MSS 1000: 20 KB needs 5 rounds (1+2+4+8+16 = 31 segments).
	model := Model{ICW: 1, MSS: 1000}
	f, err := Precompute(rtt, Options{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	tf := BuildTable(names, f, []int64{1000, 20_000})
	b, err := json.Marshal(tf)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadTableFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if back.ICW != 1 || back.MSS != 1000 {
		t.Fatalf("table model = %d/%d; want 1/1000", back.ICW, back.MSS)
	}
	ix, err := NewIndex(back)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := ix.Lookup("A", "C", 20_000)
	if !ok || e.Rounds != model.Rounds(20_000) || e.Rounds != 5 {
		t.Fatalf("Lookup(20KB) = %+v; want the %d-round entry", e, model.Rounds(20_000))
	}
	if d := BuildTable(names, mustPrecompute(t, rtt), []int64{1000}); d.ICW != 0 || d.MSS != 0 {
		t.Errorf("default model recorded as %d/%d; want omitted", d.ICW, d.MSS)
	}
}

func mustPrecompute(t *testing.T, rtt [][]float64) *Fronts {
	t.Helper()
	f, err := Precompute(rtt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}
