package cdnfront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Runner builds the command that runs a program, for example inside a
// network namespace (emu.World.Command with the host bound). nil means
// exec.CommandContext.
type Runner func(ctx context.Context, name string, args ...string) *exec.Cmd

// Front is a running nginx front-end.
type Front struct {
	cfg     Config
	dir     string
	tempDir bool
	cmd     *exec.Cmd
	done    chan struct{} // closed when the nginx master exited
	waitErr error         // valid after done
	log     *slog.Logger
}

// Start writes the configuration and starts nginx in the foreground. It
// returns once nginx has bound its listener (it writes its pid file after
// that), or an error with the tail of nginx's error log.
func Start(ctx context.Context, cfg Config, run Runner, log *slog.Logger) (*Front, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	f := &Front{cfg: cfg, dir: cfg.Dir, done: make(chan struct{}), log: log}
	if f.dir == "" {
		d, err := os.MkdirTemp("", "mosto-cdnfront-")
		if err != nil {
			return nil, fmt.Errorf("cdnfront: %w", err)
		}
		f.dir, f.tempDir = d, true
	}
	abs, err := filepath.Abs(f.dir)
	if err != nil {
		f.cleanup()
		return nil, fmt.Errorf("cdnfront: %w", err)
	}
	f.dir = abs
	conf, err := Render(cfg, f.dir)
	if err != nil {
		f.cleanup()
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(f.dir, "tmp"), 0o755); err != nil {
		f.cleanup()
		return nil, fmt.Errorf("cdnfront: %w", err)
	}
	confPath := filepath.Join(f.dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		f.cleanup()
		return nil, fmt.Errorf("cdnfront: %w", err)
	}
	os.Remove(f.pidPath())
	if run == nil {
		run = exec.CommandContext
	}
	// The master and its workers get their own process group, so that Stop
	// can end them all. ctx is not tied to the process: Stop ends it.
	f.cmd = run(context.Background(), cfg.Nginx, "-p", f.dir, "-c", confPath, "-e", filepath.Join(f.dir, "error.log"), "-g", "daemon off; master_process on;")
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	f.cmd.Stdout, f.cmd.Stderr = nil, nil
	if err := f.cmd.Start(); err != nil {
		f.cleanup()
		return nil, fmt.Errorf("cdnfront: start %s: %w", cfg.Nginx, err)
	}
	go f.wait()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		if _, err := os.Stat(f.pidPath()); err == nil {
			log.Info("cdnfront: nginx up", "listen", cfg.Listen, "origin", cfg.Origin, "dir", f.dir)
			return f, nil
		}
		select {
		case <-f.done:
			err := fmt.Errorf("cdnfront: nginx exited at start (%v): %s", f.waitErr, f.errorLog())
			f.cleanup()
			return nil, err
		case <-ctx.Done():
			f.Stop()
			return nil, fmt.Errorf("cdnfront: waiting for nginx: %w", ctx.Err())
		case <-deadline.C:
			err := fmt.Errorf("cdnfront: nginx did not come up within 10s: %s", f.errorLog())
			f.Stop()
			return nil, err
		case <-tick.C:
		}
	}
}

func (f *Front) wait() {
	f.waitErr = f.cmd.Wait()
	close(f.done)
}

func (f *Front) pidPath() string { return filepath.Join(f.dir, "nginx.pid") }

// Addr returns the address the front-end listens on.
func (f *Front) Addr() string { return f.cfg.Listen }

// Dir returns the directory holding the configuration and logs.
func (f *Front) Dir() string { return f.dir }

// errorLog returns the last lines of nginx's error log.
func (f *Front) errorLog() string {
	b, err := os.ReadFile(filepath.Join(f.dir, "error.log"))
	if err != nil || len(b) == 0 {
		return "(empty error log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// Stop ends nginx: SIGTERM (fast shutdown) to its process group, SIGKILL
// after 5 s. It removes a temporary directory. It is safe to call twice.
func (f *Front) Stop() error {
	if f.cmd == nil || f.cmd.Process == nil {
		f.cleanup()
		return nil
	}
	pgid := f.cmd.Process.Pid
	select {
	case <-f.done:
	default:
		syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(5 * time.Second)
		select {
		case <-f.done:
			t.Stop()
		case <-t.C:
			f.log.Warn("cdnfront: nginx ignored SIGTERM; killing", "pid", pgid)
			syscall.Kill(-pgid, syscall.SIGKILL)
			<-f.done
		}
	}
	// Workers left behind by a killed master share the group.
	syscall.Kill(-pgid, syscall.SIGKILL)
	f.cleanup()
	var ee *exec.ExitError
	if f.waitErr != nil && !errors.As(f.waitErr, &ee) {
		return fmt.Errorf("cdnfront: wait for nginx: %w", f.waitErr)
	}
	return nil
}

func (f *Front) cleanup() {
	if f.tempDir && f.dir != "" {
		os.RemoveAll(f.dir)
		f.dir = ""
		f.tempDir = false
	}
}
