package relay

import (
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fastOpenQueue is the TCP_FASTOPEN queue length of the listeners: SYNs
// with data pending accept beyond it fall back to a normal handshake.
const fastOpenQueue = 1024

// Socket kinds for control.
const (
	sockListen   = iota // a listener: TCP_FASTOPEN
	sockDial            // a flow's connection: TCP_FASTOPEN_CONNECT
	sockPoolDial        // a pooled connection: opened now, no deferred SYN
)

// control returns a net.Dialer/ListenConfig Control function applying the
// configured socket options before connect or listen (buffer sizes must be
// set before the handshake to affect window scaling). Accepted sockets
// inherit them from the listener.
func (c SocketConfig) control(kind int) func(network, address string, rc syscall.RawConn) error {
	fastOpen := c.FastOpen && kind != sockPoolDial
	if c.RcvBuf == 0 && c.SndBuf == 0 && c.Congestion == "" && c.NotSentLowat == 0 && !fastOpen {
		return nil
	}
	return func(network, address string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = c.apply(int(fd))
			if serr != nil || !fastOpen {
				return
			}
			if kind == sockListen {
				if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN, fastOpenQueue); err != nil {
					serr = fmt.Errorf("set TCP_FASTOPEN: %w", err)
				}
				return
			}
			if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1); err != nil {
				serr = fmt.Errorf("set TCP_FASTOPEN_CONNECT: %w", err)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// keepAlive returns the net.Dialer/ListenConfig KeepAlive value: negative
// disables Go's default 15 s keepalive.
func (c SocketConfig) keepAlive() time.Duration {
	if c.KeepAlive == 0 {
		return -1
	}
	return time.Duration(c.KeepAlive)
}

func (c SocketConfig) apply(fd int) error {
	if c.RcvBuf > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, int(c.RcvBuf)); err != nil {
			return fmt.Errorf("set SO_RCVBUF: %w", err)
		}
	}
	if c.SndBuf > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, int(c.SndBuf)); err != nil {
			return fmt.Errorf("set SO_SNDBUF: %w", err)
		}
	}
	if c.Congestion != "" {
		if err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, c.Congestion); err != nil {
			return fmt.Errorf("set TCP_CONGESTION %q: %w", c.Congestion, err)
		}
	}
	if c.NotSentLowat > 0 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, int(c.NotSentLowat)); err != nil {
			return fmt.Errorf("set TCP_NOTSENT_LOWAT: %w", err)
		}
	}
	return nil
}

// windowClampControl returns a socket control that runs prev (if not
// nil) and sets TCP_WINDOW_CLAMP to bytes (before connect or listen: the
// handshake's window and a listener's accepted connections follow it).
func windowClampControl(bytes int, prev func(network, address string, rc syscall.RawConn) error) func(network, address string, rc syscall.RawConn) error {
	return func(network, address string, rc syscall.RawConn) error {
		if prev != nil {
			if err := prev(network, address, rc); err != nil {
				return err
			}
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, bytes)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set TCP_WINDOW_CLAMP: %w", serr)
		}
		return nil
	}
}

// unpacedCap is the SO_MAX_PACING_RATE (bytes/s) setPacing sets: any value
// but ~0 turns TCP's internal pacing on; this one (about 34 Gbit/s) never
// caps a flow.
const unpacedCap = 0xFFFFFFFE

// setPacing turns on TCP's internal pacing on c (the kernel paces from
// cwnd and srtt; no qdisc needed), capped at mbit Mbit/s when > 0.
func setPacing(c *net.TCPConn, mbit float64) error {
	limit := uint64(unpacedCap)
	if mbit > 0 {
		limit = max(uint64(mbit*1e6/8), 1)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, int(limit))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set SO_MAX_PACING_RATE: %w", serr)
	}
	return nil
}
