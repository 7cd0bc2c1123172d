package activation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Passed is a socket an Activator holds and passes.
type Passed struct {
	Name string   // LISTEN_FDNAMES entry ("" becomes "unknown")
	File *os.File // a listening stream socket or a bound datagram socket
}

// ListenTCP binds a listening TCP socket for an Activator, like a
// ListenStream= line (addr "127.0.0.1:0" picks a port).
func ListenTCP(name, addr string) (Passed, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return Passed{}, nil, err
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return Passed{}, nil, err
	}
	return Passed{Name: name, File: f}, ln.Addr(), nil
}

// ListenUDP binds a UDP socket for an Activator, like ListenDatagram=.
func ListenUDP(name, addr string) (Passed, net.Addr, error) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return Passed{}, nil, err
	}
	defer pc.Close()
	f, err := pc.(*net.UDPConn).File()
	if err != nil {
		return Passed{}, nil, err
	}
	return Passed{Name: name, File: f}, pc.LocalAddr(), nil
}

// Activator is a systemd-compatible socket activator: it waits until one
// of its sockets is readable (a connection or a datagram is queued), runs
// Command with the sockets at fd 3.. and LISTEN_PID, LISTEN_FDS and
// LISTEN_FDNAMES set, waits for the command to exit, and waits for the
// next connection again (a service unit with its socket unit, Accept=no).
type Activator struct {
	Sockets []Passed
	// Command returns the command to start; it is run through /bin/sh,
	// which sets LISTEN_PID to its own pid and execs the command, so the
	// variable names the command's process as systemd does.
	Command func() *exec.Cmd
	// OnStart, if set, is called with the time a start was decided (a
	// socket was readable) and the started process.
	OnStart func(at time.Time, p *os.Process)
	// OnExit, if set, is called when the command exited.
	OnExit func(err error)
	// StartLimit is how many starts in a row may fail (exit with an
	// error) before Run gives up, like systemd's StartLimitBurst (a
	// command that cannot take its sockets would otherwise be restarted
	// for ever by the connection still queued); 0 means 5.
	StartLimit int
	Log        *slog.Logger
}

// ErrStartLimit is returned by Run when StartLimit starts in a row failed.
var ErrStartLimit = errors.New("activation: start limit hit: the command failed every time")

// Run activates until ctx ends; a running command is then sent SIGTERM and
// waited for. It does not close the sockets.
func (a *Activator) Run(ctx context.Context) error {
	log := a.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(a.Sockets) == 0 || a.Command == nil {
		return errors.New("activation: an activator needs sockets and a command")
	}
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("activation: epoll: %w", err)
	}
	defer syscall.Close(ep)
	limit := a.StartLimit
	if limit <= 0 {
		limit = 5
	}
	failed := 0
	names := make([]string, len(a.Sockets))
	files := make([]*os.File, len(a.Sockets))
	for i, s := range a.Sockets {
		names[i], files[i] = s.Name, s.File
		if names[i] == "" {
			names[i] = "unknown"
		}
		if strings.ContainsAny(names[i], ":\x00\n") || len(names[i]) > 255 {
			return fmt.Errorf("activation: socket name %q: at most 255 characters, no ':' (it separates LISTEN_FDNAMES)", s.Name)
		}
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(s.File.Fd())}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, int(s.File.Fd()), &ev); err != nil {
			return fmt.Errorf("activation: epoll add %s: %w", s.Name, err)
		}
	}
	evs := make([]syscall.EpollEvent, len(a.Sockets))
	for {
		n, err := syscall.EpollWait(ep, evs, 50)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("activation: epoll wait: %w", err)
		}
		if n <= 0 {
			continue
		}
		at := time.Now()
		c := a.Command()
		args := append([]string{"-c", `export LISTEN_PID=$$; exec "$0" "$@"`, c.Path}, c.Args[1:]...)
		cmd := exec.Command("/bin/sh", args...)
		cmd.Env = append(append([]string(nil), c.Env...),
			EnvFDs+"="+strconv.Itoa(len(files)), EnvNames+"="+strings.Join(names, ":"))
		if c.Env == nil {
			cmd.Env = append(os.Environ(), cmd.Env...)
		}
		cmd.Dir, cmd.Stdout, cmd.Stderr = c.Dir, c.Stdout, c.Stderr
		cmd.ExtraFiles = files
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("activation: start %s: %w", c.Path, err)
		}
		log.Debug("activated", "pid", cmd.Process.Pid)
		if a.OnStart != nil {
			a.OnStart(at, cmd.Process)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				err = <-done
			}
		}
		if a.OnExit != nil {
			a.OnExit(err)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			failed = 0
		} else if failed++; failed >= limit {
			return fmt.Errorf("%w (%d starts, last: %v)", ErrStartLimit, failed, err)
		}
	}
}
