package report

import (
	"bytes"
	"encoding/xml"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from golden file:\n%s", name, got)
	}
}

func TestTableGolden(t *testing.T) {
	tb := &Table{Header: []string{"size", "mode", "median ms", "note"}, Align: []Align{Left, Left, Right, Center}}
	tb.AddRow("10KB", "direct", "312.4", "a|b")
	tb.AddRow("500KB", "mosto chain", "201.0")
	tb.AddRow("15MB", "cdn warm", "1234.5", "multi\nline")
	var b bytes.Buffer
	if err := tb.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "table.golden", b.Bytes())
}

func TestTableErrors(t *testing.T) {
	if err := (&Table{}).WriteMarkdown(io.Discard); err == nil {
		t.Errorf("empty table: no error")
	}
	tb := &Table{Header: []string{"a"}, Rows: [][]string{{"1", "2"}}}
	if err := tb.WriteMarkdown(io.Discard); err == nil {
		t.Errorf("long row: no error")
	}
}

func samplePlot() *Plot {
	return &Plot{
		Title: "Time to last byte <Dublin -> SF>", XLabel: "object size", YLabel: "ms", LogX: true,
		XTick: func(v float64) string { return strconv.FormatFloat(v/1e3, 'g', -1, 64) + "KB" },
		Series: []Series{
			{Name: "direct", Points: []Point{{X: 10e3, Y: 300, Lo: 290, Hi: 320}, {X: 500e3, Y: 900, Lo: 850, Hi: 990}, {X: 15e6, Y: 2100}}},
			{Name: "mosto & chain", Points: []Point{{X: 10e3, Y: 200}, {X: 500e3, Y: 400}, {X: 15e6, Y: 1200}}},
		},
	}
}

func TestPlotGolden(t *testing.T) {
	var b bytes.Buffer
	if err := samplePlot().WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML with one polyline per series.
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	lines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 2 {
		t.Errorf("SVG has %d polylines; want 2", lines)
	}
	golden(t, "plot.golden.svg", b.Bytes())
}

func TestPlotErrors(t *testing.T) {
	tests := []struct {
		name string
		p    Plot
	}{
		{"no points", Plot{}},
		{"zero on log", Plot{LogX: true, Series: []Series{{Points: []Point{{X: 0, Y: 1}}}}}},
		{"tiny", Plot{Width: 10, Height: 10, Series: []Series{{Points: []Point{{X: 1, Y: 1}}}}}},
	}
	for _, tc := range tests {
		if err := tc.p.WriteSVG(io.Discard); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	// One point, linear and log: no panic, valid output.
	for _, logx := range []bool{false, true} {
		p := Plot{LogX: logx, Series: []Series{{Name: "one", Points: []Point{{X: 5, Y: 0}}}}}
		if err := p.WriteSVG(io.Discard); err != nil {
			t.Errorf("single point logx=%v: %v", logx, err)
		}
	}
}

func TestNiceStep(t *testing.T) {
	for in, want := range map[float64]float64{0.3: 0.5, 1: 1, 1.1: 2, 3: 5, 7: 10, 140: 200, 0: 1} {
		if got := niceStep(in); got != want {
			t.Errorf("niceStep(%v) = %v; want %v", in, got, want)
		}
	}
}

func TestDollarsPerTB(t *testing.T) {
	// One CPU second per GB is 1000 s per TB: 1000/3600 core-hours.
	if got := DollarsPerTB(1, 3.6); math.Abs(got-1) > 1e-9 {
		t.Errorf("DollarsPerTB(1 s/GB, $3.6) = %v; want 1", got)
	}
	if got := DollarsPerTB(0, DefaultCoreHour); got != 0 {
		t.Errorf("DollarsPerTB(0) = %v; want 0", got)
	}
	// The seed's relay: a whole m4.large ($0.108 an hour) forwarding
	// 10 Gbit/s, i.e. 0.8 s of it per GB, costs $0.003 per terabit.
	perTb := DollarsPerTB(0.8, 2*DefaultCoreHour) / 8
	if math.Abs(perTb-SeedRelaysPerTb/3) > 1e-9 {
		t.Errorf("one relay VM at 10 Gbit/s = $%v/Tb; want the seed's $0.003", perTb)
	}
}
