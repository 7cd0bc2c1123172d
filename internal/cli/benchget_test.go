package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/mosto-net/mosto/internal/getbench"
)

// TestLoadBenchGet: the downloads of several --json files come back in file
// order with each file's iterations numbered after the previous file's.
func TestLoadBenchGet(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, rs []getbench.Result) string {
		b, err := json.Marshal(rs)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := write("a.json", []getbench.Result{{Mode: "x", Run: 0, Seconds: 1}, {Mode: "x", Run: 1, Seconds: 2}, {Mode: "y", Run: 1, Seconds: 3}})
	b := write("b.json", []getbench.Result{{Mode: "x", Run: 0, Seconds: 4}, {Mode: "x", Run: 1, Seconds: 5}})
	rs, err := loadBenchGet([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	var runs []int
	for _, r := range rs {
		runs = append(runs, r.Run)
	}
	want := []int{0, 1, 1, 2, 3}
	if len(runs) != len(want) {
		t.Fatalf("runs %v; want %v", runs, want)
	}
	for i := range want {
		if runs[i] != want[i] {
			t.Fatalf("runs %v; want %v", runs, want)
		}
	}
	if _, err := loadBenchGet([]string{filepath.Join(dir, "missing.json")}); err == nil {
		t.Errorf("a missing file gave no error")
	}
}
