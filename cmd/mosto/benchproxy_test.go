package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/proxybench"
)

// TestBenchProxyMostoModes runs a tiny `mosto bench proxy` of the built
// binary in its mosto modes (one proxy with and without event loops, a
// chain of three) beside direct, and checks that every mode measured every
// figure: one throughput run, connections per second, latency, idle RSS and
// idle flows, the equal-CPU test as root, and the Markdown report.
func TestBenchProxyMostoModes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts proxy processes")
	}
	modes := []string{proxybench.ModeDirect, proxybench.ModeMosto1, proxybench.ModeMosto1G, proxybench.ModeMosto3}
	dir := t.TempDir()
	out := filepath.Join(dir, "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, mostoBin, "bench", "proxy", "-modes", strings.Join(modes, ","),
		"-bytes", "20MB", "-runs", "1", "-conn-duration", "200ms", "-parallel", "2", "-lat-conns", "20",
		"-idle", "20", "-threads", "1", "-json", out, "-dir", dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("mosto bench proxy: %v\nstderr:\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep proxybench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report JSON: %v", err)
	}
	if len(rep.Results) != len(modes) {
		t.Fatalf("%d results; want one per mode %v", len(rep.Results), modes)
	}
	root := os.Geteuid() == 0
	if root && rep.CapErr != "" {
		t.Errorf("equal-CPU test not run as root: %s", rep.CapErr)
	}
	for i, res := range rep.Results {
		if res.Mode != modes[i] {
			t.Errorf("result %d is %q; want %q", i, res.Mode, modes[i])
		}
		if res.Err != "" {
			t.Errorf("%s: %s", res.Mode, res.Err)
			continue
		}
		if len(res.Gbps) != 1 || res.Gbps[0] <= 0 {
			t.Errorf("%s: throughput %v; want one figure > 0", res.Mode, res.Gbps)
		}
		if len(res.ConnPerS) != 1 || res.ConnPerS[0] <= 0 || res.ConnFail != 0 {
			t.Errorf("%s: conn/s %v, %d failed; want one figure > 0, none failed", res.Mode, res.ConnPerS, res.ConnFail)
		}
		if len(res.LatP50) != 1 || res.LatP50[0] <= 0 || res.LatP99[0] < res.LatP50[0] || res.LatFail != 0 {
			t.Errorf("%s: latency p50 %v p99 %v, %d failed; want one run, p99 >= p50 > 0", res.Mode, res.LatP50, res.LatP99, res.LatFail)
		}
		if res.Mode == proxybench.ModeDirect {
			continue
		}
		// CPU is read in clock ticks: 20 MB may cost less than one.
		if len(res.CPUPerGB) != 1 || res.CPUPerGB[0] < 0 || len(res.CPUPer1k) != 1 || res.CPUPer1k[0] < 0 {
			t.Errorf("%s: CPU per GB %v, per 1k conns %v; want one figure each", res.Mode, res.CPUPerGB, res.CPUPer1k)
		}
		if root && (len(res.CappedConnPerS) != 1 || res.CappedConnPerS[0] <= 0) {
			t.Errorf("%s: capped conn/s %v; want one figure", res.Mode, res.CappedConnPerS)
		}
		if res.IdleRSS <= 0 || res.IdleFlows != 20 {
			t.Errorf("%s: idle RSS %d, idle flows %d; want > 0 and 20", res.Mode, res.IdleRSS, res.IdleFlows)
		}
		if !strings.Contains(stdout.String(), res.Mode) {
			t.Errorf("Markdown report lacks mode %s:\n%s", res.Mode, stdout.String())
		}
	}
	t.Logf("report:\n%s", stdout.String())
}
