package offloadbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Veth modes.
const (
	VethDirect  = "direct"  // peer1 -> peer2 routed by the relay namespace
	VethSplice  = "splice"  // mosto proxy, offload off (Go splice relay)
	VethOffload = "offload" // mosto proxy, offload after 1 MB
	VethHAProxy = "haproxy" // HAProxy 2.6, mode tcp, splice-auto
)

// VethConfig is one `bench offload veth` run.
type VethConfig struct {
	Mosto    string        // mosto binary
	HAProxy  string        // haproxy binary ("" skips the mode)
	Duration time.Duration // per iperf3 run
	Streams  int           // parallel flows
	Modes    []string
}

// VethResult is one mode's figures.
type VethResult struct {
	Mode       string
	Gbps       float64
	Bytes      int64
	RelayCPU   time.Duration // user+system of the relay process
	ProgCPU    time.Duration // the eBPF program's run time (kernel.bpf_stats_enabled)
	RelayPerGB time.Duration
	TotalPerGB time.Duration
	Err        error
}

type vethLine struct {
	p1, r, p2                      string
	p1Addr, rAddr1, rAddr2, p2Addr string
	rDev1, rDev2                   string
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newVethLine() (*vethLine, func(), error) {
	id := fmt.Sprintf("xb%04d", rand.IntN(10000))
	l := &vethLine{p1: id + "p1", r: id + "r", p2: id + "p2", p1Addr: "10.72.1.1", rAddr1: "10.72.1.2", rAddr2: "10.72.2.2", p2Addr: "10.72.2.1",
		rDev1: id + "b", rDev2: id + "c"}
	cleanup := func() {
		for _, ns := range []string{l.p1, l.r, l.p2} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
	steps := [][]string{
		{"ip", "netns", "add", l.p1}, {"ip", "netns", "add", l.r}, {"ip", "netns", "add", l.p2},
		{"ip", "link", "add", id + "a", "netns", l.p1, "type", "veth", "peer", "name", l.rDev1, "netns", l.r},
		{"ip", "link", "add", l.rDev2, "netns", l.r, "type", "veth", "peer", "name", id + "d", "netns", l.p2},
		{"ip", "-n", l.p1, "addr", "add", l.p1Addr + "/24", "dev", id + "a"},
		{"ip", "-n", l.r, "addr", "add", l.rAddr1 + "/24", "dev", l.rDev1},
		{"ip", "-n", l.r, "addr", "add", l.rAddr2 + "/24", "dev", l.rDev2},
		{"ip", "-n", l.p2, "addr", "add", l.p2Addr + "/24", "dev", id + "d"},
	}
	for _, ns := range []string{l.p1, l.r, l.p2} {
		steps = append(steps, []string{"ip", "-n", ns, "link", "set", "lo", "up"})
	}
	steps = append(steps,
		[]string{"ip", "-n", l.p1, "link", "set", id + "a", "up"},
		[]string{"ip", "-n", l.r, "link", "set", l.rDev1, "up"},
		[]string{"ip", "-n", l.r, "link", "set", l.rDev2, "up"},
		[]string{"ip", "-n", l.p2, "link", "set", id + "d", "up"},
		[]string{"ip", "-n", l.p1, "route", "add", "default", "via", l.rAddr1},
		[]string{"ip", "-n", l.p2, "route", "add", "default", "via", l.rAddr2},
		[]string{"ip", "netns", "exec", l.r, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"},
	)
	for _, s := range steps {
		if err := run(s...); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	return l, cleanup, nil
}

// RunVeth measures every mode side by side on one veth line.
func RunVeth(ctx context.Context, cfg VethConfig) ([]VethResult, error) {
	l, cleanup, err := newVethLine()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	dir, err := os.MkdirTemp("", "mosto-offload-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	old, _ := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled")
	os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", []byte("1"), 0)
	defer os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", old, 0)

	var out []VethResult
	for _, mode := range cfg.Modes {
		res := VethResult{Mode: mode}
		res.Err = runVethMode(ctx, cfg, l, dir, &res)
		out = append(out, res)
	}
	return out, nil
}

func runVethMode(ctx context.Context, cfg VethConfig, l *vethLine, dir string, res *VethResult) error {
	target := l.p2Addr
	var relay *exec.Cmd
	switch res.Mode {
	case VethDirect:
	case VethSplice, VethOffload:
		conf := map[string]any{
			"id":           "r",
			"destinations": map[string]any{"allow": []string{l.p2Addr + "/32"}},
			"services":     []map[string]any{{"name": "b", "listen": l.rAddr1 + ":5201", "origin": l.p2Addr + ":5201"}},
			"limits":       map[string]int{"max_conns": 10000, "max_conns_per_source": 10000},
			"timeouts":     map[string]string{"idle": "10m"},
			"pool":         map[string]int{"hop": 0},
			"socket":       map[string]bool{"fastopen": false},
			"loops":        -1,
		}
		if res.Mode == VethOffload {
			conf["offload"] = map[string]any{"mode": "bytes", "after_bytes": 1 << 20, "interfaces": []string{l.rDev1, l.rDev2}}
		}
		path := filepath.Join(dir, res.Mode+".yaml")
		b, _ := json.Marshal(conf)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return err
		}
		relay = exec.CommandContext(ctx, "ip", "netns", "exec", l.r, cfg.Mosto, "proxy", "--config", path)
		target = l.rAddr1
	case VethHAProxy:
		if cfg.HAProxy == "" {
			return errors.New("haproxy not installed")
		}
		path := filepath.Join(dir, "haproxy.cfg")
		conf := fmt.Sprintf(`global
  maxconn 4000
  nbthread 2
defaults
  mode tcp
  timeout connect 5s
  timeout client 10m
  timeout server 10m
  option splice-auto
listen b
  bind %s:5201
  server s %s:5201
`, l.rAddr1, l.p2Addr)
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return err
		}
		relay = exec.CommandContext(ctx, "ip", "netns", "exec", l.r, cfg.HAProxy, "-f", path, "-db")
		target = l.rAddr1
	default:
		return fmt.Errorf("unknown mode %q", res.Mode)
	}
	// The server runs before the relay, and the relay counts as ready only
	// once a probe through it has reached the server and been closed end to
	// end: a relay's listener accepts into its backlog before the relay
	// serves (it attaches the offload program first), and a probe still in
	// that backlog would reach iperf3 later, beside the measured client's
	// control connection (the first offload round used to fail with
	// "unable to receive control message: connection reset by peer").
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", l.p2, "iperf3", "-s", "-B", l.p2Addr, "-p", "5201")
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	if err := waitListen(l.p2, l.p2Addr+":5201", 10*time.Second); err != nil {
		return err
	}
	if relay != nil {
		if err := relay.Start(); err != nil {
			return err
		}
		defer func() { relay.Process.Signal(os.Interrupt); relay.Wait() }()
		if err := waitRelayed(l.p1, target+":5201", 10*time.Second); err != nil {
			return err
		}
	}
	cpu0 := procCPU(relay)
	prog0 := progRuntime()
	args := []string{"netns", "exec", l.p1, "iperf3", "-c", target, "-p", "5201", "-R", "-J",
		"-t", strconv.Itoa(int(cfg.Duration.Seconds())), "-P", strconv.Itoa(max(1, cfg.Streams))}
	outb, err := exec.CommandContext(ctx, "ip", args...).Output()
	if err != nil {
		return fmt.Errorf("iperf3: %v: %s", err, outb)
	}
	res.RelayCPU = procCPU(relay) - cpu0
	res.ProgCPU = max(0, progRuntime()-prog0)
	var rep struct {
		End struct {
			SumReceived struct {
				Bytes float64 `json:"bytes"`
				BPS   float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if os.Getenv("MOSTO_BENCH_DEBUG") != "" {
		os.Stderr.Write(outb)
	}
	if err := json.Unmarshal(outb, &rep); err != nil {
		return fmt.Errorf("iperf3 output: %v", err)
	}
	res.Gbps = rep.End.SumReceived.BPS / 1e9
	res.Bytes = int64(rep.End.SumReceived.Bytes)
	if res.Bytes > 0 {
		gb := float64(res.Bytes) / 1e9
		res.RelayPerGB = time.Duration(float64(res.RelayCPU) / gb)
		res.TotalPerGB = time.Duration(float64(res.RelayCPU+res.ProgCPU) / gb)
	}
	return nil
}

// waitRelayed connects from namespace ns to addr until a connection is
// accepted, relayed and closed by the far end after the probe's own FIN
// (socat: stdin at EOF, waits up to 5 s for the other side's close).
func waitRelayed(ns, addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		cmd := exec.Command("ip", "netns", "exec", ns, "socat", "-t", "5", "-", "TCP:"+addr)
		cmd.Stdin = strings.NewReader("")
		if cmd.Run() == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not relaying after %v", addr, d)
}

// waitListen dials addr from namespace ns until it answers.
func waitListen(ns, addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if exec.Command("ip", "netns", "exec", ns, "bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(addr, ":", "/", 1)).Run() == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not listening after %v", addr, d)
}

// procCPU is the user+system time of a process (and its threads).
func procCPU(c *exec.Cmd) time.Duration {
	if c == nil || c.Process == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ 100
}

// progRuntime sums run_time_ns of the xlate programs (bpftool).
func progRuntime() time.Duration {
	out, err := exec.Command("bpftool", "prog", "show", "-j").Output()
	if err != nil {
		return 0
	}
	var progs []struct {
		Name    string `json:"name"`
		RunTime int64  `json:"run_time_ns"`
	}
	if json.Unmarshal(out, &progs) != nil {
		return 0
	}
	var t int64
	for _, p := range progs {
		if strings.HasPrefix(p.Name, "xlate_") {
			t += p.RunTime
		}
	}
	return time.Duration(t)
}
