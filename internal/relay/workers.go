package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Worker processes. One relay process holds two sockets per flow, so
// RLIMIT_NOFILE bounds the flows one process can carry. Like nginx and
// HAProxy, a FEP can therefore run several processes that share every hop
// and entry listener with SO_REUSEPORT (the kernel spreads new connections
// over them by a hash of the 4-tuple). `workers: N` makes `mosto proxy` a
// supervisor of N such processes; `socket.reuseport: true` alone lets an
// operator start a new daemon on the same ports before stopping the old one
// (an upgrade without a closed port).

// WorkerEnv is the environment variable that tells a `mosto proxy` process
// it is worker i (0-based) of a supervisor.
const WorkerEnv = "MOSTO_PROXY_WORKER"

// reusePort reports whether listeners get SO_REUSEPORT.
func (c *Config) reusePort() bool { return c.Socket.ReusePort || c.Workers > 1 }

// ForWorker returns the configuration worker i of c.Workers runs: the same
// listeners with SO_REUSEPORT, and a metrics listener of its own on the
// configured port + i (port 0 stays 0), so each worker can be scraped.
func (c *Config) ForWorker(i int) (*Config, error) {
	if i < 0 || i >= max(c.Workers, 1) {
		return nil, fmt.Errorf("worker %d of %d", i, c.Workers)
	}
	w := *c
	w.Socket.ReusePort = true
	if a := c.Metrics.Listen; a != "" && i > 0 {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("metrics.listen: %w", err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("metrics.listen: bad port %q", port)
		}
		if p != 0 {
			if p+i > 65535 {
				return nil, fmt.Errorf("metrics.listen: port %d + worker %d exceeds 65535", p, i)
			}
			w.Metrics.Listen = net.JoinHostPort(host, strconv.Itoa(p+i))
		}
	}
	return &w, nil
}

// Supervisor runs N worker processes until its context ends.
type Supervisor struct {
	// N is the number of workers (>= 1).
	N int
	// Command returns an unstarted command for worker i; the supervisor
	// starts it (a restarted worker gets a fresh command).
	Command func(i int) *exec.Cmd
	// Stop is how long a worker may drain after SIGTERM before it is
	// killed; 0: DefaultDrainTimeout + 5 s.
	Stop time.Duration
	// Restart is the pause before a worker that exited is started again;
	// 0: one second.
	Restart time.Duration
	// Log receives lifecycle events; nil discards them.
	Log *slog.Logger
}

// errQuickExit marks a worker that keeps dying right after its start.
var errQuickExit = errors.New("relay: worker exits right after starting")

// Run starts the workers and restarts any that exits while ctx is live.
// When ctx ends it sends every worker SIGTERM, kills those still running
// after Stop, and returns once all have exited. It returns an error (after
// stopping the others) when a worker cannot be started or exits within a
// second of its start three times in a row, a configuration or bind error.
func (sv *Supervisor) Run(ctx context.Context) error {
	if sv.N < 1 || sv.Command == nil {
		return fmt.Errorf("relay: supervisor of %d workers without a command", sv.N)
	}
	log := sv.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	errs := make(chan error, sv.N)
	var wg sync.WaitGroup
	for i := range sv.N {
		wg.Add(1)
		go sv.keep(wctx, &wg, i, log, errs)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
		stopAll()
	}
	wg.Wait()
	return err
}

// keep runs worker i, restarting it until ctx ends.
func (sv *Supervisor) keep(ctx context.Context, wg *sync.WaitGroup, i int, log *slog.Logger, errs chan<- error) {
	defer wg.Done()
	pause := sv.Restart
	if pause <= 0 {
		pause = time.Second
	}
	quick := 0
	for {
		started := time.Now()
		err := sv.runOne(ctx, i, log)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) < time.Second {
			quick++
		} else {
			quick = 0
		}
		if quick >= 3 {
			errs <- fmt.Errorf("worker %d: %w: %v", i, errQuickExit, err)
			return
		}
		log.Error("worker exited; restarting", "worker", i, "err", err, "after", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// runOne starts worker i and waits for it; when ctx ends first it sends
// SIGTERM, then SIGKILL after the stop timeout.
func (sv *Supervisor) runOne(ctx context.Context, i int, log *slog.Logger) error {
	cmd := sv.Command(i)
	if cmd.SysProcAttr == nil {
		// A worker must not outlive a supervisor that dies without stopping it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker %d: %w", i, err)
	}
	log.Info("worker started", "worker", i, "pid", cmd.Process.Pid)
	done := make(chan error, 1)
	go waitCmd(cmd, done)
	select {
	case err := <-done:
		return exitErr(err)
	case <-ctx.Done():
	}
	cmd.Process.Signal(syscall.SIGTERM)
	stop := sv.Stop
	if stop <= 0 {
		stop = DefaultDrainTimeout + 5*time.Second
	}
	t := time.NewTimer(stop)
	defer t.Stop()
	select {
	case err := <-done:
		log.Info("worker stopped", "worker", i, "err", exitErr(err))
		return exitErr(err)
	case <-t.C:
		log.Warn("worker did not stop in time; killing it", "worker", i, "timeout", stop)
		cmd.Process.Kill()
		return exitErr(<-done)
	}
}

// waitCmd waits for cmd and reports its result.
func waitCmd(cmd *exec.Cmd, done chan<- error) { done <- cmd.Wait() }

func exitErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("worker exited: %w", err)
}
