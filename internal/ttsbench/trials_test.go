package ttsbench_test

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/ttsbench"
)

// trialsFile renders trials as a results file.
func trialsFile(t *testing.T, ts ...ttsbench.Trial) string {
	t.Helper()
	var b strings.Builder
	for _, tr := range ts {
		j, err := json.Marshal(tr)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteString("\n\n")
	}
	return b.String()
}

// TestMergeTrials pools the transfers of two runs (two files) of the same
// setup into one table, keeps another setup apart, counts failures, and
// finds the seed's row (and figures) from the recorded links.
func TestMergeTrials(t *testing.T) {
	row4 := ttsbench.SeedRows()[3]
	spec := ttsbench.RowSpec{Name: row4.Name, D1: row4.D1, J1: row4.J1, L1: row4.L1, D2: row4.D2, J2: row4.J2, L2: row4.L2}
	at := time.Date(2026, 11, 28, 11, 0, 0, 0, time.UTC)
	tr := func(run, setup string, m ttsbench.Mode, secs float64, load float64) ttsbench.Trial {
		return ttsbench.Trial{UTC: at, Run: run, World: "tables", Setup: setup, CC: "cubic", Row: spec, Mode: m, Size: 70_000_000, Trial: 1, Secs: secs, Load: [3]float64{load, 0, 0}}
	}
	f1 := trialsFile(t,
		tr("a", "rate=100", ttsbench.TTS, 7, 0.5), tr("a", "rate=100", ttsbench.E2E, 12, 0.6),
		tr("a", "rate=100", ttsbench.TTS, 8, 0.7), tr("a", "rate=100", ttsbench.E2E, 11, 0.8))
	failed := tr("b", "rate=100", ttsbench.TTS, 0, 1.5)
	failed.Err = "timeout"
	f2 := trialsFile(t,
		tr("b", "rate=100", ttsbench.E2E, 13, 1.0), tr("b", "rate=100", ttsbench.TTS, 9, 1.1), failed,
		tr("c", "rate=100 relay-cc=bbr", ttsbench.TTS, 6, 0.2), tr("c", "rate=100 relay-cc=bbr", ttsbench.E2E, 12, 0.2))
	var all []ttsbench.Trial
	for _, f := range []string{f1, f2} {
		ts, err := ttsbench.ReadTrials(strings.NewReader(f))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ts...)
	}
	if len(all) != 9 {
		t.Fatalf("read %d trials; want 9", len(all))
	}
	p, err := ttsbench.MergeTrials(all)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Groups) != 2 {
		t.Fatalf("%d groups; want 2 (two setups)", len(p.Groups))
	}
	g := p.Groups[0]
	if g.Setup != "rate=100" || len(g.Runs) != 2 || g.LoadMin != 0.5 || g.LoadMax != 1.5 {
		t.Errorf("group 0: setup %q runs %v load %v-%v; want rate=100, runs a and b, load 0.5-1.5", g.Setup, g.Runs, g.LoadMin, g.LoadMax)
	}
	if got := g.Result.Modes; len(got) != 2 || got[0] != ttsbench.E2E {
		t.Errorf("modes %v; want E2E first, then tts", got)
	}
	c, ok := g.Result.Compare("cubic", 0, ttsbench.TTS)
	if !ok || c.E2E.N != 3 || c.Other.N != 3 {
		t.Fatalf("pooled n %d/%d (ok %v); want 3/3", c.E2E.N, c.Other.N, ok)
	}
	if math.Abs(c.E2E.Mean-12) > 1e-9 || math.Abs(c.Other.Mean-8) > 1e-9 || c.A12 != 1 {
		t.Errorf("pooled means %v / %v, A12 %v; want 12 / 8, 1", c.E2E.Mean, c.Other.Mean, c.A12)
	}
	if c2, _ := p.Groups[1].Result.Compare("cubic", 0, ttsbench.TTS); c2.Other.N != 1 || c2.Other.Mean != 6 {
		t.Errorf("second setup: %+v; want its one TTS transfer alone", c2)
	}
	// Rows come in the seed's order, whatever order the files had.
	row1 := ttsbench.SeedRows()[0]
	late := tr("d", "rate=100", ttsbench.E2E, 20, 0.1)
	late.Row = ttsbench.RowSpec{Name: row1.Name, D1: row1.D1, J1: row1.J1, L1: row1.L1, D2: row1.D2, J2: row1.J2, L2: row1.L2}
	p2, err := ttsbench.MergeTrials(append(all, late))
	if err != nil {
		t.Fatal(err)
	}
	if r := p2.Groups[0].Result; len(r.Rows) != 2 || r.Rows[0].Name != row1.Name {
		t.Errorf("rows %v; want %q first", r.Rows, row1.Name)
	} else if c, _ := r.Compare("cubic", 1, ttsbench.TTS); c.Other.N != 3 || c.Other.Mean != 8 {
		t.Errorf("row 4 after sorting: %+v; want its 3 TTS transfers", c)
	}
	var md bytes.Buffer
	if err := p.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"jitter J=1ms", "3/3", "0/1", "0.572", `"rate=100 relay-cc=bbr"`} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
}

func TestReadTrialsErrors(t *testing.T) {
	for _, in := range []string{"{not json}\n", `{"cc":"cubic","mode":"tts","size":1}` + "\n"} {
		if _, err := ttsbench.ReadTrials(strings.NewReader(in)); err == nil {
			t.Errorf("ReadTrials(%q): no error", in)
		}
	}
	if _, err := ttsbench.MergeTrials(nil); err == nil {
		t.Error("MergeTrials(nil): no error")
	}
}

// TestSeparateParallel: transfers of runs with several worlds at once pool
// with the one-world runs by default (the report counts them apart), and
// apart from them after SeparateParallel.
func TestSeparateParallel(t *testing.T) {
	row := ttsbench.SeedRows()[3]
	spec := ttsbench.RowSpec{Name: row.Name, D1: row.D1, J1: row.J1, L1: row.L1, D2: row.D2, J2: row.J2, L2: row.L2}
	tr := func(run string, par int, m ttsbench.Mode, secs float64) ttsbench.Trial {
		return ttsbench.Trial{UTC: time.Date(2026, 11, 28, 17, 0, 0, 0, time.UTC), Run: run, World: "tables", Setup: "rate=100", CC: "cubic", Row: spec, Mode: m, Size: 70_000_000, Trial: 1, Secs: secs, Parallel: par}
	}
	ts := []ttsbench.Trial{tr("a", 0, ttsbench.E2E, 12), tr("a", 0, ttsbench.TTS, 8), tr("b", 1, ttsbench.TTS, 9),
		tr("c", 3, ttsbench.E2E, 13), tr("c", 3, ttsbench.TTS, 9), tr("d", 3, ttsbench.TTS, 10)}
	p, err := ttsbench.MergeTrials(ts)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Groups) != 1 || p.Groups[0].Parallel[1] != 3 || p.Groups[0].Parallel[3] != 3 {
		t.Fatalf("pooled by default: %d groups, parallelism %v; want 1 group, 3 transfers each of 1 and 3", len(p.Groups), p.Groups[0].Parallel)
	}
	var md bytes.Buffer
	if err := p.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "1 world(s) at once: 3, 3 world(s) at once: 3") {
		t.Errorf("report lacks the parallelism counts:\n%s", md.String())
	}
	ttsbench.SeparateParallel(ts)
	p, err = ttsbench.MergeTrials(ts)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Groups) != 2 || p.Groups[0].Setup != "rate=100" || p.Groups[1].Setup != "rate=100 parallel=3" {
		t.Fatalf("separated: %d groups; want rate=100 and rate=100 parallel=3", len(p.Groups))
	}
	if c, _ := p.Groups[1].Result.Compare("cubic", 0, ttsbench.TTS); c.E2E.N != 1 || c.Other.N != 2 || c.Other.Mean != 9.5 {
		t.Errorf("parallel group: %+v; want 1 E2E and 2 TTS (mean 9.5)", c)
	}
}
