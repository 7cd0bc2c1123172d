package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/activation"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestActivationFirstConnectionEmu is TestActivationFirstConnection in the
// emulator: a client in Dublin, the FEP's proxy in London, the origin in
// New York (WonderProxy RTTs). The FEP's listener is bound in its
// namespace and held by the activator, which starts `mosto proxy` in that
// namespace (`ip netns exec`, which execs: LISTEN_PID stays right) at the
// first connection; 50 cold starts, each paired with a connection to an
// always-running proxy of the same binary in the same namespace. When
// installed, systemd-socket-activate (started in the namespace ahead of
// the connection, like systemd's socket unit) starts another 50, so the
// figure is free of `ip netns exec` and /bin/sh. A figure: it fails only
// when a flow fails. Under -race at load 30 one round (two cold starts of
// the race-built binary) takes ~6 s, so the rounds stop at
// activationBudget once activationMinRounds are in (the count is logged).
func TestActivationFirstConnectionEmu(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("50 cold starts in the emulator; skipped with -short")
	}
	spec := &emu.Spec{Name: "act", Dataset: "wonderproxy", Hosts: []emu.HostSpec{
		{Name: "client", Location: "Dublin"}, {Name: "fep", Location: "London"}, {Name: "origin", Location: "NewYork"}}}
	w := emutest.Start(t, spec)
	// ctx bounds the dials and listens only: no process is made with it, so
	// its expiry fails a dial with a message instead of killing a proxy
	// mid-round (exec.CommandContext's SIGKILL).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The origin greets every connection.
	oln, err := w.Listen(ctx, "origin", "tcp", net.JoinHostPort(w.Addr("origin").String(), "8000"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer func() { oln.Close(); wg.Wait() }()
	wg.Go(func() {
		for {
			c, err := oln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello from the origin\n"))
			c.Close()
		}
	})
	origin := oln.Addr().String()
	fepIP := w.Addr("fep").String()
	coldAddr, warmAddr, sdAddr := net.JoinHostPort(fepIP, "8080"), net.JoinHostPort(fepIP, "8081"), net.JoinHostPort(fepIP, "8082")
	cfg := func(listen string) string {
		p := filepath.Join(t.TempDir(), "proxy.yaml")
		y := fmt.Sprintf("id: fep\nservices: [{name: web, listen: '%s', origin: '%s'}]\ndestinations: {allow: ['%s']}\ntimeouts: {drain: 1s}\n",
			listen, origin, w.Addr("origin"))
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, env := exe, []string{cliChildEnv + "=1"}
	if b := os.Getenv(activationBinEnv); b != "" {
		bin, env = b, nil
		t.Logf("proxies: %s", b)
	}
	command := func(listen string) *exec.Cmd {
		c := w.Command(context.Background(), "fep", bin, "proxy", "--config", cfg(listen))
		c.Env = append(os.Environ(), env...)
		return c
	}
	// The socket the activator holds, bound in the FEP's namespace.
	ln, err := w.Listen(ctx, "fep", "tcp", coldAddr)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	coldCfg := command(coldAddr)
	var mu sync.Mutex
	var proc *os.Process
	exits := make(chan error, 64)
	stderr := &syncBuffer{}
	a := &activation.Activator{
		Sockets: []activation.Passed{{Name: "service-web", File: f}},
		Command: func() *exec.Cmd {
			c := exec.Command(coldCfg.Path, coldCfg.Args[1:]...)
			c.Env, c.Stderr = coldCfg.Env, stderr
			return c
		},
		OnStart: func(_ time.Time, p *os.Process) { mu.Lock(); proc = p; mu.Unlock() },
		OnExit:  func(err error) { exits <- err },
	}
	actx, acancel := context.WithCancel(ctx)
	adone := make(chan error, 1)
	go func() { adone <- a.Run(actx) }()
	defer func() { acancel(); <-adone }()

	// The socket systemd-socket-activate is handed.
	sdln, err := w.Listen(ctx, "fep", "tcp", sdAddr)
	if err != nil {
		t.Fatal(err)
	}
	sdf, err := sdln.(*net.TCPListener).File()
	sdln.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer sdf.Close()
	ssa := systemdActivate(t)
	sdArgv, sdEnv := activationArgv(t, cfg(sdAddr))
	// Not ctx: startSD's cleanup and the world's stop kill what is left.
	inFEP := func(name string, args ...string) *exec.Cmd {
		return w.Command(context.Background(), "fep", name, args...)
	}

	warm := command(warmAddr)
	if err := warm.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { warm.Process.Signal(syscall.SIGTERM); warm.Wait() }()
	first := func(addr string) (time.Duration, error) {
		return firstLineVia(func() (net.Conn, error) { return w.Dial(ctx, "client", "tcp", addr) })
	}
	testenv.WaitFor(t, 60*time.Second, "the always-running proxy serving", func() bool {
		_, err := first(warmAddr)
		return err == nil
	})
	var fig activationFigure
	cpu := map[string][]float64{} // ms of CPU from connect to the first byte, systemd-socket-activate's process
	for r := newActivationRounds(t); r.next(); {
		for _, m := range sdModes(t, sdArgv, sdEnv, r.done) {
			if ssa == "" {
				break
			}
			sd := startSD(t, ssa, []activation.Passed{{Name: "service-web", File: sdf}}, m.env, m.argv, inFEP)
			pid := sd.cmd.Process.Pid
			c0, cerr := procCPU(pid)
			d, err := first(sdAddr)
			if err != nil {
				t.Fatalf("cold start by %s: %v (%s)", m.name, err, sd.stderr.String())
			}
			if c1, err := procCPU(pid); err == nil && cerr == nil {
				cpu[m.name] = append(cpu[m.name], float64(c1-c0)/1e6)
			}
			fig.add(m.name, d)
			sd.stop(t)
		}
		d, err := first(coldAddr)
		if err != nil {
			t.Fatalf("cold start: %v (%s)", err, stderr.String())
		}
		fig.add("activation.Activator + ip netns exec", d)
		mu.Lock()
		p := proc
		mu.Unlock()
		p.Signal(syscall.SIGTERM)
		select {
		case err := <-exits:
			if err != nil {
				t.Fatalf("activated proxy exited with %v: %s", err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("activated proxy did not exit after SIGTERM")
		}
		if d, err = first(warmAddr); err != nil {
			t.Fatalf("always running: %v", err)
		}
		fig.warm = append(fig.warm, float64(d)/1e6)
	}
	fig.log(t, fmt.Sprintf("emulator (client Dublin, FEP London, origin New York; RTT client-FEP %.1f ms, FEP-origin %.1f ms)",
		float64(w.RTT("client", "fep"))/1e6, float64(w.RTT("fep", "origin"))/1e6))
	logCPU(t, cpu)
}
