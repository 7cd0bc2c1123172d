package planbench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

func TestInputsRespectMaxN(t *testing.T) {
	ins, err := Inputs(Config{MaxN: 120, Rocketfuel: true})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, in := range ins {
		if len(in.RTT) > 120 {
			t.Errorf("%s has n = %d > MaxN 120", in.Name, len(in.RTT))
		}
		names[in.Name] = true
	}
	for _, want := range []string{"wonderproxy random 25", "wonderproxy random 115", "rocketfuel AS1221 cities"} {
		if !names[want] {
			t.Errorf("inputs lack %q: %v", want, names)
		}
	}
	if names["wonderproxy all 246"] {
		t.Error("MaxN 120 includes the 246-city matrix")
	}
}

func TestMeasureAndReport(t *testing.T) {
	in := Input{Name: "synthetic 30", RTT: pathcomp.SyntheticRTT(30, 1)}
	row, err := Measure(context.Background(), in, Config{Runs: 2, PlainMaxN: 50})
	if err != nil {
		t.Fatal(err)
	}
	f, err := pathcomp.Precompute(in.RTT, pathcomp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if row.N != 30 || row.Links != f.Links() || row.Plain == nil || row.Pruned.Wall <= 0 || row.Ratio() <= 0 {
		t.Fatalf("row = %+v", row)
	}
	if want := float64(f.Entries()) / (30 * 29 / 2); row.EntriesPerPair != want {
		t.Errorf("entries/pair = %v; want %v", row.EntriesPerPair, want)
	}
	rep := &Report{Rows: []Row{row}, LookupN: 246}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "synthetic 30") || !strings.Contains(b.String(), "x ") {
		t.Errorf("report:\n%s", b.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Measure(ctx, in, Config{}); err == nil {
		t.Error("Measure with a cancelled context succeeded")
	}
}
