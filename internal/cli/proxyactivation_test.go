package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/activation"
	"github.com/mosto-net/mosto/internal/stats"
	"github.com/mosto-net/mosto/internal/testenv"
)

// cliChildEnv makes the test binary act as the mosto binary (a `mosto
// proxy` process for the socket activation tests).
const cliChildEnv = "MOSTO_CLI_TEST_CHILD"

// activationBinEnv names a mosto binary the activation figure runs instead
// of this test binary (a release build starts faster than a test binary).
const activationBinEnv = "MOSTO_ACTIVATION_BIN"

// activationBinBEnv names a second mosto binary (with activationBinEnv
// set): every round then also starts it through systemd-socket-activate,
// the two in alternating order, so that two builds are compared paired in
// one run (before and after a change, docs/ops.md). The first binary is
// also the always-running proxy and activation.Activator's, so its pages
// are warmer in the CPU caches: on this VM that favours it by ~0.2 ms, so
// a comparison takes two runs with the binaries swapped and half the
// difference of their paired medians (the bias cancels).
const activationBinBEnv = "MOSTO_ACTIVATION_BIN_B"

// sdMode is one way the activation figures start a proxy through
// systemd-socket-activate: a binary's command line.
type sdMode struct {
	name      string
	argv, env []string
}

// sdModes returns the systemd-socket-activate modes of a round: the
// proxy's argv and env, and binary B's when activationBinBEnv is set,
// with the order alternating from round to round.
func sdModes(t *testing.T, argv, env []string, round int) []sdMode {
	t.Helper()
	modes := []sdMode{{"systemd-socket-activate", argv, env}}
	if b := os.Getenv(activationBinBEnv); b != "" && os.Getenv(activationBinEnv) != "" {
		modes = append(modes, sdMode{"systemd-socket-activate, binary B", append([]string{b}, argv[1:]...), env})
		if round%2 == 0 {
			modes[0], modes[1] = modes[1], modes[0]
		}
	}
	return modes
}

func TestMain(m *testing.M) {
	if os.Getenv(cliChildEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		code := Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// greeter is an origin that writes a line to every connection.
func greeter(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello from the origin\n"))
			c.Close()
		}
	})
	return ln.Addr().String()
}

// firstLine connects to addr and returns the time until the first line
// arrived through the proxy.
func firstLine(addr string) (time.Duration, error) {
	return firstLineVia(func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 20*time.Second) })
}

// firstLineVia is firstLine over a connection dial makes (in a namespace).
func firstLineVia(dial func() (net.Conn, error)) (time.Duration, error) {
	start := time.Now()
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "hello from the origin\n" {
		return 0, fmt.Errorf("got %q", line)
	}
	return time.Since(start), nil
}

func proxyConfig(t *testing.T, listen, origin string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "proxy.yaml")
	cfg := fmt.Sprintf("id: a\nservices: [{name: web, listen: '%s', origin: '%s'}]\ndestinations: {allow: ['127.0.0.1']}\ntimeouts: {drain: 1s}\n", listen, origin)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// activated runs an activator for one named TCP socket starting `mosto
// proxy --config cfg`; it returns the socket's address and a channel of
// (process, exit error) pairs.
type activatedProxy struct {
	addr   string
	mu     sync.Mutex
	procs  []*os.Process
	exits  chan error
	stderr *syncBuffer
}

func startActivated(t *testing.T, name, listen, cfgPath string) *activatedProxy {
	t.Helper()
	sock, addr, err := activation.ListenTCP(name, listen)
	if err != nil {
		t.Fatal(err)
	}
	return startActivatedOn(t, sock, addr, cfgPath)
}

// startActivatedOn is startActivated on a socket the test made (its
// address is already in the config: the port is never released and
// rebound, which another process could take meanwhile); it closes sock
// when t ends.
func startActivatedOn(t *testing.T, sock activation.Passed, addr net.Addr, cfgPath string) *activatedProxy {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ap := &activatedProxy{addr: addr.String(), exits: make(chan error, 100), stderr: &syncBuffer{}}
	a := &activation.Activator{
		Sockets: []activation.Passed{sock},
		Command: func() *exec.Cmd {
			c := exec.Command(exe, "proxy", "--config", cfgPath)
			c.Env = append(os.Environ(), cliChildEnv+"=1")
			if bin := os.Getenv(activationBinEnv); bin != "" {
				c = exec.Command(bin, "proxy", "--config", cfgPath)
			}
			c.Stderr = ap.stderr
			return c
		},
		OnStart: func(_ time.Time, p *os.Process) { ap.mu.Lock(); ap.procs = append(ap.procs, p); ap.mu.Unlock() },
		OnExit:  func(err error) { ap.exits <- err },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		// A proxy that refuses its sockets makes the activator give up.
		if err := <-done; err != nil && !errors.Is(err, activation.ErrStartLimit) {
			t.Error(err)
		}
		sock.File.Close()
	})
	return ap
}

// stopLast sends SIGTERM to the last started proxy and waits for its exit.
func (ap *activatedProxy) stopLast(t *testing.T) {
	t.Helper()
	ap.mu.Lock()
	p := ap.procs[len(ap.procs)-1]
	ap.mu.Unlock()
	p.Signal(syscall.SIGTERM)
	select {
	case err := <-ap.exits:
		if err != nil {
			t.Fatalf("activated proxy exited with %v: %s", err, ap.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("activated proxy did not exit 30 s after SIGTERM")
	}
}

// TestProxySocketActivated: `mosto proxy` takes its service listener from
// an activator (LISTEN_FDS, named service-web) and relays the very
// connection that started it; a passed socket the configuration has no
// listener for is refused with a clear error.
func TestProxySocketActivated(t *testing.T) {
	origin := greeter(t)
	// A socket named service-web on another address than the
	// configuration's: refused, naming both.
	bad := startActivated(t, "service-web", "127.0.0.1:0", proxyConfig(t, testenv.FreeAddr(t), origin))
	if c, err := net.Dial("tcp", bad.addr); err == nil {
		defer c.Close()
	}
	select {
	case err := <-bad.exits:
		if err == nil || !strings.Contains(bad.stderr.String(), "listens on") {
			t.Errorf("mismatched socket: exit %v, stderr %q; want an error naming both addresses", err, bad.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("mismatched proxy did not exit")
	}

	// The good case: a socket on the configured address.
	sock, addr, err := activation.ListenTCP("service-web", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addrS := addr.String()
	good := startActivatedOn(t, sock, addr, proxyConfig(t, addrS, origin))
	if d, err := firstLine(good.addr); err != nil {
		t.Fatalf("first connection through the activated proxy: %v (%s)", err, good.stderr.String())
	} else {
		t.Logf("first connection through a socket-activated proxy: %v", d)
	}
	// Logged once the listeners accept, beside the first flow.
	testenv.WaitFor(t, 30*time.Second, "the proxy logging its socket activation", func() bool {
		return strings.Contains(good.stderr.String(), `msg="socket activation" fep=a listeners=1`)
	})
	good.stopLast(t)

	// A socket named for a listener the configuration lacks.
	hop := startActivated(t, "hop", "127.0.0.1:0", proxyConfig(t, "127.0.0.1:0", origin))
	c, err := net.Dial("tcp", hop.addr)
	if err == nil {
		defer c.Close()
	}
	select {
	case err := <-hop.exits:
		if err == nil || !strings.Contains(hop.stderr.String(), "not used") {
			t.Errorf("unused socket: exit %v, stderr %q; want an error saying it is not used", err, hop.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("proxy with an unused socket did not exit")
	}
}

// activationArgv returns the command line and extra environment of the
// proxy an activator starts: MOSTO_ACTIVATION_BIN's binary, or this test
// binary acting as mosto.
func activationArgv(t *testing.T, cfgPath string) (argv, env []string) {
	t.Helper()
	if bin := os.Getenv(activationBinEnv); bin != "" {
		return []string{bin, "proxy", "--config", cfgPath}, nil
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, "proxy", "--config", cfgPath}, []string{cliChildEnv + "=1"}
}

// activationFigure collects first-byte times (ms) of the activation
// figures and logs their medians and p95 against the always-running ones.
type activationFigure struct {
	warm  []float64
	modes []string
	cold  map[string][]float64
}

func (f *activationFigure) add(mode string, d time.Duration) {
	if f.cold == nil {
		f.cold = map[string][]float64{}
	}
	if _, ok := f.cold[mode]; !ok {
		f.modes = append(f.modes, mode)
	}
	f.cold[mode] = append(f.cold[mode], float64(d)/1e6)
}

func (f *activationFigure) log(t *testing.T, what string) {
	t.Helper()
	// Binary B against the first binary, round by round (before sorting).
	if b := f.cold["systemd-socket-activate, binary B"]; len(b) > 0 {
		a := f.cold["systemd-socket-activate"]
		var d []float64
		for i := range min(len(a), len(b)) {
			d = append(d, b[i]-a[i])
		}
		slices.Sort(d)
		t.Logf("binary B minus the first binary, paired per round (%s - %s): median %.2f ms, p95 %.2f ms over %d rounds (the first binary is favoured: swap them in a second run, see %s)",
			os.Getenv(activationBinBEnv), os.Getenv(activationBinEnv), stats.Median(d), stats.Percentile(d, 95), len(d), activationBinBEnv)
	}
	// Paired differences: each round measured a cold start of every mode
	// and the always-running proxy one after the other.
	paired := map[string][]float64{}
	for _, m := range f.modes {
		for i, c := range f.cold[m] {
			if i < len(f.warm) {
				paired[m] = append(paired[m], c-f.warm[i])
			}
		}
		slices.Sort(paired[m])
	}
	slices.Sort(f.warm)
	wm, wp := stats.Median(f.warm), stats.Percentile(f.warm, 95)
	t.Logf("%s: first byte through the proxy, %d connections each; always running: median %.2f ms, p95 %.2f ms", what, len(f.warm), wm, wp)
	for _, m := range f.modes {
		c := f.cold[m]
		slices.Sort(c)
		cm, cp := stats.Median(c), stats.Percentile(c, 95)
		t.Logf("  cold start by %s: median %.2f ms, p95 %.2f ms; added by activation: median %.2f ms (paired: median %.2f ms, p95 %.2f ms)",
			m, cm, cp, cm-wm, stats.Median(paired[m]), stats.Percentile(paired[m], 95))
	}
}

// TestActivationFirstConnection measures the time to the first byte of a
// connection through a proxy started by that connection (socket
// activation: process start, config, taking the listener, accept, dial,
// relay) against one already running, 50 cold starts, interleaved. Two
// activators start the proxy: systemd's own systemd-socket-activate (when
// installed; it execs the proxy in its own process at the first
// connection, as systemd's forked service process does) and
// activation.Activator (Go's fork and exec of /bin/sh, which execs the
// proxy). A figure: it fails only when a flow fails. Run without -race for
// the figure in docs/ops.md.
func TestActivationFirstConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("50 cold starts; skipped with -short")
	}
	origin := greeter(t)
	sock, addr, err := activation.ListenTCP("service-web", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	coldAddr := addr.String()
	cold := startActivatedOn(t, sock, addr, proxyConfig(t, coldAddr, origin))
	// The socket systemd-socket-activate is handed, held across starts
	// like a socket unit's.
	sdSock, sdAddr, err := activation.ListenTCP("service-web", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sdSock.File.Close()
	ssa := systemdActivate(t)
	sdArgv, sdEnv := activationArgv(t, proxyConfig(t, sdAddr.String(), origin))

	// The always-running proxy: the same binary and configuration, bound
	// by itself.
	warmAddr := testenv.FreeAddr(t)
	argv, env := activationArgv(t, proxyConfig(t, warmAddr, origin))
	t.Logf("proxies: %s", argv[0])
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var werr syncBuffer
	cmd.Stderr = &werr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("always-running proxy's stderr:\n%s", werr.String())
		}
	})
	testenv.WaitFor(t, 30*time.Second, "the always-running proxy serving", func() bool {
		_, err := firstLine(warmAddr)
		return err == nil
	})
	var fig activationFigure
	cpu := map[string][]float64{} // ms of CPU from connect to the first byte, systemd-socket-activate's process
	for r := newActivationRounds(t); r.next(); {
		for _, m := range sdModes(t, sdArgv, sdEnv, r.done) {
			if ssa == "" {
				break
			}
			sd := startSD(t, ssa, []activation.Passed{sdSock}, m.env, m.argv, exec.Command)
			pid := sd.cmd.Process.Pid // sh execs the activator, which execs the proxy
			c0, cerr := procCPU(pid)
			d, err := firstLine(sdAddr.String())
			if err != nil {
				t.Fatalf("cold start by %s: %v (%s)", m.name, err, sd.stderr.String())
			}
			if c1, err := procCPU(pid); err == nil && cerr == nil {
				cpu[m.name] = append(cpu[m.name], float64(c1-c0)/1e6)
			}
			fig.add(m.name, d)
			sd.stop(t)
		}
		d, err := firstLine(cold.addr)
		if err != nil {
			t.Fatalf("cold start: %v (%s)", err, cold.stderr.String())
		}
		fig.add("activation.Activator", d)
		cold.stopLast(t)
		d, err = firstLine(warmAddr)
		if err != nil {
			t.Fatalf("always running: %v", err)
		}
		fig.warm = append(fig.warm, float64(d)/1e6)
	}
	if ssa == "" {
		t.Log("systemd-socket-activate not installed (Debian package systemd): measured with activation.Activator only")
	}
	fig.log(t, "loopback")
	logCPU(t, cpu)
}

// logCPU logs the CPU time of the systemd-socket-activate processes per
// mode.
func logCPU(t *testing.T, cpu map[string][]float64) {
	t.Helper()
	for _, m := range slices.Sorted(maps.Keys(cpu)) {
		c := cpu[m]
		slices.Sort(c)
		t.Logf("  CPU (user+system, every thread) of the %s process from connect to the first byte: median %.2f ms, p95 %.2f ms over %d starts",
			m, stats.Median(c), stats.Percentile(c, 95), len(c))
	}
}

// The activation figures take activationRounds rounds (each a cold start
// per mode and an always-running connection), but stop starting rounds once
// activationBudget has passed and activationMinRounds are done: a round is
// two cold starts of the (race-built) binary, ~6 s at load 30 with the
// whole suite running, and 50 of them must not eat the package's timeout.
const (
	activationRounds    = 50
	activationMinRounds = 10
	activationBudget    = 2 * time.Minute
)

// activationRoundCounter counts the rounds of an activation figure.
type activationRoundCounter struct {
	t     *testing.T
	start time.Time
	done  int
}

func newActivationRounds(t *testing.T) *activationRoundCounter {
	return &activationRoundCounter{t: t, start: time.Now()}
}

// next reports whether another round runs, and logs why not when the
// budget ends the figure early.
func (r *activationRoundCounter) next() bool {
	if r.done == activationRounds {
		return false
	}
	if el := time.Since(r.start); r.done >= activationMinRounds && el > activationBudget {
		r.t.Logf("%d of %d rounds: stopped after %v (budget %v; a loaded machine, the figure is over %d starts per mode)",
			r.done, activationRounds, el.Round(time.Second), activationBudget, r.done)
		return false
	}
	r.done++
	return true
}

// procCPU is the CPU time pid's threads have run so far (the first field of
// /proc/PID/task/TID/schedstat, in ns): unlike wall time, a loaded machine
// barely inflates it.
func procCPU(pid int) (time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, tk := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, tk.Name(), "schedstat"))
		if err != nil {
			continue // the thread ended meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s/%s/schedstat: %q", dir, tk.Name(), b)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s/%s/schedstat: %w", dir, tk.Name(), err)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}
