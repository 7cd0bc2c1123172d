package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/proxybench"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestBenchProxyOffload runs `mosto bench proxy` with mosto1 and mosto1off
// in a network namespace of its own (mosto1off attaches the xlate program to
// that namespace's lo) and checks that the offloaded relay left the data
// path: its CPU per GB is well below mosto1's (session 12: 0.015 against
// 0.215 s/GB). Before session 12 xlate refused every join on lo (mss), so
// mosto1off relayed the whole flow like mosto1.
func TestBenchProxyOffload(t *testing.T) {
	if testing.Short() {
		t.Skip("starts proxy processes")
	}
	testenv.RequirePrivileged(t)
	ns := fmt.Sprintf("mbpo%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	modes := []string{proxybench.ModeMosto1, proxybench.ModeMosto1Off}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, mostoBin, "bench", "proxy", "-modes", modes[0]+","+modes[1],
		"-bytes", "1GB", "-offload-after", "8MB", "-runs", "1", "-conn-duration", "100ms", "-parallel", "1",
		"-lat-conns", "-1", "-idle", "-1", "-conn-cpu", "-1", "-threads", "1", "-json", out, "-dir", dir)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mosto bench proxy: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep proxybench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("report JSON: %v", err)
	}
	cpu := map[string]float64{}
	for _, res := range rep.Results {
		if res.Err != "" || len(res.Gbps) != 1 || res.Gbps[0] <= 0 || len(res.CPUPerGB) != 1 {
			t.Fatalf("%s: error %q, throughput %v, CPU per GB %v; want one run measured", res.Mode, res.Err, res.Gbps, res.CPUPerGB)
		}
		cpu[res.Mode] = res.CPUPerGB[0]
	}
	// 1 GB through mosto1 costs ~0.2 s of CPU (20 clock ticks); offloaded
	// after 8 MB, about a tenth of it.
	if on, off := cpu[proxybench.ModeMosto1Off], cpu[proxybench.ModeMosto1]; !(on < 0.5*off) {
		t.Errorf("relay CPU per GB: mosto1off %.3f s, mosto1 %.3f s; want mosto1off < 0.5x (offloaded)", on, off)
	}
	t.Logf("relay CPU per GB: mosto1off %.3f s, mosto1 %.3f s", cpu[proxybench.ModeMosto1Off], cpu[proxybench.ModeMosto1])
}
