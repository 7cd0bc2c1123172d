package intercept

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenTransparent opens the IP_TRANSPARENT listener that TPROXY hands
// intercepted flows to. The local address of an accepted connection is the
// flow's original destination (OriginalDst). control, if not nil, sets
// more options before bind.
func ListenTransparent(ctx context.Context, addr string, control func(network, address string, c syscall.RawConn) error) (*net.TCPListener, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		if control != nil {
			if err := control(network, address, c); err != nil {
				return err
			}
		}
		return setTransparent(c)
	}}
	l, err := lc.Listen(ctx, "tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("intercept: listen %s: %w", addr, err)
	}
	return l.(*net.TCPListener), nil
}

// OriginalDst returns the destination the client dialled, for a connection
// accepted from a ListenTransparent listener.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	a, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, errors.New("intercept: not a TCP connection")
	}
	return a.AddrPort(), nil
}

// DialTransparent connects to dst from src, an address (and port) that is
// not this host's: the client's, so that the server sees the client. The
// packets of the connection come back to this host only if it is on the
// path and the interception's "socket transparent" rule delivers them.
func DialTransparent(ctx context.Context, src, dst netip.AddrPort, d net.Dialer) (*net.TCPConn, error) {
	d.LocalAddr = net.TCPAddrFromAddrPort(src)
	d.Control = SockoptControl(unix.SOL_IP, unix.IP_TRANSPARENT, 1, "IP_TRANSPARENT",
		SockoptControl(unix.SOL_SOCKET, unix.SO_REUSEADDR, 1, "SO_REUSEADDR", d.Control))
	c, err := d.DialContext(ctx, "tcp4", dst.String())
	if err != nil {
		return nil, fmt.Errorf("intercept: dial %v from %v: %w", dst, src, err)
	}
	return c.(*net.TCPConn), nil
}

// MarkControl returns a socket control function that runs prev (if not
// nil) and sets SO_MARK to mark: the relay's legs with Config.LegMark
// (a listener's accepted connections inherit its mark).
func MarkControl(mark uint32, prev func(network, address string, c syscall.RawConn) error) func(network, address string, c syscall.RawConn) error {
	return SockoptControl(unix.SOL_SOCKET, unix.SO_MARK, int(mark), "SO_MARK", prev)
}

// SockoptControl returns a socket control function that runs prev (if not
// nil) and then sets the integer socket option level/opt to v (name is
// the option's name in the error).
func SockoptControl(level, opt, v int, name string, prev func(network, address string, c syscall.RawConn) error) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		if prev != nil {
			if err := prev(network, address, c); err != nil {
				return err
			}
		}
		return setInt(c, level, opt, v, name)
	}
}

// setInt sets the integer socket option level/opt of c to v.
func setInt(c syscall.RawConn, level, opt, v int, name string) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), level, opt, v)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("%s: %w", name, serr)
	}
	return nil
}

func setTransparent(c syscall.RawConn) error {
	return setInt(c, unix.SOL_IP, unix.IP_TRANSPARENT, 1, "IP_TRANSPARENT")
}

// AbortOnClose makes closing c (also by the kernel when the process dies)
// send a reset instead of a FIN while on is true: an intercepted flow whose
// relay is killed then ends with a reset on both legs, never with a clean
// end of stream that would pass a truncated transfer for a whole one. The
// relay turns it off before its own orderly close.
func AbortOnClose(c *net.TCPConn, on bool) error {
	if on {
		return c.SetLinger(0)
	}
	return c.SetLinger(-1)
}
