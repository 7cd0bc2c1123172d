package activation

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// FirstFD is the first file descriptor systemd passes (SD_LISTEN_FDS_START).
const FirstFD = 3

// Environment variables of the protocol.
const (
	EnvPID   = "LISTEN_PID"
	EnvFDs   = "LISTEN_FDS"
	EnvNames = "LISTEN_FDNAMES"
)

// maxFDs bounds LISTEN_FDS: a larger value is a bug of the activator.
const maxFDs = 1024

// Socket is one passed socket: a stream listener (Listener) or a datagram
// socket (Packet), exactly one of which is set.
type Socket struct {
	Name     string // from LISTEN_FDNAMES; "" when not given (systemd says "unknown")
	FD       int
	Listener net.Listener
	Packet   net.PacketConn
}

// Addr returns the socket's local address.
func (s Socket) Addr() net.Addr {
	if s.Listener != nil {
		return s.Listener.Addr()
	}
	return s.Packet.LocalAddr()
}

// Close closes the socket.
func (s Socket) Close() error {
	if s.Listener != nil {
		return s.Listener.Close()
	}
	return s.Packet.Close()
}

// Take returns the sockets passed to this process, or none when
// LISTEN_PID is not this process's pid (the variables were meant for a
// parent) or LISTEN_FDS is unset. It unsets the three variables either
// way. Passed descriptors are marked close-on-exec. A malformed variable
// is an error (the sockets are then left alone).
func Take() ([]Socket, error) {
	pid, fds, names := os.Getenv(EnvPID), os.Getenv(EnvFDs), os.Getenv(EnvNames)
	os.Unsetenv(EnvPID)
	os.Unsetenv(EnvFDs)
	os.Unsetenv(EnvNames)
	return parse(pid, fds, names, os.Getpid(), fromFD)
}

// parse checks the variables and turns each descriptor into a Socket with
// open.
func parse(pid, fds, names string, self int, open func(fd int, name string) (Socket, error)) ([]Socket, error) {
	if fds == "" && pid == "" {
		return nil, nil
	}
	p, err := strconv.Atoi(pid)
	if err != nil || p <= 0 {
		return nil, fmt.Errorf("activation: %s=%q: not a process id", EnvPID, pid)
	}
	if p != self {
		return nil, nil // meant for another process
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 0 || n > maxFDs {
		return nil, fmt.Errorf("activation: %s=%q: want 0..%d", EnvFDs, fds, maxFDs)
	}
	var nameList []string
	if names != "" {
		nameList = strings.Split(names, ":")
		if len(nameList) != n {
			return nil, fmt.Errorf("activation: %s has %d names for %d sockets", EnvNames, len(nameList), n)
		}
	}
	out := make([]Socket, 0, n)
	for i := range n {
		name := ""
		if nameList != nil && nameList[i] != "unknown" {
			name = nameList[i]
		}
		s, err := open(FirstFD+i, name)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// fromFD wraps a passed descriptor.
func fromFD(fd int, name string) (Socket, error) {
	syscall.CloseOnExec(fd)
	typ, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE)
	if err != nil {
		return Socket{}, fmt.Errorf("activation: fd %d (%s): not a socket: %w", fd, name, err)
	}
	f := os.NewFile(uintptr(fd), "activated-"+strconv.Itoa(fd))
	defer f.Close() // net.File* dup the descriptor
	s := Socket{Name: name, FD: fd}
	switch typ {
	case syscall.SOCK_STREAM:
		acc, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
		if err != nil || acc == 0 {
			return Socket{}, fmt.Errorf("activation: fd %d (%s): a stream socket that is not listening (Accept=yes is not supported)", fd, name)
		}
		if s.Listener, err = net.FileListener(f); err != nil {
			return Socket{}, fmt.Errorf("activation: fd %d (%s): %w", fd, name, err)
		}
	case syscall.SOCK_DGRAM:
		if s.Packet, err = net.FilePacketConn(f); err != nil {
			return Socket{}, fmt.Errorf("activation: fd %d (%s): %w", fd, name, err)
		}
	default:
		return Socket{}, fmt.Errorf("activation: fd %d (%s): socket type %d: want a stream listener or a datagram socket", fd, name, typ)
	}
	return s, nil
}

// ErrUnused is wrapped by the error of a consumer that had no use for a
// passed socket (its configuration names no such listener).
var ErrUnused = errors.New("activation: passed socket not used")
