package proxybench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		ppid    int
		cpu     time.Duration
		rss     int64
		wantErr bool
	}{
		{"plain", "42 (haproxy) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 2 0 100 1000 300 18446744073709551615", 1, 2 * time.Second, 300, false},
		{"spaces and parens in name", "7 (a (b) c) R 3 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 10 9 0", 3, 30 * time.Millisecond, 9, false},
		{"truncated", "7 (x) R 3 7", 0, 0, 0, true},
		{"garbage", "nonsense", 0, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := parseStat([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseStat err = %v; want error %v", err, tt.wantErr)
			}
			if err == nil && (st.ppid != tt.ppid || st.cpu != tt.cpu || st.rssPages != tt.rss) {
				t.Errorf("parseStat = %+v; want ppid %d cpu %v rss %d", st, tt.ppid, tt.cpu, tt.rss)
			}
		})
	}
	if got := parseRssAnon([]byte("Name:\tx\nVmRSS:\t 900 kB\nRssAnon:\t    2684 kB\nRssFile:\t 1 kB\n")); got != 2684<<10 {
		t.Errorf("parseRssAnon = %d; want %d", got, 2684<<10)
	}
	if rssAnon(os.Getpid()) <= 0 {
		t.Error("rssAnon(self) = 0")
	}
	// Our own process: non-zero RSS, parent is our parent.
	st, err := readStat(os.Getpid())
	if err != nil || st.rssPages == 0 || st.ppid != os.Getppid() {
		t.Errorf("readStat(self) = %+v, %v", st, err)
	}
}

func TestSinkLoads(t *testing.T) {
	sk, err := newSink()
	if err != nil {
		t.Fatal(err)
	}
	defer sk.close()
	ctx := context.Background()
	buf := make([]byte, 64<<10)
	if _, err := transfer(ctx, sk.addr(), 3<<20+17, buf); err != nil {
		t.Errorf("transfer: %v", err)
	}
	ok, failed, sample := connRate(ctx, sk.addr(), 4, 10, 200*time.Millisecond)
	if ok == 0 || failed != 0 {
		t.Errorf("connRate = %d ok, %d failed (%v); want some ok, none failed", ok, failed, sample)
	}
	conns, err := openIdle(ctx, sk.addr(), 50, sk, 5*time.Second)
	if err != nil || len(conns) != 50 {
		t.Errorf("openIdle = %d conns, %v", len(conns), err)
	}
	for _, c := range conns {
		c.Close()
	}
	// A relay that drops bytes is caught: the sink's count must match.
	if _, err := transfer(ctx, "127.0.0.1:1", 10, buf); err == nil {
		t.Error("transfer to a closed port succeeded")
	}
}

func TestParseSwitches(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		want int64
	}{
		{"both", "Name:\tx\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t 7\n", 127},
		{"one", "voluntary_ctxt_switches:\t5\n", 5},
		{"none", "Name:\tx\nVmRSS:\t900 kB\n", 0},
		{"malformed", "voluntary_ctxt_switches:\tx\nnonvoluntary_ctxt_switches:\t-3\n", 0},
	} {
		if got := parseSwitches([]byte(tt.in)); got != tt.want {
			t.Errorf("%s: parseSwitches = %d; want %d", tt.name, got, tt.want)
		}
	}
	if n := switches([]int{os.Getpid()}); n <= 0 {
		t.Errorf("switches(self) = %d; want > 0", n)
	}
}

func FuzzParseSwitches(f *testing.F) {
	f.Add([]byte("voluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n"))
	f.Add([]byte("Name:\tx\n"))
	f.Add([]byte(":\n::\nvoluntary_ctxt_switches:99999999999999999999\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := parseSwitches(b); n < 0 {
			t.Errorf("parseSwitches(%q) = %d < 0", b, n)
		}
	})
}

func TestParseMachineCPU(t *testing.T) {
	busy, total := parseMachineCPU([]byte("cpu  100 20 30 400 5 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"))
	// busy: user+nice+system+irq+softirq+steal = 171 ticks; total adds idle and iowait: 576.
	if busy != 1710*time.Millisecond || total != 5760*time.Millisecond {
		t.Errorf("parseMachineCPU = %v, %v; want 1.71s, 5.76s", busy, total)
	}
	if b, tt := parseMachineCPU([]byte("intr 1 2\n")); b != 0 || tt != 0 {
		t.Errorf("parseMachineCPU(no cpu line) = %v, %v; want 0, 0", b, tt)
	}
}

func TestWriteMarkdownRatios(t *testing.T) {
	rep := &Report{
		Config: Config{Runs: 2, Bytes: 1e9, ConnParallel: 4, ConnDuration: time.Second, ConnPayload: 64, IdleConns: 10, ConnCPU: 0.5, Threads: 2, CoreHour: 0.054},
		Results: []*Result{
			{Mode: ModeHAProxy, Gbps: []float64{4, 6}, CPUPerGB: []float64{1, 1}, ConnPerS: []float64{1000}, CPUPer1k: []float64{0.2}, SwitchesPerConn: []float64{1}, CappedConnPerS: []float64{100, 200}, CappedCPUPer1k: []float64{1, 1}, LatP50: []float64{300}, LatP99: []float64{900}, IdleRSS: 10e6, IdleAnon: 4e6, PerConn: 4000},
			{Mode: ModeMosto1, Gbps: []float64{10, 8}, CPUPerGB: []float64{0.5, 0.5}, LoadCPUPerGB: []float64{0.6, 0.8}, BusyCPUs: []float64{1.9, 2}, ConnPerS: []float64{500}, CPUPer1k: []float64{0.4}, SwitchesPerConn: []float64{2.5, 1.5, 3}, CappedConnPerS: []float64{150, 200}, CappedCPUPer1k: []float64{0.5, 0.5}, LatP50: []float64{200, 210, 150}, LatP99: []float64{500}, LatFail: 2, IdleRSS: 5e6, IdleAnon: 2e6, PerConn: 8000},
			{Mode: ModeNginx, Err: "nginx not installed"},
			{Mode: ModeDirect, LatP50: []float64{100}, LatP99: []float64{300}},
		},
	}
	rep.Config.LatConns = 10
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	out := b.String()
	for _, want := range []string{
		// 0.5 s/GB at $0.054/core-hour: 0.5*1000/3600*0.054 = $0.0075/TB.
		"| mosto1 | 9.00 | 10.00 8.00 | 1.80x haproxy | 1.92x (1.33-2.50) | 0.500 | 0.50x haproxy | 0.50x (0.50-0.50) | 0.0075 | 0.700 | 1.90 2.00 |",
		"| mosto1 | 500 | 500 | 0.50x haproxy | 0.50x (0.50-0.50) | 0 | 0.400 | 2.00x haproxy | 2.50 | 2.50x haproxy |",
		// Capped: medians 175 vs 150; per-run ratios 1.5 and 1.0; CPU used 0.075 and 0.1.
		"| mosto1 | 175 | 150 200 | 1.17x haproxy | 1.25x (1.00-1.50) | 0.500 | 0.50x haproxy | 0.07 0.10 |",
		"| mosto1 | 5.0 | 0.50x haproxy | 2.0 | 0.50x haproxy | 8.0 | 2.00x haproxy |",
		"- nginx: nginx not installed",
		// Added over direct in the same run: p50 100 vs HAProxy's 200; p99 500 vs 900.
		"| mosto1 | 200 | 100 | 0.50x haproxy | 0.50x (0.50-0.50) | 500 | 0.56x haproxy | 0.56x (0.56-0.56) | 2 |",
		"| direct | 100 | - | - | - | 300 | - | - | 0 |",
		// Headline: per-run ratios against the best tuned peer, target, met.
		"| single-flow throughput (Gbit/s) | 9.00 | haproxy 5.00 | 1.92x (1.33-2.50) | >= 1.2x | yes |",
		"| relay CPU s per GB | 0.500 | haproxy 1.000 | 0.50x (0.50-0.50) | <= 0.6x | yes |",
		"| conn/s at equal CPU (own cgroup each) | 175 at 0.07 0.10 CPU | haproxy 150 at 0.10 0.20 CPU | 1.25x (1.00-1.50) | >= 1.2x | yes |",
		"| added time per connection, p50 (us) | 100 | haproxy 200 | 0.50x (0.50-0.50) | <= 1.0x | yes |",
		"| RSS per idle flow (KB) | 8.0 | haproxy 4.0 | 2.00x (2.00-2.00) | <= 1.0x | no |",
		"| relay CPU cost per delivered TB at $0.054/core-hour | $0.0075 | haproxy $0.0150 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestWriteMarkdownBestPeer: each figure of a single relay is compared
// with whichever tuned peer is better in it, per run for the paired
// ratio; the default configurations are never the reference.
func TestWriteMarkdownBestPeer(t *testing.T) {
	rep := &Report{
		Config: Config{Runs: 3, Bytes: 1e9, ConnParallel: 4, ConnDuration: time.Second, ConnPayload: 64, IdleConns: 10, ConnCPU: 0.5, Threads: 2, CoreHour: 0.054},
		Results: []*Result{
			// HAProxy has the better throughput median, nginx wins run 2.
			{Mode: ModeHAProxy, Gbps: []float64{6, 4, 6}, CPUPerGB: []float64{0.6, 0.6, 0.6}, CappedConnPerS: []float64{100, 100, 100}, CappedCPUPer1k: []float64{1, 1, 1}},
			{Mode: ModeNginx, Gbps: []float64{5, 8, 5}, CPUPerGB: []float64{0.9, 0.3, 0.9}, CappedConnPerS: []float64{200, 200, 100}, CappedCPUPer1k: []float64{0.5, 0.5, 1}},
			// A default peer better than both must not become the reference.
			{Mode: ModeHAProxyDefault, Gbps: []float64{50, 50, 50}, CPUPerGB: []float64{0.01, 0.01, 0.01}, CappedConnPerS: []float64{900, 900, 900}, CappedCPUPer1k: []float64{0.1, 0.1, 0.1}},
			{Mode: ModeMosto1, Gbps: []float64{12, 12, 12}, CPUPerGB: []float64{0.3, 0.3, 0.3}, CappedConnPerS: []float64{300, 300, 300}, CappedCPUPer1k: []float64{0.5, 0.5, 0.5}},
		},
	}
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	out := b.String()
	for _, want := range []string{
		// Throughput: medians 12 / 6 (haproxy); per run 12/6, 12/8, 12/6.
		// CPU: medians 0.3 / 0.6 (haproxy); per run 0.3/0.6, 0.3/0.3, 0.3/0.6.
		"| mosto1 | 12.00 | 12.00 12.00 12.00 | 2.00x haproxy | 2.00x (1.50-2.00) | 0.300 | 0.50x haproxy | 0.50x (0.50-1.00) |",
		// Capped conn/s: nginx's median 200 beats haproxy's 100; per run 300/200, 300/200, 300/100.
		"| mosto1 | 300 | 300 300 300 | 1.50x nginx | 1.50x (1.50-3.00) | 0.500 | 1.00x nginx |",
		"| haproxy-default | 50.00 | 50.00 50.00 50.00 | 8.33x haproxy |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestPeerConfigs: the tuned peers get the levers their experts would set;
// the default ones do not.
func TestPeerConfigs(t *testing.T) {
	tuned := HAProxyConf(true, 1000, 3, "127.0.0.1:1", "127.0.0.1:2")
	def := HAProxyConf(false, 1000, 3, "127.0.0.1:1", "127.0.0.1:2")
	for _, want := range []string{"nbthread 3\n", "tune.pipesize 1048576\n", "option splice-auto\n", "bind 127.0.0.1:1 thread 1\n", "bind 127.0.0.1:1 thread 3\n", "server next 127.0.0.1:2\n"} {
		if !strings.Contains(tuned, want) {
			t.Errorf("tuned haproxy config lacks %q:\n%s", want, tuned)
		}
	}
	if !strings.Contains(def, "bind 127.0.0.1:1\n") {
		t.Errorf("default haproxy config lacks its one bind line:\n%s", def)
	}
	for _, not := range []string{"nbthread", "pipesize", "splice", "thread 1"} {
		if strings.Contains(def, not) {
			t.Errorf("default haproxy config has %q:\n%s", not, def)
		}
	}
	ng := NginxConf(true, "", 100, 50, 3, "/d", "127.0.0.1:1", "127.0.0.1:2")
	for _, want := range []string{"worker_processes 3;", "listen 127.0.0.1:1 reuseport", "proxy_buffer_size 256k;", "proxy_pass 127.0.0.1:2;"} {
		if !strings.Contains(ng, want) {
			t.Errorf("tuned nginx config lacks %q:\n%s", want, ng)
		}
	}
	ngd := NginxConf(false, "", 100, 50, 3, "/d", "127.0.0.1:1", "127.0.0.1:2")
	for _, not := range []string{"reuseport", "proxy_buffer_size", "worker_processes 3"} {
		if strings.Contains(ngd, not) {
			t.Errorf("default nginx config has %q:\n%s", not, ngd)
		}
	}
}

// TestWriteMarkdownChains: the chain rows compare with haproxy3, the
// single-relay rows with the best tuned peer.
func TestWriteMarkdownChains(t *testing.T) {
	rep := &Report{
		Config: Config{Runs: 1, Bytes: 1e9, ConnParallel: 4, ConnDuration: time.Second, ConnPayload: 64, IdleConns: 10},
		Results: []*Result{
			{Mode: ModeHAProxy, ConnPerS: []float64{1000}, CPUPer1k: []float64{0.2}, SwitchesPerConn: []float64{1}, IdleRSS: 10e6, IdleAnon: 4e6, PerConn: 4000},
			{Mode: ModeHAProxy3, ConnPerS: []float64{400}, CPUPer1k: []float64{0.8}, SwitchesPerConn: []float64{4}, IdleRSS: 30e6, IdleAnon: 12e6, PerConn: 12000},
			{Mode: ModeMosto3, ConnPerS: []float64{600}, CPUPer1k: []float64{0.4}, SwitchesPerConn: []float64{2}, IdleRSS: 15e6, IdleAnon: 6e6, PerConn: 6000},
			{Mode: ModeMosto1, ConnPerS: []float64{500}, CPUPer1k: []float64{0.4}, SwitchesPerConn: []float64{2}},
		},
	}
	var b bytes.Buffer
	rep.WriteMarkdown(&b)
	out := b.String()
	// Only chains measured: the equal-CPU table still shows them.
	chains := &Report{
		Config: Config{Runs: 1, Bytes: 1e9, ConnParallel: 4, ConnDuration: time.Second, ConnPayload: 64, IdleConns: -1, ConnCPU: 0.5},
		Results: []*Result{
			{Mode: ModeMosto3, CappedConnPerS: []float64{300}, CappedCPUPer1k: []float64{1}},
			{Mode: ModeHAProxy3, CappedConnPerS: []float64{200}, CappedCPUPer1k: []float64{2}},
		},
	}
	b.Reset()
	chains.WriteMarkdown(&b)
	out += b.String()
	for _, want := range []string{
		"| mosto3 | 300 | 300 | 1.50x haproxy3 | 1.50x (1.50-1.50) | 1.000 | 0.50x haproxy3 | 0.30 |",
		"| mosto3 | 600 | 600 | 1.50x haproxy3 | 1.50x (1.50-1.50) | 0 | 0.400 | 0.50x haproxy3 | 2.00 | 0.50x haproxy3 |",
		"| haproxy3 | 400 | 400 | 1.00x haproxy3 | 1.00x (1.00-1.00) | 0 | 0.800 | 1.00x haproxy3 | 4.00 | 1.00x haproxy3 |",
		"| mosto1 | 500 | 500 | 0.50x haproxy | 0.50x (0.50-0.50) | 0 | 0.400 | 2.00x haproxy | 2.00 | 2.00x haproxy |",
		"| mosto3 | 15.0 | 0.50x haproxy3 | 6.0 | 0.50x haproxy3 | 6.0 | 0.50x haproxy3 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestRunExternalRelays runs a tiny benchmark through HAProxy and nginx
// (the mosto modes need the built binary: cmd/mosto TestBenchProxyMostoModes).
func TestRunExternalRelays(t *testing.T) {
	if testing.Short() {
		t.Skip("starts relay processes")
	}
	testenv.RequireCommand(t, "haproxy")
	testenv.RequireCommand(t, "nginx")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Run(ctx, Config{
		Modes: []string{ModeDirect, ModeHAProxy, ModeHAProxyDefault, ModeHAProxy3, ModeNginx, ModeNginxDefault}, Bytes: 20e6, Runs: 1,
		ConnDuration: 200 * time.Millisecond, ConnParallel: 2, IdleConns: 20, LatConns: 20, Dir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		if res.Err != "" {
			t.Errorf("%s: %s", res.Mode, res.Err)
			continue
		}
		if len(res.Gbps) != 1 || res.Gbps[0] <= 0 {
			t.Errorf("%s: %+v; want one throughput figure", res.Mode, res)
		}
		if len(res.LatP50) != 1 || res.LatP50[0] <= 0 || res.LatP99[0] < res.LatP50[0] {
			t.Errorf("%s: latency p50 %v p99 %v; want one run, p99 >= p50 > 0", res.Mode, res.LatP50, res.LatP99)
		}
		if len(res.ConnPerS) != 1 || res.ConnPerS[0] <= 0 {
			t.Errorf("%s: %+v; want one conn/s figure", res.Mode, res)
		}
		if root := os.Geteuid() == 0; root && rep.CapErr != "" {
			t.Errorf("equal-CPU test not run as root: %s", rep.CapErr)
		} else if root && res.Mode != ModeDirect && (len(res.CappedConnPerS) != 1 || res.CappedConnPerS[0] <= 0) {
			t.Errorf("%s: capped conn/s %v; want one figure", res.Mode, res.CappedConnPerS)
		}
		if res.Mode != ModeDirect && (res.IdleRSS <= 0 || res.IdleFlows != 20) {
			t.Errorf("%s: idle RSS %d, idle flows %d", res.Mode, res.IdleRSS, res.IdleFlows)
		}
	}
}

func TestRotate(t *testing.T) {
	rs := []*Result{{Mode: "a"}, {Mode: "b"}, {Mode: "c"}}
	for run, want := range []string{"abc", "bca", "cab", "abc"} {
		var got string
		for _, r := range rotate(rs, run) {
			got += r.Mode
		}
		if got != want {
			t.Errorf("run %d: order %s, want %s", run, got, want)
		}
	}
	if rs[0].Mode != "a" {
		t.Error("rotate changed its input")
	}
}

// TestCPUCap holds a busy process to 0.2 CPU with the cgroup the
// equal-CPU connection-rate test uses, and removes the cgroup.
func TestCPUCap(t *testing.T) {
	testenv.RequirePrivileged(t)
	cc, err := newCPUCap(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.remove() })
	busy := exec.Command("sh", "-c", "while :; do :; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Process.Kill(); busy.Wait() })
	if err := cc.add([]int{busy.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	if err := cc.set(0.2); err != nil {
		t.Fatal(err)
	}
	weight := func() string {
		f := "cpu.weight"
		if !cc.v2 {
			f = "cpu.shares"
		}
		b, err := os.ReadFile(filepath.Join(cc.dir, f))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if w := weight(); w != capWeightV2 && w != capSharesV1 {
		t.Errorf("capped cgroup weight %s; want the largest (%s or %s): the quota, not other load, must bound it", w, capWeightV2, capSharesV1)
	}
	cpu0, _ := usage([]int{busy.Process.Pid})
	start := time.Now()
	time.Sleep(1500 * time.Millisecond)
	cpu1, _ := usage([]int{busy.Process.Pid})
	share := (cpu1 - cpu0).Seconds() / time.Since(start).Seconds()
	t.Logf("busy process held to %.2f CPU (cap 0.2)", share)
	if share > 0.3 {
		t.Errorf("capped busy loop used %.2f CPU; cap 0.2", share)
	}
	if share <= 0 {
		t.Errorf("capped busy loop got no CPU")
	}
	if err := cc.set(0); err != nil {
		t.Fatal(err)
	}
	if w := weight(); w != defaultWeightV2 && w != defaultSharesV1 {
		t.Errorf("uncapped cgroup weight %s; want the default", w)
	}
	// boost: the largest weight and no quota (the load generator's cgroup).
	if err := cc.boost(); err != nil {
		t.Fatal(err)
	}
	if w := weight(); w != capWeightV2 && w != capSharesV1 {
		t.Errorf("boosted cgroup weight %s; want the largest", w)
	}
	cpu0, _ = usage([]int{busy.Process.Pid})
	start = time.Now()
	time.Sleep(1500 * time.Millisecond)
	cpu1, _ = usage([]int{busy.Process.Pid})
	if share := (cpu1 - cpu0).Seconds() / time.Since(start).Seconds(); share <= 0.3 {
		t.Errorf("boosted busy loop used %.2f CPU; want more than the old 0.2 cap (no quota)", share)
	} else {
		t.Logf("boosted busy loop used %.2f CPU", share)
	}
	busy.Process.Kill()
	busy.Wait()
	if err := cc.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cc.dir); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still there: %v", cc.dir, err)
	}
}
