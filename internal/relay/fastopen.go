package relay

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// errHandshake: a Fast Open connection's handshake ended without
// establishing it, and the kernel left no error behind.
var errHandshake = errors.New("relay: handshake failed")

// awaitFastOpen waits, for a connection dialed with TCP_FASTOPEN_CONNECT,
// until its handshake completed, and returns why it failed. Such a
// connect() returns before any packet left and the first write only queues
// the bytes in the SYN, so an unreachable or refusing peer would otherwise
// show up in the middle of the relay as a reset of the client. Waiting
// costs nothing: no reply can come before the SYN-ACK, and the bytes
// already ride the SYN (or, without a cookie, wait for the handshake
// anyway). Without Fast Open it returns nil at once (the dial waited).
func (s *Server) awaitFastOpen(c *net.TCPConn) error {
	if !s.cfg.Socket.FastOpen {
		return nil
	}
	return awaitEstablished(c, s.out.dialer.Timeout)
}

// awaitEstablished waits up to d until c leaves SYN_SENT and returns its
// socket error if it did not reach ESTABLISHED (or a later state).
func awaitEstablished(c *net.TCPConn, d time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	if d > 0 {
		c.SetWriteDeadline(time.Now().Add(d))
		defer c.SetWriteDeadline(time.Time{})
	}
	var herr error
	err = rc.Write(func(fd uintptr) bool {
		if e, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
			herr = err
			if e != 0 {
				herr = syscall.Errno(e)
			}
			return true
		}
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			herr = err
			return true
		}
		switch info.State {
		case tcpSynSent:
			return false // wait for the handshake's end
		case tcpClose, tcpListen:
			herr = errHandshake
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("fast open handshake: %w", err)
	}
	if herr != nil {
		return fmt.Errorf("fast open handshake: %w", herr)
	}
	return nil
}

// TCP states (include/net/tcp_states.h).
const (
	tcpSynSent = 2
	tcpClose   = 7
	tcpListen  = 10
)
