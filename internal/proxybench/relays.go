package proxybench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Mode names.
const (
	ModeDirect = "direct"
	ModeMosto1 = "mosto1"
	ModeMosto3 = "mosto3"
	// ModeMosto1G is one mosto proxy with its event loops off (`loops:
	// -1`): every flow on goroutines, the path before the loops.
	ModeMosto1G = "mosto1g"
	// ModeMosto1Off is mosto1 with offload on (`offload: {mode: bytes}`
	// after Config.OffloadAfter bytes, program on lo, not pinned): a flow
	// that reaches it leaves the relay's data path, joined by the xlate
	// eBPF program (issue 14). Its program sees every loopback packet of
	// the run while it is up (a hash lookup that misses for the other
	// modes' packets), so every mode measured beside it pays that.
	ModeMosto1Off = "mosto1off"
	// ModeHAProxy is HAProxy configured as its experts would for this
	// test (HAProxyConf): 1 MiB splice pipes, splice-auto, one thread per
	// mosto thread.
	ModeHAProxy = "haproxy"
	// ModeHAProxyDefault is HAProxy with the minimal configuration a TCP
	// relay needs (no splicing, default threads and buffers).
	ModeHAProxyDefault = "haproxy-default"
	// ModeHAProxy3 chains three tuned HAProxy processes, for comparison
	// with mosto3.
	ModeHAProxy3 = "haproxy3"
	// ModeNginx is nginx stream tuned (NginxConf): larger proxy buffers,
	// reuseport listeners, one worker per mosto thread.
	ModeNginx = "nginx"
	// ModeNginxDefault is nginx stream with its defaults (16 KiB buffers,
	// one shared listener, worker_processes auto).
	ModeNginxDefault = "nginx-default"
)

// AllModes lists every mode in report order.
var AllModes = []string{ModeDirect, ModeMosto1, ModeMosto1G, ModeMosto1Off, ModeMosto3, ModeHAProxy, ModeHAProxyDefault, ModeHAProxy3, ModeNginx, ModeNginxDefault}

// tunedPeers are the single-relay peers mosto1 is compared with: in every
// run the better of them for each figure is "the best peer".
var tunedPeers = []string{ModeHAProxy, ModeNginx}

// relay is one system under test: the address clients dial and the
// processes whose CPU and memory are charged to it.
type relay struct {
	mode  string
	entry string
	procs []*exec.Cmd
	waits []chan error
	log   *syncBuffer // output of the processes, for error reports
}

func (r *relay) pids() []int {
	var p []int
	for _, c := range r.procs {
		p = append(p, c.Process.Pid)
	}
	return p
}

func (r *relay) usage() (time.Duration, int64) { return usage(r.pids()) }

// stop sends SIGTERM to every process, then SIGKILL after grace, and
// waits for them.
func (r *relay) stop(grace time.Duration) {
	for _, c := range r.procs {
		c.Process.Signal(syscall.SIGTERM)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for i, c := range r.procs {
		select {
		case <-r.waits[i]:
		case <-timer.C:
			c.Process.Kill()
			<-r.waits[i]
		}
	}
}

// exited reports the first process that has exited, if any.
func (r *relay) exited() error {
	for i, w := range r.waits {
		select {
		case err := <-w:
			r.waits[i] <- err
			return fmt.Errorf("%s process %d exited: %v; output:\n%s", r.mode, r.procs[i].Process.Pid, err, tail(r.log.String(), 2000))
		default:
		}
	}
	return nil
}

// syncBuffer is a bytes.Buffer safe for the exec copy goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() > 1<<20 {
		return len(p), nil
	}
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// setup holds what starting relays needs.
type setup struct {
	dir      string
	origin   string
	mosto    string
	haproxy  string
	nginx    string
	nginxMod string
	maxconn  int // connection limit that fits the file descriptor limit
	threads  int // threads of every relay (mosto loops and GOMAXPROCS, HAProxy nbthread, nginx workers)
	// offloadAfter is mosto1off's offload threshold (bytes).
	offloadAfter int64
	log          *slog.Logger
}

// freePort returns a loopback address that was free a moment ago.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (s *setup) start(ctx context.Context, mode string) (*relay, error) {
	switch mode {
	case ModeDirect:
		return &relay{mode: mode, entry: s.origin, log: &syncBuffer{}}, nil
	case ModeMosto1, ModeMosto1G, ModeMosto1Off:
		return s.startMosto(ctx, mode, 1)
	case ModeMosto3:
		return s.startMosto(ctx, mode, 3)
	case ModeHAProxy, ModeHAProxyDefault:
		return s.startHAProxy(ctx, mode, 1)
	case ModeHAProxy3:
		return s.startHAProxy(ctx, mode, 3)
	case ModeNginx, ModeNginxDefault:
		return s.startNginx(ctx, mode)
	}
	return nil, fmt.Errorf("unknown mode %q (want one of %s)", mode, strings.Join(AllModes, ", "))
}

// launch starts one process with its output captured and waits until every
// address in ready accepts connections.
func (s *setup) launch(ctx context.Context, r *relay, ready []string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = r.log
	cmd.Stderr = r.log
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	w := make(chan error, 1)
	go func() { w <- cmd.Wait() }()
	r.procs = append(r.procs, cmd)
	r.waits = append(r.waits, w)
	deadline := time.Now().Add(10 * time.Second)
	for _, addr := range ready {
		for {
			if err := r.exited(); err != nil {
				return err
			}
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: %s not listening after 10s; output:\n%s", r.mode, addr, tail(r.log.String(), 2000))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// mostoConf is the subset of relay.Config (internal/relay, docs/proxy.md)
// the benchmark writes. It is JSON, which is YAML.
type mostoConf struct {
	ID           string            `json:"id"`
	Hop          map[string]string `json:"hop,omitempty"`
	Members      map[string]string `json:"members,omitempty"`
	Keys         map[string]any    `json:"keys,omitempty"`
	Table        string            `json:"table,omitempty"`
	Egress       map[string]string `json:"egress,omitempty"`
	Destinations map[string]any    `json:"destinations"`
	Services     []map[string]any  `json:"services,omitempty"`
	Limits       map[string]int    `json:"limits"`
	Timeouts     map[string]string `json:"timeouts"`
	Metrics      map[string]string `json:"metrics,omitempty"`
	// Pool and Socket turn the relay's default levers (hop pools, Fast
	// Open) off: HAProxy and nginx have neither. Socket also sets
	// reuseport, one listening socket per event loop: the lever tuned
	// nginx (reuseport) and tuned HAProxy (a bind line per thread) get.
	Pool   map[string]int  `json:"pool"`
	Socket map[string]bool `json:"socket"`
	Loops  int             `json:"loops,omitempty"`
	// Offload is relay.OffloadConfig (mosto1off).
	Offload map[string]any `json:"offload,omitempty"`
}

func (s *setup) startMosto(ctx context.Context, mode string, n int) (*relay, error) {
	if s.mosto == "" {
		return nil, errors.New("no mosto binary")
	}
	r := &relay{mode: mode, log: &syncBuffer{}}
	ids := []string{"A", "B", "C"}[:n]
	hops := map[string]string{}
	for _, id := range ids {
		a, err := freePort()
		if err != nil {
			return nil, err
		}
		hops[id] = a
	}
	entry, err := freePort()
	if err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	table := ""
	if n > 1 {
		table = filepath.Join(s.dir, mode+"-table.json")
		tf := map[string]any{
			"locations": ids,
			"chains": []map[string]any{{
				"from": ids[0], "to": ids[n-1], "size": 0, "rounds": 1, "path": ids,
				"cost_ms": 0, "sum_ms": 0, "max_ms": 0,
			}},
		}
		if err := writeJSON(table, tf); err != nil {
			return nil, err
		}
	}
	originHost, _, _ := net.SplitHostPort(s.origin)
	// Start the chain from its end so every next hop is up first.
	for i := n - 1; i >= 0; i-- {
		id := ids[i]
		c := mostoConf{
			ID:           id,
			Destinations: map[string]any{"allow": []string{originHost + "/32"}},
			Limits:       map[string]int{"max_conns": 200000, "max_conns_per_source": 200000, "hop_max_conns_per_source": 200000},
			Timeouts:     map[string]string{"idle": "10m"},
			Pool:         map[string]int{"hop": 0},
			Socket:       map[string]bool{"fastopen": false, "reuseport": true},
		}
		c.Loops = s.threads
		if mode == ModeMosto1G {
			c.Loops = -1
		}
		if mode == ModeMosto1Off {
			c.Offload = map[string]any{"mode": "bytes", "after_bytes": s.offloadAfter, "interfaces": []string{"lo"}, "pin_dir": "off"}
		}
		ready := []string{}
		if n > 1 {
			c.Hop = map[string]string{"listen": hops[id]}
			c.Members = hops
			c.Keys = map[string]any{"current": map[string]any{"id": 1, "secret_hex": hex.EncodeToString(secret)}}
			c.Egress = map[string]string{"default": ids[n-1]}
			ready = append(ready, hops[id])
		}
		if i == 0 {
			c.Table = table
			c.Services = []map[string]any{{"name": "bench", "listen": entry, "origin": s.origin}}
			ready = append(ready, entry)
		}
		path := filepath.Join(s.dir, fmt.Sprintf("%s-%s.yaml", mode, id))
		if err := writeJSON(path, c); err != nil {
			return nil, err
		}
		if err := s.launch(ctx, r, ready, []string{fmt.Sprintf("GOMAXPROCS=%d", s.threads)}, s.mosto, "proxy", "--config", path); err != nil {
			r.stop(time.Second)
			return nil, err
		}
	}
	r.entry = entry
	return r, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func (s *setup) startHAProxy(ctx context.Context, mode string, n int) (*relay, error) {
	if s.haproxy == "" {
		return nil, errors.New("haproxy not installed")
	}
	r := &relay{mode: mode, log: &syncBuffer{}}
	next := s.origin
	// Start the chain from its end so every next hop is up first.
	for i := n - 1; i >= 0; i-- {
		entry, err := freePort()
		if err != nil {
			return nil, err
		}
		conf := HAProxyConf(mode != ModeHAProxyDefault, s.maxconn, s.threads, entry, next)
		path := filepath.Join(s.dir, fmt.Sprintf("%s-%d.cfg", mode, i))
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		if err := s.launch(ctx, r, []string{entry}, nil, s.haproxy, "-db", "-f", path); err != nil {
			r.stop(time.Second)
			return nil, err
		}
		next = entry
	}
	r.entry = next
	return r, nil
}

// HAProxyConf is one HAProxy relaying listen to next. Tuned, it is what
// HAProxy's documentation recommends for a TCP relay moving bulk data and
// short connections: kernel splicing through 1 MiB pipes (tune.pipesize;
// the kernel's default pipe is 64 KiB, 16 pages), splice-auto (splice
// only once a connection's data outgrows the buffer, so 64-byte
// connections are not spliced: the same adaptation mosto makes), threads
// equal to mosto's, and one listening socket per thread (a bind line per
// thread: HAProxy sets SO_REUSEPORT on its listeners, so the kernel hands
// each connection to one thread's socket and wakes that thread alone; 2.7
// calls this "shards by-thread"). The default is the minimal
// configuration of a TCP proxy: buffered copies, default threads (one per
// CPU), one socket polled by every thread.
func HAProxyConf(tuned bool, maxconn, threads int, listen, next string) string {
	global, opts := "", ""
	bind := fmt.Sprintf("    bind %s\n", listen)
	if tuned {
		global = fmt.Sprintf("    nbthread %d\n    tune.pipesize 1048576\n", threads)
		opts = "    option splice-auto\n"
		if threads > 1 {
			bind = ""
			for t := 1; t <= threads; t++ {
				bind += fmt.Sprintf("    bind %s thread %d\n", listen, t)
			}
		}
	}
	return fmt.Sprintf(`global
    maxconn %d
    log stderr format raw local0 err
%sdefaults
    mode tcp
    timeout connect 5s
    timeout client 10m
    timeout server 10m
%sfrontend bench
%s    default_backend next
backend next
    server next %s
`, maxconn, global, opts, bind, next)
}

// NginxConf is nginx stream relaying listen to origin. Tuned: one worker
// per mosto thread, a reuseport listener per worker (the kernel spreads
// new connections instead of waking every worker), a large accept
// backlog, 256 KiB proxy buffers (16 KiB by default: one read and one
// write per 16 KiB of a bulk flow), multi_accept. Default: nginx's own
// defaults (worker_processes auto as Debian ships it); the connection
// limits are raised in both, or the idle-flow test could not run.
func NginxConf(tuned bool, load string, nofile, maxconn, threads int, dir, listen, origin string) string {
	workers, events, opts, server := "auto", "", "", ""
	if tuned {
		workers = fmt.Sprint(threads)
		events = " multi_accept on;"
		opts = " reuseport backlog=65535"
		server = "        proxy_buffer_size 256k;\n"
	}
	return fmt.Sprintf(`%sdaemon off;
worker_processes %s;
worker_rlimit_nofile %d;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections %d;%s }
stream {
    server {
        listen %s%s;
        proxy_pass %s;
        proxy_timeout 10m;
        proxy_half_close on;
%s    }
}
`, load, workers, nofile, dir, dir, maxconn, events, listen, opts, origin, server)
}

func (s *setup) startNginx(ctx context.Context, mode string) (*relay, error) {
	if s.nginx == "" {
		return nil, errors.New("nginx not installed")
	}
	entry, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(s.dir, mode)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	load := ""
	if s.nginxMod != "" {
		load = fmt.Sprintf("load_module %s;\n", s.nginxMod)
	}
	conf := NginxConf(mode == ModeNginx, load, 2*s.maxconn+100, s.maxconn, s.threads, dir, entry, s.origin)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	r := &relay{mode: mode, entry: entry, log: &syncBuffer{}}
	if err := s.launch(ctx, r, []string{entry}, nil, s.nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", path); err != nil {
		r.stop(time.Second)
		return nil, err
	}
	return r, nil
}
