package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

func runPlanArgs(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	err = runPlan(context.Background(), &Env{Stdout: &o, Stderr: &e}, args)
	return o.String(), e.String(), err
}

// predicted returns the predicted ms of the named row of `mosto plan`.
func predicted(t *testing.T, out, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("row %q: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no row %q in\n%s", name, out)
	return 0
}

func TestPlanChain(t *testing.T) {
	for _, size := range []string{"14KB", "500KB", "14935KB"} {
		out, _, err := runPlanArgs(t, "--from", "Frankfurt", "--to", "Sydney", "--size", size)
		if err != nil {
			t.Fatalf("plan --size %s: %v", size, err)
		}
		ours := predicted(t, out, "mosto")
		for _, other := range []string{"direct", "shortest", "minimax"} {
			if v := predicted(t, out, other); v < ours-1e-9 {
				t.Errorf("size %s: %s predicts %v ms, below mosto's %v\n%s", size, other, v, ours, out)
			}
		}
		if size == "14KB" && predicted(t, out, "shortest") != ours {
			t.Errorf("1 round: mosto %v != shortest path %v", ours, predicted(t, out, "shortest"))
		}
		if !strings.Contains(out, "Frankfurt > ") || !strings.Contains(out, "> Sydney") {
			t.Errorf("no path in output:\n%s", out)
		}
	}
}

func TestPlanChainErrors(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"close match", []string{"--from", "Frankfurt", "--to", "Sidney", "--size", "1KB"}, true, "close matches: Sydney"},
		{"no match", []string{"--from", "Qqqqqqqq", "--to", "Sydney", "--size", "1KB"}, true, "the 30 locations are"},
		{"missing size", []string{"--from", "Frankfurt", "--to", "Sydney"}, true, "required"},
		{"bad size", []string{"--from", "Frankfurt", "--to", "Sydney", "--size", "12XB"}, true, "unknown unit"},
		{"bad icw", []string{"--from", "Frankfurt", "--to", "Sydney", "--size", "1KB", "--icw", "0"}, true, "--icw"},
		{"bad end icw", []string{"--from", "Frankfurt", "--to", "Sydney", "--size", "1KB", "--end-icw", "-2"}, true, "--end-icw"},
		{"end rtt alone", []string{"--from", "Frankfurt", "--to", "Sydney", "--size", "1KB", "--end-rtt", "10"}, true, "--end-rtt needs --end-icw"},
		{"format without rtt", []string{"--from", "Frankfurt", "--to", "Sydney", "--size", "1KB", "--format", "csv"}, true, "--format needs --rtt"},
		{"missing file", []string{"--from", "A", "--to", "B", "--size", "1KB", "--rtt", "/nonexistent/x.csv"}, false, "x.csv"},
		{"stray argument", []string{"frobnicate"}, true, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runPlanArgs(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want it to contain %q", err, tt.want)
			}
			if errors.Is(err, errUsage) != tt.usage {
				t.Fatalf("err = %v; usage error %v, want %v", err, errors.Is(err, errUsage), tt.usage)
			}
		})
	}
}

func TestPlanFoldedName(t *testing.T) {
	out, _, err := runPlanArgs(t, "--from", "new york", "--to", "SAN-FRANCISCO", "--size", "1MB")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "NewYork -> SanFrancisco") {
		t.Errorf("output:\n%s", out)
	}
}

func TestPlanDisconnectedCSV(t *testing.T) {
	dir := t.TempDir()
	csv := filepath.Join(dir, "m.csv")
	doc := ",A,B,C,D\nA,0,10,30,\nB,10,0,10,\nC,30,10,0,\nD,,,,0\n"
	if err := os.WriteFile(csv, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runPlanArgs(t, "--rtt", csv, "--from", "A", "--to", "C", "--size", "1MB")
	if err != nil {
		t.Fatalf("plan A->C: %v", err)
	}
	if !strings.Contains(out, "A > B > C") {
		t.Errorf("want the chain via B:\n%s", out)
	}
	_, _, err = runPlanArgs(t, "--rtt", csv, "--from", "A", "--to", "D", "--size", "1MB")
	if err == nil || !strings.Contains(err.Error(), "no chain from A to D") {
		t.Fatalf("plan A->D: err = %v; want no chain", err)
	}

	tablePath := filepath.Join(dir, "t.json")
	if _, _, err := runPlanArgs(t, "table", "--rtt", csv, "--sizes", "14KB,450KB", "--json", "-o", tablePath); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(tablePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tf, err := pathcomp.ReadTableFile(f)
	if err != nil {
		t.Fatalf("table is not a valid TableFile: %v", err)
	}
	// A, B, C are connected: 6 ordered pairs x 2 sizes; D has no chain.
	if len(tf.Chains) != 12 {
		t.Errorf("table has %d chains; want 12", len(tf.Chains))
	}
	for _, c := range tf.Chains {
		if c.From == "D" || c.To == "D" {
			t.Errorf("chain for disconnected D: %+v", c)
		}
	}
}

func TestPlanTableDefault(t *testing.T) {
	out, _, err := runPlanArgs(t, "table", "--json")
	if err != nil {
		t.Fatal(err)
	}
	tf, err := pathcomp.ReadTableFile(strings.NewReader(out))
	if err != nil {
		t.Fatalf("plan table --json: %v", err)
	}
	if want := 30 * 29 * 3; len(tf.Chains) != want {
		t.Errorf("%d chains; want %d", len(tf.Chains), want)
	}
	text, _, err := runPlanArgs(t, "table", "--sizes", "1MB")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "Dublin  ") || strings.Count(text, "\n") < 30*29 {
		t.Errorf("text table too short:\n%.500s", text)
	}
	if _, _, err := runPlanArgs(t, "table", "--sizes", ","); !errors.Is(err, errUsage) {
		t.Errorf("--sizes ',': err = %v; want usage error", err)
	}
}

func TestPlanBench(t *testing.T) {
	out, _, err := runPlanArgs(t, "bench", "--max-n", "50", "--runs", "1", "--no-rocketfuel", "--lookups", "1000")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"wonderproxy random 25", "wonderproxy random 50", "plain/pruned", "Index.Lookup", "0.00 allocs/op"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "random 115") {
		t.Errorf("--max-n 50 measured n=115:\n%s", out)
	}
}

func TestPlanMaxProxies(t *testing.T) {
	free, _, err := runPlanArgs(t, "--from", "Dublin", "--to", "Tokyo", "--size", "15MB")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runPlanArgs(t, "--from", "Dublin", "--to", "Tokyo", "--size", "15MB", "--max-proxies", "1")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[0] == "mosto" {
			if n, err := strconv.Atoi(f[3]); err != nil || n > 1 {
				t.Errorf("--max-proxies 1: mosto row %q has %q proxies", line, f[3])
			}
		}
	}
	if lim, unl := predicted(t, out, "mosto"), predicted(t, free, "mosto"); lim < unl-1e-9 {
		t.Errorf("limited chain predicts %v ms, below the unlimited %v", lim, unl)
	}
	if _, _, err := runPlanArgs(t, "--from", "Dublin", "--to", "Tokyo", "--max-proxies", "15"); err == nil {
		t.Error("--max-proxies 15 accepted")
	}
}

// TestPlanEnds: with fresh ends (--end-icw, --end-rtt) the chain and its
// predicted time follow the per-segment model: the ends' rounds are
// printed and a 3-node matrix where the split wins at the hops' window
// goes direct once the ends' rounds bound the transfer.
func TestPlanEnds(t *testing.T) {
	dir := t.TempDir()
	csv := filepath.Join(dir, "m.csv")
	if err := os.WriteFile(csv, []byte(",A,B,C\nA,0,100,60\nB,100,0,60\nC,60,60,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runPlanArgs(t, "--rtt", csv, "--from", "A", "--to", "B", "--size", "200KB", "--icw", "100")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "mosto     120.00") || !strings.Contains(out, "A > C > B") {
		t.Errorf("hops' window everywhere: want the split at 120 ms:\n%s", out)
	}
	out, _, err = runPlanArgs(t, "--rtt", csv, "--from", "A", "--to", "B", "--size", "200KB", "--icw", "100", "--end-icw", "10", "--end-rtt", "40")
	if err != nil {
		t.Fatal(err)
	}
	// direct: 1/2 (100 + 80) + max(3 x 40, 1 x 100) = 210 ms; the split 220.
	if !strings.Contains(out, "ends: 4 rounds (ICW 10), 40.00 ms each") || !strings.Contains(out, "mosto     210.00") {
		t.Errorf("fresh ends: want 4 end rounds and the direct link at 210 ms:\n%s", out)
	}
	// The whole fetch: + the request's trip 1/2 (100 + 80) + the client's handshake 40 = 340 ms.
	if !strings.Contains(out, "fetch ms") || !strings.Contains(out, "340.00") {
		t.Errorf("fresh ends: want the fetch column with 340 ms for the direct link:\n%s", out)
	}
}
