package relay

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenControl returns the Control function of the hop and entry
// listeners: the configured socket options, and SO_REUSEPORT when workers
// or socket.reuseport ask for it (set before bind, as the kernel requires).
func (s *Server) listenControl() func(network, address string, rc syscall.RawConn) error {
	opts := s.cfg.Socket.control(sockListen)
	if !s.cfg.reusePort() {
		return opts
	}
	return func(network, address string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
				serr = fmt.Errorf("set SO_REUSEPORT: %w", err)
			}
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		if opts != nil {
			return opts(network, address, rc)
		}
		return nil
	}
}
