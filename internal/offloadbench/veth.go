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
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/mosto-net/mosto/internal/proxybench"
)

// Veth modes.
const (
	VethDirect  = "direct"  // peer1 -> peer2 routed by the relay namespace
	VethSplice  = "splice"  // mosto proxy, offload off (Go splice relay)
	VethOffload = "offload" // mosto proxy, offload after 1 MB
	VethHAProxy = "haproxy" // HAProxy 2.6 tuned as in bench proxy (proxybench.HAProxyConf)
	VethNginx   = "nginx"   // nginx stream tuned as in bench proxy (proxybench.NginxConf)
)

// IsVethPeer reports whether mode is a tuned peer's, the reference of
// the "vs best peer" ratios.
func IsVethPeer(mode string) bool { return mode == VethHAProxy || mode == VethNginx }

// VethConfig is one `bench offload veth` run.
type VethConfig struct {
	Mosto    string        // mosto binary
	HAProxy  string        // haproxy binary ("" skips the mode)
	Nginx    string        // nginx binary ("" skips the mode)
	NginxMod string        // nginx's stream module to load ("": built in)
	Threads  int           // every relay's threads (mosto's GOMAXPROCS, HAProxy's nbthread, nginx's workers; 0: one per CPU)
	Duration time.Duration // per iperf3 run
	Streams  int           // parallel flows
	Hops     int           // relays in the line (0: 1); each relay offloads its own flow
	Modes    []string
}

// VethResult is one mode's figures.
type VethResult struct {
	Mode       string
	Gbps       float64
	Bytes      int64
	RelayCPU   time.Duration // user+system of the relay processes and their children (all hops)
	ProgCPU    time.Duration // the eBPF programs' run time (kernel.bpf_stats_enabled)
	RelayPerGB time.Duration
	TotalPerGB time.Duration
	Joined     []int // offload mode: flows each relay joined in the kernel, in line order (-1: unknown)
	Err        error
}

// vethLine is peer1 -- relay 1 -- ... -- relay n -- peer2, one veth pair
// per link. Link k (1..n+1) is 10.72.k.0/24: its left end .1, its right
// end .2.
type vethLine struct {
	p1, p2         string // namespaces
	p1Addr, p2Addr string
	relays         []vethRelay
}

// vethRelay is one relay namespace of a vethLine.
type vethRelay struct {
	ns            string
	addrIn        string // on the link towards peer1
	addrOut       string // on the link towards peer2
	devIn, devOut string
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newVethLine builds a line with hops relays (routed: every namespace
// forwards, so direct TCP crosses the same namespaces and veths).
func newVethLine(hops int) (*vethLine, func(), error) {
	id := fmt.Sprintf("xb%04d", rand.IntN(10000))
	n := hops
	l := &vethLine{p1: id + "p1", p2: id + "p2", p1Addr: "10.72.1.1", p2Addr: fmt.Sprintf("10.72.%d.2", n+1)}
	nss := []string{l.p1}
	for i := 1; i <= n; i++ {
		r := vethRelay{ns: fmt.Sprintf("%sr%d", id, i), addrIn: fmt.Sprintf("10.72.%d.2", i), addrOut: fmt.Sprintf("10.72.%d.1", i+1),
			devIn: fmt.Sprintf("%sl%dr", id, i), devOut: fmt.Sprintf("%sl%dl", id, i+1)}
		l.relays = append(l.relays, r)
		nss = append(nss, r.ns)
	}
	nss = append(nss, l.p2)
	cleanup := func() {
		for _, ns := range nss {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
	var steps [][]string
	for _, ns := range nss {
		steps = append(steps, []string{"ip", "netns", "add", ns})
	}
	// Link k joins nss[k-1] (device <id>l<k>l, address .1) and nss[k]
	// (device <id>l<k>r, address .2).
	for k := 1; k <= n+1; k++ {
		left, right := fmt.Sprintf("%sl%dl", id, k), fmt.Sprintf("%sl%dr", id, k)
		steps = append(steps,
			[]string{"ip", "link", "add", left, "netns", nss[k-1], "type", "veth", "peer", "name", right, "netns", nss[k]},
			[]string{"ip", "-n", nss[k-1], "addr", "add", fmt.Sprintf("10.72.%d.1/24", k), "dev", left},
			[]string{"ip", "-n", nss[k], "addr", "add", fmt.Sprintf("10.72.%d.2/24", k), "dev", right},
			[]string{"ip", "-n", nss[k-1], "link", "set", left, "up"},
			[]string{"ip", "-n", nss[k], "link", "set", right, "up"})
	}
	for _, ns := range nss {
		steps = append(steps, []string{"ip", "-n", ns, "link", "set", "lo", "up"})
	}
	steps = append(steps,
		[]string{"ip", "-n", l.p1, "route", "add", "default", "via", "10.72.1.2"},
		[]string{"ip", "-n", l.p2, "route", "add", "default", "via", fmt.Sprintf("10.72.%d.1", n+1)})
	// Node i (1..n) reaches the links left of it via link i's .1 and
	// those right of it via link i+1's .2.
	for i := 1; i <= n; i++ {
		for k := 1; k <= n+1; k++ {
			switch {
			case k < i:
				steps = append(steps, []string{"ip", "-n", nss[i], "route", "add", fmt.Sprintf("10.72.%d.0/24", k), "via", fmt.Sprintf("10.72.%d.1", i)})
			case k > i+1:
				steps = append(steps, []string{"ip", "-n", nss[i], "route", "add", fmt.Sprintf("10.72.%d.0/24", k), "via", fmt.Sprintf("10.72.%d.2", i+1)})
			}
		}
		steps = append(steps, []string{"ip", "netns", "exec", nss[i], "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"})
	}
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
	l, cleanup, err := newVethLine(max(1, cfg.Hops))
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
	threads := cfg.Threads
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	var relays []*exec.Cmd // relay i+1's process, in line order
	for i, r := range l.relays {
		origin := l.p2Addr
		if i+1 < len(l.relays) {
			origin = l.relays[i+1].addrIn
		}
		var relay *exec.Cmd
		switch res.Mode {
		case VethDirect:
			continue
		case VethSplice, VethOffload:
			conf := map[string]any{
				"id":           fmt.Sprintf("r%d", i+1),
				"destinations": map[string]any{"allow": []string{origin + "/32"}},
				"services":     []map[string]any{{"name": "b", "listen": r.addrIn + ":5201", "origin": origin + ":5201"}},
				"limits":       map[string]int{"max_conns": 10000, "max_conns_per_source": 10000},
				"timeouts":     map[string]string{"idle": "10m"},
				"pool":         map[string]int{"hop": 0},
				"socket":       map[string]bool{"fastopen": false},
				"loops":        -1,
			}
			if res.Mode == VethOffload {
				conf["offload"] = map[string]any{"mode": "bytes", "after_bytes": 1 << 20, "interfaces": []string{r.devIn, r.devOut}}
				conf["metrics"] = map[string]any{"listen": metricsAddr} // in the relay's own namespace
			}
			path := filepath.Join(dir, fmt.Sprintf("%s-%d.yaml", res.Mode, i+1))
			b, _ := json.Marshal(conf)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				return err
			}
			relay = exec.CommandContext(ctx, "ip", "netns", "exec", r.ns, cfg.Mosto, "proxy", "--config", path)
			relay.Env = append(os.Environ(), fmt.Sprintf("GOMAXPROCS=%d", threads))
		case VethHAProxy:
			if cfg.HAProxy == "" {
				return errors.New("haproxy not installed")
			}
			path := filepath.Join(dir, fmt.Sprintf("haproxy-%d.cfg", i+1))
			conf := proxybench.HAProxyConf(true, 4000, threads, r.addrIn+":5201", origin+":5201")
			if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
				return err
			}
			relay = exec.CommandContext(ctx, "ip", "netns", "exec", r.ns, cfg.HAProxy, "-f", path, "-db")
		case VethNginx:
			if cfg.Nginx == "" {
				return errors.New("nginx not installed")
			}
			ndir := filepath.Join(dir, fmt.Sprintf("nginx-%d", i+1))
			if err := os.MkdirAll(ndir, 0o755); err != nil {
				return err
			}
			load := ""
			if cfg.NginxMod != "" {
				load = fmt.Sprintf("load_module %s;\n", cfg.NginxMod)
			}
			path := filepath.Join(ndir, "nginx.conf")
			conf := proxybench.NginxConf(true, load, 8100, 4000, threads, ndir, r.addrIn+":5201", origin+":5201")
			if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
				return err
			}
			relay = exec.CommandContext(ctx, "ip", "netns", "exec", r.ns, cfg.Nginx, "-p", ndir, "-e", filepath.Join(ndir, "error.log"), "-c", path)
		default:
			return fmt.Errorf("unknown mode %q", res.Mode)
		}
		relays = append(relays, relay)
	}
	if len(relays) > 0 {
		target = l.relays[0].addrIn
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
	// The last relay starts first, so each relay's origin is up before it.
	for i := len(relays) - 1; i >= 0; i-- {
		relay := relays[i]
		if err := relay.Start(); err != nil {
			return err
		}
		defer func() { relay.Process.Signal(os.Interrupt); relay.Wait() }()
		from := l.p1
		if i > 0 {
			from = l.relays[i-1].ns
		}
		if err := waitRelayed(from, l.relays[i].addrIn+":5201", 10*time.Second); err != nil {
			return err
		}
	}
	cpu0 := procCPU(relays...)
	prog0 := progRuntime()
	args := []string{"netns", "exec", l.p1, "iperf3", "-c", target, "-p", "5201", "-R", "-J",
		"-t", strconv.Itoa(int(cfg.Duration.Seconds())), "-P", strconv.Itoa(max(1, cfg.Streams))}
	outb, err := exec.CommandContext(ctx, "ip", args...).Output()
	if err != nil {
		return fmt.Errorf("iperf3: %v: %s", err, outb)
	}
	res.RelayCPU = procCPU(relays...) - cpu0
	if res.Mode == VethOffload {
		for _, r := range l.relays {
			res.Joined = append(res.Joined, joined(ctx, r.ns))
		}
	}
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

// metricsAddr is each offloading relay's metrics listener, on the
// loopback of its own namespace.
const metricsAddr = "127.0.0.1:9901"

// joined reads mosto_relay_offload_joined_total from the relay of
// namespace ns (-1 when it cannot be read).
func joined(ctx context.Context, ns string) int {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "curl", "-fsS", "-m", "5", "http://"+metricsAddr+"/metrics").Output()
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "mosto_relay_offload_joined_total "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return -1
			}
			return int(f)
		}
	}
	return -1
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

// procCPU is the user+system time of processes, their threads and their
// children (nginx's workers).
func procCPU(cs ...*exec.Cmd) time.Duration {
	var t time.Duration
	for _, c := range cs {
		if c == nil || c.Process == nil {
			continue
		}
		for _, pid := range procTree(c.Process.Pid) {
			t += pidCPU(pid)
		}
	}
	return t
}

// procTree is pid and its descendants (/proc/PID/task/TID/children).
func procTree(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", out[i]))
		for _, f := range tasks {
			b, _ := os.ReadFile(f)
			for _, c := range strings.Fields(string(b)) {
				if p, err := strconv.Atoi(c); err == nil {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// pidCPU is the user+system time of one process (all its threads).
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
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

// progRuntime sums the run time of the xlate programs loaded on this host
// (kernel.bpf_stats_enabled), read with the bpf syscall (bpftool may be
// absent: session 9's eBPF column read 0 without it).
func progRuntime() time.Duration {
	var t time.Duration
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			return t
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		info, ierr := p.Info()
		st, serr := p.Stats()
		p.Close()
		if ierr == nil && serr == nil && strings.HasPrefix(info.Name, "xlate_") {
			t += st.Runtime
		}
	}
}
