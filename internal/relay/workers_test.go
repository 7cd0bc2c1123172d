package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// Child processes of TestWorkers10kFlows: the test binary re-executes
// itself as a relay worker (envWorkerConfig) or as the origin (envOriginFlows).
const (
	envWorkerConfig = "MOSTO_TEST_WORKER_CONFIG"
	envOriginFlows  = "MOSTO_TEST_ORIGIN_FLOWS"
)

// TestWorkerProcess is a relay worker when run by TestWorkers10kFlows.
func TestWorkerProcess(t *testing.T) {
	path := os.Getenv(envWorkerConfig)
	if path == "" {
		t.Skip("child process of TestWorkers10kFlows")
	}
	os.Exit(runWorker(path))
}

// runWorker runs worker $MOSTO_PROXY_WORKER of the config at path, as
// `mosto proxy` does, and prints "READY id pid metrics-address".
func runWorker(path string) int {
	cfg, err := LoadConfig(path)
	if err == nil {
		var i int
		if i, err = strconv.Atoi(os.Getenv(WorkerEnv)); err == nil {
			cfg, err = cfg.ForWorker(i)
		}
	}
	var s *Server
	if err == nil {
		s, err = New(cfg, nil)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	fmt.Printf("READY %s %d %s\n", cfg.ID, os.Getpid(), s.MetricsAddr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := s.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// TestOriginProcess is the origin of TestWorkers10kFlows.
func TestOriginProcess(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(envOriginFlows))
	if n <= 0 {
		t.Skip("child process of TestWorkers10kFlows")
	}
	os.Exit(runOrigin(n))
}

// runOrigin serves flows: each sends seed (8 bytes), down length (8 bytes)
// and padding, then half-closes. The origin answers nothing until n flows
// are open at once; it then prints "OPEN n" and waits for "go" on stdin
// before answering each with SHA-256 of what it received followed by the
// down payload of the seed. It exits when stdin closes.
func runOrigin(n int) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "origin:", err)
		return 1
	}
	fmt.Printf("ORIGIN %s\n", ln.Addr())
	release := make(chan struct{})
	var open atomic.Int64
	var once sync.Once
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if in.Text() == "go" {
				once.Do(func() { close(release) })
			}
		}
		ln.Close()
		once.Do(func() { close(release) })
	}()
	var wg sync.WaitGroup
	for {
		c, err := ln.Accept()
		if err != nil {
			break
		}
		wg.Add(1)
		go originFlow(&wg, c.(*net.TCPConn), n, &open, release)
	}
	wg.Wait()
	return 0
}

func originFlow(wg *sync.WaitGroup, c *net.TCPConn, n int, open *atomic.Int64, release <-chan struct{}) {
	defer wg.Done()
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Minute))
	h := sha256.New()
	var head [16]byte
	got := 0
	buf := make([]byte, 4096)
	for {
		k, err := c.Read(buf)
		if got < len(head) {
			copy(head[got:], buf[:k])
		}
		got += k
		h.Write(buf[:k])
		if err != nil {
			if !errors.Is(err, io.EOF) || got < len(head) {
				c.SetLinger(0)
				return
			}
			break
		}
	}
	if open.Add(1) == int64(n) {
		fmt.Printf("OPEN %d\n", n)
	}
	<-release
	seed, down := binary.BigEndian.Uint64(head[:8]), binary.BigEndian.Uint64(head[8:])
	c.Write(append(h.Sum(nil), flowPayload(^seed, int(down))...))
}

// flowPayload is the deterministic payload of seed.
func flowPayload(seed uint64, n int) []byte {
	var key [32]byte
	binary.BigEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	mrand.NewChaCha8(key).Read(b)
	return b
}

// lineSink collects a child's stdout lines on a channel.
type lineSink struct {
	mu   sync.Mutex
	part []byte
	ch   chan string
}

func (l *lineSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case l.ch <- string(l.part[:i]):
		default:
		}
		l.part = l.part[i+1:]
	}
}

// TestWorkers10kFlows runs 10,000 flows open at the same time through a
// chain of three FEPs (InP a, TrP b, EgP c), each run as two worker
// processes sharing its listeners with SO_REUSEPORT, towards an origin in
// its own process; the test process is the client. The origin answers only
// once all 10,000 flows are open at once, every byte is checked by SHA-256
// both ways, every worker must have carried flows, and no process, fd or
// goroutine is left afterwards.
func TestWorkers10kFlows(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 flows through six worker processes: skipped with -short")
	}
	const flows, workers = 10000, 2
	if lim := testenv.RaiseFDLimit(t, flows+500); lim < flows+500 {
		testenv.Unmet(t, "RLIMIT_NOFILE %d: the client process needs %d fds", lim, flows+500)
	}
	testenv.CheckLeaks(t)
	startTime := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()

	// The origin.
	childErr := &raceWatch{w: os.Stderr} // every child's stderr
	originOut := &lineSink{ch: make(chan string, 16)}
	oc := exec.Command(os.Args[0], "-test.run=^TestOriginProcess$")
	oc.Env = append(os.Environ(), envOriginFlows+"="+strconv.Itoa(flows))
	oc.Stdout, oc.Stderr = originOut, childErr
	oc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	originIn, err := oc.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := oc.Start(); err != nil {
		t.Fatal(err)
	}
	originDone := make(chan error, 1)
	go waitCmd(oc, originDone)
	t.Cleanup(func() {
		originIn.Close()
		select {
		case <-originDone:
		case <-time.After(10 * time.Second):
			oc.Process.Kill()
			<-originDone
			t.Error("origin did not exit after its stdin closed")
		}
	})
	originAddr := strings.TrimPrefix(waitLine(t, ctx, originOut.ch, "ORIGIN "), "ORIGIN ")

	// Three FEPs of two workers each.
	ports := freePorts(t, 4)
	ids := []string{"a", "b", "c"}
	members := fmt.Sprintf("{a: '127.0.0.1:%d', b: '127.0.0.1:%d', c: '127.0.0.1:%d'}", ports[0], ports[1], ports[2])
	table := `{"locations": ["a", "b", "c"], "chains": [{"from": "a", "to": "c", "size": 1000000000, "rounds": 62, "path": ["a", "b", "c"]}]}`
	if err := os.WriteFile(filepath.Join(dir, "table.json"), []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	workerOut := &lineSink{ch: make(chan string, 16)}
	var svWG sync.WaitGroup
	svCtx, stopWorkers := context.WithCancel(context.Background())
	svErrs := make(chan error, len(ids))
	for k, id := range ids {
		y := fmt.Sprintf(`id: %s
workers: %d
hop: {listen: '127.0.0.1:%d'}
members: %s
keys: {current: {id: 1, secret_hex: %s}}
table: table.json
egress: {default: c}
destinations: {allow: ['127.0.0.0/8']}
timeouts: {header: 20s, connect: 20s, idle: 2m, drain: 5s}
limits: {max_conns: 40000, max_conns_per_source: 40000}
metrics: {listen: '127.0.0.1:0'}
`, id, workers, ports[k], members, hex.EncodeToString([]byte("0123456789abcdef0123456789abcdef")))
		if id == "a" {
			y += fmt.Sprintf("services: [{name: s, listen: '127.0.0.1:%d', origin: '%s', size: 1000}]\n", ports[3], originAddr)
		}
		path := filepath.Join(dir, id+".yaml")
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		sv := &Supervisor{N: workers, Stop: 20 * time.Second, Log: testenv.Logger(t), Command: func(i int) *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$")
			cmd.Env = append(os.Environ(), envWorkerConfig+"="+path, fmt.Sprintf("%s=%d", WorkerEnv, i))
			cmd.Stdout, cmd.Stderr = workerOut, childErr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			return cmd
		}}
		svWG.Add(1)
		go runSupervisor(&svWG, svCtx, sv, svErrs)
	}
	var pids []int
	stopped := false
	stopAll := func() {
		if stopped {
			return
		}
		stopped = true
		stopWorkers()
		svWG.Wait()
		close(svErrs)
		for err := range svErrs {
			t.Errorf("supervisor: %v", err)
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("worker %d still exists after its supervisor returned (kill 0: %v)", pid, err)
			}
		}
	}
	t.Cleanup(stopAll)
	metricsAddrs := make([]string, len(ids)*workers) // FEP k's workers at k*workers..
	for range len(ids) * workers {
		f := strings.Fields(waitLine(t, ctx, workerOut.ch, "READY "))
		k := strings.Index("abc", f[1])
		pid, _ := strconv.Atoi(f[2])
		for w := range workers {
			if metricsAddrs[k*workers+w] == "" {
				metricsAddrs[k*workers+w] = f[3]
				break
			}
		}
		pids = append(pids, pid)
	}
	t.Logf("origin and 6 workers ready after %v", time.Since(startTime).Round(time.Millisecond))

	// The client: 10,000 flows, each sends its payload and half-closes,
	// then waits for the origin's answer.
	svc := fmt.Sprintf("127.0.0.1:%d", ports[3])
	var failed atomic.Int64
	var firstErr atomic.Value
	var cwg sync.WaitGroup
	dialing := make(chan struct{}, 256)
	clientStart := time.Now()
	for i := range flows {
		cwg.Add(1)
		go clientFlow(&cwg, svc, uint64(i)*0x9E3779B97F4A7C15+1, dialing, &failed, &firstErr)
	}
	clientsDone := make(chan struct{})
	go waitGroupDone(&cwg, clientsDone)
	select {
	case l := <-originOut.ch:
		if l != fmt.Sprintf("OPEN %d", flows) {
			t.Fatalf("origin said %q", l)
		}
	case <-clientsDone:
		t.Fatalf("clients ended before %d flows were open at once: %d failed, first: %v", flows, failed.Load(), firstErr.Load())
	case <-ctx.Done():
		t.Fatalf("timed out with fewer than %d flows open at once; %d failed, first: %v", flows, failed.Load(), firstErr.Load())
	}
	openAt := time.Since(clientStart)
	// Every flow is open now, on every hop: record what each worker holds.
	peak := make([]map[string]float64, len(metricsAddrs))
	for i, a := range metricsAddrs {
		peak[i] = scrape(t, a, "process_open_fds", "go_goroutines", "mosto_relay_active_flows")
		t.Logf("worker %d of %s at the peak: active flows %v, open fds %v, goroutines %v",
			i%workers, ids[i/workers], peak[i]["mosto_relay_active_flows"], peak[i]["process_open_fds"], peak[i]["go_goroutines"])
	}
	t.Logf("%d flows open at once %v after the first dial; client fds %d", flows, openAt.Round(time.Millisecond), testenv.OpenFDs(t))
	if _, err := io.WriteString(originIn, "go\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-clientsDone:
	case <-ctx.Done():
		t.Fatal("timed out waiting for the answers")
	}
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d flows failed; first: %v", n, flows, firstErr.Load())
	}
	t.Logf("all %d flows verified %v after the first dial", flows, time.Since(clientStart).Round(time.Millisecond))

	// Every flow ended ok on each FEP, and both workers of each carried some.
	for k, id := range ids {
		role := []role{roleInP, roleTrP, roleEgP}[k]
		metric := fmt.Sprintf(`mosto_relay_flows_total{outcome="ok",role="%s"}`, role)
		var sum float64
		var per []float64
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%s flow accounting (%v per worker)", id, per), func() bool {
			sum, per = 0, per[:0]
			for w := range workers {
				v := scrape(t, metricsAddrs[k*workers+w], metric)[metric]
				sum += v
				per = append(per, v)
			}
			return sum == flows
		})
		for w, v := range per {
			if v == 0 {
				t.Errorf("%s worker %d carried no flow: SO_REUSEPORT did not spread them", id, w)
			}
		}
		t.Logf("%s: %v flows (%s) per worker", id, per, role)
	}
	// Every worker let go of its flows' sockets before being stopped.
	for i, a := range metricsAddrs {
		var m map[string]float64
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("worker %d of %s to close its flows (%v)", i%workers, ids[i/workers], m), func() bool {
			m = scrape(t, a, "process_open_fds", "mosto_relay_active_flows")
			return m["mosto_relay_active_flows"] == 0 && m["process_open_fds"] < 100
		})
	}
	stopAll()
	if childErr.raced.Load() {
		t.Error("a child process reported a data race (see its stderr above)")
	}
	t.Logf("total %v", time.Since(startTime).Round(time.Millisecond))
}

// raceWatch passes a child's stderr on and notes race detector reports.
type raceWatch struct {
	w     io.Writer
	raced atomic.Bool
}

func (r *raceWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("DATA RACE")) {
		r.raced.Store(true)
	}
	return r.w.Write(p)
}

func runSupervisor(wg *sync.WaitGroup, ctx context.Context, sv *Supervisor, errs chan<- error) {
	defer wg.Done()
	if err := sv.Run(ctx); err != nil {
		errs <- err
	}
}

func clientFlow(wg *sync.WaitGroup, addr string, seed uint64, dialing chan struct{}, failed *atomic.Int64, firstErr *atomic.Value) {
	defer wg.Done()
	err := clientFlowErr(addr, seed, dialing)
	if err != nil {
		failed.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
}

func clientFlowErr(addr string, seed uint64, dialing chan struct{}) error {
	r := mrand.New(mrand.NewPCG(seed, 7))
	up := flowPayload(seed, 16+r.IntN(4089))
	down := 512 + r.IntN(4096)
	binary.BigEndian.PutUint64(up[:8], seed)
	binary.BigEndian.PutUint64(up[8:16], uint64(down))
	dialing <- struct{}{}
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		<-dialing
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(150 * time.Second))
	_, err = c.Write(up)
	if err == nil {
		err = c.(*net.TCPConn).CloseWrite()
	}
	<-dialing
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	sum := sha256.Sum256(up)
	want := flowPayload(^seed, down)
	switch {
	case len(got) != 32+down:
		return fmt.Errorf("answer of %d bytes; want %d", len(got), 32+down)
	case !bytes.Equal(got[:32], sum[:]):
		return errors.New("the origin received other bytes than sent (SHA-256 differs)")
	case sha256.Sum256(got[32:]) != sha256.Sum256(want):
		return errors.New("the client received other bytes than the origin sent (SHA-256 differs)")
	}
	return nil
}

// waitLine returns the next line of ch that starts with prefix.
func waitLine(t *testing.T, ctx context.Context, ch <-chan string, prefix string) string {
	t.Helper()
	for {
		select {
		case l := <-ch:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-ctx.Done():
			t.Fatalf("no %q line from the child processes", prefix)
		}
	}
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// scrape reads the named samples (name or name{labels} as printed) from a
// worker's /metrics.
func scrape(t *testing.T, addr string, names ...string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		for _, n := range names {
			if f[0] == n || (strings.HasPrefix(f[0], n+"{") && !strings.Contains(n, "{")) {
				v, _ := strconv.ParseFloat(f[1], 64)
				out[n] += v
			}
		}
	}
	return out
}

// TestSupervisor checks the supervisor's lifecycle with small commands:
// workers that keep failing at start end Run with an error, SIGTERM stops
// workers at once, and one that ignores SIGTERM is killed after Stop.
func TestSupervisor(t *testing.T) {
	for _, c := range []string{"sh", "sleep", "false"} {
		testenv.RequireCommand(t, c)
	}
	testenv.CheckLeaks(t)
	var starts atomic.Int64
	for _, tc := range []struct {
		name    string
		argv    []string
		stop    time.Duration
		cancel  bool          // cancel the context after the workers started
		wantErr error         // nil: Run returns nil
		within  time.Duration // Run returns within this time
	}{
		{"failing workers", []string{"false"}, time.Second, false, errQuickExit, 10 * time.Second},
		// The cancelled cases' workers create their ready file once they
		// are set up (the trap installed), and the test cancels only when
		// both did: a SIGTERM before the trap would end the worker at once.
		{"stopped by SIGTERM", []string{"sh", "-c", `: > "$READY"; exec sleep 60`}, 30 * time.Second, true, nil, 5 * time.Second},
		{"killed after the stop timeout", []string{"sh", "-c", `trap '' TERM; : > "$READY"; while :; do sleep 0.1; done`}, 300 * time.Millisecond, true, nil, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ready := func(i int) string { return filepath.Join(dir, fmt.Sprintf("ready-%d", i)) }
			sv := &Supervisor{N: 2, Stop: tc.stop, Restart: 10 * time.Millisecond, Command: func(i int) *exec.Cmd {
				starts.Add(1)
				cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
				cmd.Env = append(os.Environ(), "READY="+ready(i))
				return cmd
			}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- sv.Run(ctx) }()
			if tc.cancel {
				testenv.WaitFor(t, 30*time.Second, "both workers set up", func() bool {
					for i := range sv.N {
						if _, err := os.Stat(ready(i)); err != nil {
							return false
						}
					}
					return true
				})
				cancel()
			}
			begin := time.Now()
			select {
			case err := <-done:
				if !errors.Is(err, tc.wantErr) && !(tc.wantErr == nil && err == nil) {
					t.Errorf("Run = %v; want %v", err, tc.wantErr)
				}
				if tc.wantErr == nil && time.Since(begin) < tc.stop && tc.stop < time.Second {
					t.Errorf("Run returned %v after cancel; a worker ignoring SIGTERM must be killed after %v", time.Since(begin), tc.stop)
				}
			case <-time.After(tc.within):
				t.Fatalf("Run did not return within %v", tc.within)
			}
		})
	}
	if starts.Load() < 6 {
		t.Errorf("%d worker starts; want at least 3 per failing worker", starts.Load())
	}
}
