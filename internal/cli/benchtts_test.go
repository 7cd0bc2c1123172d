package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchTTSUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"trials", []string{"--trials", "0"}, "--trials"},
		{"only", []string{"--only", "tables,plots"}, "unknown part"},
		{"rows", []string{"--rows", "7"}, "--rows"},
		{"size", []string{"--size", "10QB"}, "--size"},
		{"grid loss", []string{"--grid-loss", "0,100"}, "--grid-loss"},
		{"grid rtts", []string{"--grid-rtts", "x"}, "--grid-rtts"},
		{"rate", []string{"--rate", "0"}, "--rate"},
		{"parallel", []string{"--parallel", "0"}, "--parallel"},
		{"positional", []string{"extra"}, "unexpected"},
		{"pepsal without binary", []string{"--modes", "e2e,pepsal"}, "--pepsal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := runBenchTTS(context.Background(), &Env{Stdout: &out, Stderr: &errb}, tc.args)
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("runBenchTTS(%q) = %v; want usage error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestBenchTTSMerge: --merge pools the transfers of two results files
// into one table (n counts both) and writes results.md to --out.
func TestBenchTTSMerge(t *testing.T) {
	dir := t.TempDir()
	line := func(run, mode string, secs float64) string {
		return fmt.Sprintf(`{"utc":"2026-11-28T11:00:00Z","run":%q,"world":"tables","setup":"rate=100","cc":"cubic","row":{"name":"jitter J=1ms","d1":100,"j1":1,"l1":1e-6,"d2":100,"j2":1,"l2":1e-6},"mode":%q,"size":70000000,"trial":1,"seed":1,"secs":%v,"load":[0.5,0.5,0.5]}`+"\n", run, mode, secs)
	}
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	if err := os.WriteFile(a, []byte(line("a", "e2e", 12)+line("a", "tts", 8)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte(line("b", "tts", 9)+line("b", "e2e", 13)), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := runBenchTTS(context.Background(), &Env{Stdout: &out, Stderr: &errb}, []string{"--merge", a + "," + b, "--out", filepath.Join(dir, "m")}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| jitter J=1ms | 2/2 |") || !strings.Contains(out.String(), "4 transfers from 2 files") {
		t.Errorf("merged report:\n%s", out.String())
	}
	if md, err := os.ReadFile(filepath.Join(dir, "m", "results.md")); err != nil || !bytes.Equal(md, out.Bytes()) {
		t.Errorf("results.md: %v; want the report", err)
	}
	if err := runBenchTTS(context.Background(), &Env{Stdout: &out, Stderr: &errb}, []string{"--merge", filepath.Join(dir, "none.jsonl")}); err == nil {
		t.Error("--merge of a missing file: no error")
	}
}
