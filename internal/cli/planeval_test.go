package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunPlanEval(t *testing.T) {
	out := filepath.Join(t.TempDir(), "eval")
	var stdout, stderr bytes.Buffer
	env := &Env{Stdout: &stdout, Stderr: &stderr}
	if err := runPlanEval(context.Background(), env, []string{"--out", out, "--max-graphs", "3", "--max-nodes", "30"}); err != nil {
		t.Fatalf("runPlanEval: %v (stderr %s)", err, stderr.String())
	}
	for _, f := range []string{"fig2.svg", "results.md"} {
		b, err := os.ReadFile(filepath.Join(out, f))
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v, %d bytes", f, err, len(b))
		}
	}
	if s := stdout.String(); !strings.Contains(s, "3 graphs") || !strings.Contains(s, "wrote ") {
		t.Errorf("stdout = %q", s)
	}
	stdout.Reset()
	if err := runPlanEval(context.Background(), env, []string{"--out", out, "--set", "zoo", "--max-nodes", "9"}); err != nil {
		t.Fatalf("runPlanEval --set zoo: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(md), "Rocketfuel") || !strings.Contains(string(md), "| Zoo Getnet |") {
		t.Errorf("--set zoo --max-nodes 9: results.md lists the wrong graphs:\n%s", md)
	}
	if s := stdout.String(); !strings.Contains(s, "graphs") || !strings.Contains(s, "minimax") || !strings.Contains(s, "wrote ") {
		t.Errorf("stdout = %q", s)
	}
}

func TestRunPlanEvalUsage(t *testing.T) {
	for _, args := range [][]string{
		{"extra"},
		{"--max-graphs", "-1"},
		{"--min-nodes", "1"},
		{"--min-nodes", "20", "--max-nodes", "10"},
		{"--bogus"},
		{"--set", "planetlab"},
	} {
		var buf bytes.Buffer
		err := runPlanEval(context.Background(), &Env{Stdout: &buf, Stderr: &buf}, args)
		if !errors.Is(err, errUsage) {
			t.Errorf("runPlanEval(%q) = %v; want a usage error", args, err)
		}
	}
	var buf bytes.Buffer
	err := runPlanEval(context.Background(), &Env{Stdout: &buf, Stderr: &buf}, []string{"--min-nodes", "500", "--max-nodes", "600", "--out", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "no embedded graph") {
		t.Errorf("runPlanEval(500-600 nodes) = %v; want no embedded graph", err)
	}
}
