package relay

// Stage: accept. Binding the listeners, the accept loop of the listeners
// the event loops do not serve, admission (connection limits) and refusal.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// acceptState is the accepting side: listeners and admission.
type acceptState struct {
	listeners []*listener
	limits    *connLimiter
	header    time.Duration // time allowed for a hop header or entry handshake
}

// listener is one bound listening socket with what it serves.
type listener struct {
	ln      *net.TCPListener
	kind    entryKind
	service *ServiceConfig // kindService
	// origin is service.Origin parsed (once: every flow of the listener
	// goes there); originErr is why it did not parse (Validate checks it).
	origin    Target
	originErr error
	allow     []matcher // kindSOCKS5, kindConnect
	looped    bool      // served by the event loops, not acceptLoop
}

type entryKind uint8

const (
	kindHop entryKind = iota
	kindService
	kindSOCKS5
	kindConnect
	kindTProxy
)

func (k entryKind) String() string {
	return [...]string{"hop", "service", "socks5", "http_connect", "tproxy"}[k]
}

func (s *Server) bind() error {
	lc := net.ListenConfig{Control: s.listenControl(), KeepAlive: s.cfg.Socket.keepAlive()}
	passed := newActivatedPool(s.cfg.Activated) // socket activation (activated.go)
	listen := func(addr string, l *listener) error {
		name := l.kind.String()
		if l.service != nil {
			name = "service-" + l.service.Name
		}
		ln, err := passed.take(name, addr)
		if err == nil && ln != nil {
			err = applyListenOptions(ln, lc.Control)
		} else if err == nil {
			ln, err = lc.Listen(context.Background(), "tcp", addr)
		}
		if err != nil {
			return fmt.Errorf("listen %s %s: %w", l.kind, addr, err)
		}
		l.ln = ln.(*net.TCPListener)
		s.accept.listeners = append(s.accept.listeners, l)
		return nil
	}
	if a := s.cfg.Hop.Listen; a != "" {
		if s.overlay.kr == nil && !s.cfg.Managed {
			return errors.New("hop.listen needs keys.current")
		}
		if err := listen(a, &listener{kind: kindHop}); err != nil {
			return err
		}
	}
	for i := range s.cfg.Services {
		svc := &s.cfg.Services[i]
		l := &listener{kind: kindService, service: svc}
		l.origin, l.originErr = ParseTarget(svc.Origin)
		if err := listen(svc.Listen, l); err != nil {
			return err
		}
	}
	if c := s.cfg.SOCKS5; c != nil {
		allow, _ := parseMatchers(c.Allow)
		if err := listen(c.Listen, &listener{kind: kindSOCKS5, allow: allow}); err != nil {
			return err
		}
	}
	if c := s.cfg.HTTPConnect; c != nil {
		allow, _ := parseMatchers(c.Allow)
		if err := listen(c.Listen, &listener{kind: kindConnect, allow: allow}); err != nil {
			return err
		}
	}
	if err := s.bindTProxy(); err != nil {
		return err
	}
	if a := s.cfg.Metrics.Listen; a != "" {
		ln, err := passed.take("metrics", a)
		if err == nil && ln == nil {
			ln, err = net.Listen("tcp", a)
		}
		if err != nil {
			return fmt.Errorf("listen metrics %s: %w", a, err)
		}
		s.admin.ln = ln
	}
	return passed.unused()
}

func (s *Server) addr(kind entryKind, i int) net.Addr {
	for _, l := range s.accept.listeners {
		if l.kind != kind {
			continue
		}
		if i == 0 {
			return l.ln.Addr()
		}
		i--
	}
	return nil
}

// HopAddr returns the hop listener's address, or nil.
func (s *Server) HopAddr() net.Addr { return s.addr(kindHop, 0) }

// ServiceAddr returns the address of the i-th service listener, or nil.
func (s *Server) ServiceAddr(i int) net.Addr { return s.addr(kindService, i) }

// SOCKS5Addr returns the SOCKS5 listener's address, or nil.
func (s *Server) SOCKS5Addr() net.Addr { return s.addr(kindSOCKS5, 0) }

// HTTPConnectAddr returns the HTTP CONNECT listener's address, or nil.
func (s *Server) HTTPConnectAddr() net.Addr { return s.addr(kindConnect, 0) }

// acceptLoop accepts connections on l until it is closed.
func (s *Server) acceptLoop(wg *sync.WaitGroup, l *listener, fatal chan<- error) {
	defer wg.Done()
	var backoff time.Duration
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if s.draining.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept", "listener", l.kind.String(), "err", err, "retry", backoff)
				time.Sleep(backoff)
				continue
			}
			fatal <- fmt.Errorf("accept %s: %w", l.kind, err)
			return
		}
		backoff = 0
		src := addrPort(c.RemoteAddr())
		if reason := s.accept.limits.acquire(src.Addr(), l.kind == kindHop); reason != "" {
			s.refuse(reason, c, src, nil)
			continue
		}
		s.flows.wg.Add(1)
		s.dispatch(handshakeJob{l: l, c: c, src: src})
	}
}

func isTemporary(err error) bool {
	var se interface{ Temporary() bool }
	return errors.As(err, &se) && se.Temporary()
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}

// refuse counts and logs a refused connection and closes it with a reset.
func (s *Server) refuse(reason string, c net.Conn, src netip.AddrPort, err error) {
	s.m.refusals.WithLabelValues(reason).Inc()
	s.refLog.refused(reason, src, err)
	resetClose(c)
}
