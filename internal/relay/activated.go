package relay

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"github.com/mosto-net/mosto/internal/activation"
)

// activatedPool hands the sockets passed by systemd (Config.Activated) to
// the listeners bind would otherwise create: by name (LISTEN_FDNAMES:
// hop, service-NAME, socks5, http_connect, metrics), else by address.
type activatedPool struct {
	socks []activation.Socket
	used  []bool
}

func newActivatedPool(socks []activation.Socket) *activatedPool {
	return &activatedPool{socks: socks, used: make([]bool, len(socks))}
}

// take returns the passed stream socket for the listener name at addr,
// or nil when none was passed for it. systemd gives every socket of a
// socket unit its one FileDescriptorName=, so a name may be carried by
// several sockets: a socket with the listener's name and address is taken
// first, then one with its name (a wrong address is an error), then one
// at its address whose name is no listener's or is shared by several
// sockets.
func (p *activatedPool) take(name, addr string) (net.Listener, error) {
	pick := p.find(func(s activation.Socket) bool { return s.Name == name && sameAddr(s.Listener.Addr(), addr) })
	if pick < 0 {
		pick = p.find(func(s activation.Socket) bool { return s.Name == name })
	}
	if pick < 0 {
		pick = p.find(func(s activation.Socket) bool {
			return (s.Name == "" || !knownName(s.Name) || p.shared(s.Name)) && sameAddr(s.Listener.Addr(), addr)
		})
	}
	if pick < 0 {
		return nil, nil
	}
	p.used[pick] = true
	s := p.socks[pick]
	if !sameAddr(s.Listener.Addr(), addr) {
		return nil, fmt.Errorf("passed socket %q listens on %s, but the configuration says %s", name, s.Listener.Addr(), addr)
	}
	return s.Listener, nil
}

// find returns the index of the first unused stream socket ok accepts, or -1.
func (p *activatedPool) find(ok func(activation.Socket) bool) int {
	for i, s := range p.socks {
		if !p.used[i] && s.Listener != nil && ok(s) {
			return i
		}
	}
	return -1
}

// shared reports whether more than one passed stream socket is named n.
func (p *activatedPool) shared(n string) bool {
	c := 0
	for _, s := range p.socks {
		if s.Listener != nil && s.Name == n {
			c++
		}
	}
	return c > 1
}

// knownName reports whether n names a listener kind (then it is matched
// by name only).
func knownName(n string) bool {
	switch n {
	case "hop", "socks5", "http_connect", "metrics":
		return true
	}
	return len(n) > 8 && n[:8] == "service-"
}

// unused returns an error naming the passed sockets no listener took
// (a socket unit and a configuration that disagree), closing them.
func (p *activatedPool) unused() error {
	var errs []error
	for i, s := range p.socks {
		if !p.used[i] && s.Listener != nil {
			errs = append(errs, fmt.Errorf("%w: %q on %s (no listener of the configuration has this name or address)", activation.ErrUnused, s.Name, s.Addr()))
			s.Close()
		}
	}
	return errors.Join(errs...)
}

// sameAddr reports whether a bound address serves the configured host:port:
// same port, and the same IP or both unspecified (0.0.0.0, ::, or no host).
func sameAddr(a net.Addr, conf string) bool {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return false
	}
	host, port, err := net.SplitHostPort(conf)
	if err != nil {
		return false
	}
	if p, err := strconv.Atoi(port); err != nil || p != ta.Port {
		return false
	}
	ip := net.ParseIP(host)
	if host == "" || ip != nil && ip.IsUnspecified() {
		return ta.IP.IsUnspecified()
	}
	if ip == nil {
		return true // a host name: trust the socket unit
	}
	return ip.Equal(ta.IP)
}

// applyListenOptions sets the socket options bind would have set on a
// listener it made itself (buffers, Fast Open...) on a passed one.
func applyListenOptions(ln net.Listener, ctl func(network, address string, rc syscall.RawConn) error) error {
	tl, ok := ln.(*net.TCPListener)
	if !ok || ctl == nil {
		return nil
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return err
	}
	return ctl("tcp", tl.Addr().String(), rc)
}
