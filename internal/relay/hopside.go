package relay

// Stage: hop side. A member's connection: verify its hop header
// (authentic, fresh, addressed here), then forward it to the next member
// (TrP) or connect to the origin (EgP).

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/socks5"
)

// refusalReason maps an error of hop.Read to a refusal reason.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return refuseHeaderTimeout
	case errors.Is(err, hop.ErrAuth):
		return refuseAuth
	case errors.Is(err, hop.ErrReplay):
		return refuseReplay
	case errors.Is(err, hop.ErrTooLarge):
		return refuseTooLarge
	case errors.Is(err, hop.ErrExpired):
		return refuseExpired
	default:
		return refuseMalformed
	}
}

// serveHop handles a connection from another member: verify the header,
// then forward to the next member or, as EgP, to the origin.
func (s *Server) serveHop(c *net.TCPConn, src netip.AddrPort) (role, *net.TCPConn) {
	kr := s.keyring()
	if kr == nil {
		s.refuse(refuseAuth, c, src, errors.New("no overlay keys"))
		return "", nil
	}
	var hr io.Reader = deadlineReader{c}
	if s.isMemberIP(src.Addr()) {
		// A member's pooled connection waits here until a flow uses it.
		var ok bool
		if hr, ok = s.memberPreamble(c, src); !ok {
			return "", nil
		}
	}
	c.SetReadDeadline(time.Now().Add(s.accept.header))
	h, err := hop.Read(hr, kr, time.Now(), s.cfg.maxSkew())
	if err == nil {
		err = s.overlay.replay.Check(h)
	}
	if err != nil {
		s.refuse(refusalReason(err), c, src, err)
		return "", nil
	}
	c.SetReadDeadline(time.Time{})
	return s.hopOnward(c, src, h, nil)
}

// hopOnward serves a hop flow whose header h was read and checked: forward
// it to the next member or, as EgP, to the origin. early holds the flow's
// bytes read after the header; they go first.
func (s *Server) hopOnward(c *net.TCPConn, src netip.AddrPort, h *hop.Header, early []byte) (role, *net.TCPConn) {
	if h.Hop == 0 || h.Route[h.Hop] != s.self {
		s.refuse(refuseNotSelf, c, src, fmt.Errorf("route %v hop %d", h.Route, h.Hop))
		return "", nil
	}
	log := s.log.With("flow", flowString(h.FlowID))
	if h.Lookup != "" { // a route completion request: this FEP is the InP's LoP
		return s.completeRoute(c, src, h, log, early)
	}
	if h.Hop < len(h.Route)-1 {
		next := h.Route[h.Hop+1]
		addr, ok := s.member(next)
		if !ok || next == s.self {
			s.refuse(refuseNotMember, c, src, fmt.Errorf("next hop %q", next))
			return "", nil
		}
		fwd := *h
		fwd.Hop++
		fwd.Time = time.Now()
		return roleTrP, s.forward(c, roleTrP, next, addr, &fwd, log, early)
	}
	t, err := ParseTarget(h.Target)
	if err != nil {
		s.refuse(refusePolicy, c, src, err)
		return "", nil
	}
	return roleEgP, s.exit(c, roleEgP, t, h, log, early)
}

// awaitFirstByte waits up to d for c's first byte. A connection closed
// before sending anything (a pooled connection its owner retired) is closed
// without counting a refusal.
func (s *Server) awaitFirstByte(c *net.TCPConn, src netip.AddrPort, d time.Duration) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		resetClose(c)
		return false
	}
	c.SetReadDeadline(time.Now().Add(d))
	n, err := waitReadable(rc)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		n, err = peekQueued(rc) // see deadlineReader
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.refuse(refuseHeaderTimeout, c, src, err)
		return false
	case err != nil || n == 0:
		c.Close()
		return false
	}
	return true
}

// forward connects to the next member, sends it h and relays. pre holds
// bytes of the flow read already; they go first.
func (s *Server) forward(c *net.TCPConn, role role, next, addr string, h *hop.Header, log *slog.Logger, pre []byte) *net.TCPConn {
	// The flow's first bytes that came with the header (in its SYN with
	// Fast Open) leave with the next header.
	early := s.earlyBytes(c)
	if len(pre) > 0 {
		early = append(pre[:len(pre):len(pre)], early...)
	}
	up, err := s.dialHop(next, addr, h, early)
	if err != nil {
		log.Debug("connect next hop", "next", next, "addr", addr, "err", err)
		s.endFlow(role, outcomeDialError)
		resetClose(c)
		return nil
	}
	s.m.roles[role].up.Add(float64(len(early)))
	log.Debug("hop", "role", role, "next", next, "route", h.Route)
	return up
}

// exit is the EgP's last step: connect to the origin if the destination
// policy allows it, and relay. early holds bytes of the flow read already;
// they go first. When h asks for a verdict, the EgP answers it before any
// byte of the origin: success, or why not (then closes with a FIN, so the
// verdict is not lost to a reset).
func (s *Server) exit(c *net.TCPConn, role role, t Target, h *hop.Header, log *slog.Logger, early []byte) *net.TCPConn {
	client := h.Source
	up, err := s.dialOrigin(t, client, h.Dest)
	if errors.Is(err, errPolicy) {
		if h.Verdict {
			s.m.refusals.WithLabelValues(refusePolicy).Inc()
			s.refLog.refused(refusePolicy, client, fmt.Errorf("target %s", t))
			s.sendVerdict(c, socks5.NotAllowed)
			return nil
		}
		s.refuse(refusePolicy, c, client, fmt.Errorf("target %s", t))
		return nil
	}
	if err == nil && len(early) > 0 {
		up.SetWriteDeadline(time.Now().Add(s.out.dialer.Timeout))
		if _, err = up.Write(early); err != nil {
			s.untrack(up)
			resetClose(up)
			err = fmt.Errorf("send early bytes to %s: %w", t, err)
		} else {
			up.SetWriteDeadline(time.Time{})
			s.m.roles[role].up.Add(float64(len(early)))
		}
	}
	if err != nil {
		log.Debug("connect origin", "target", t.String(), "err", err)
		s.endFlow(role, outcomeDialError)
		if h.Verdict {
			s.sendVerdict(c, socks5.ReplyCode(err))
			return nil
		}
		resetClose(c)
		return nil
	}
	if h.Verdict {
		c.SetWriteDeadline(time.Now().Add(s.accept.header))
		_, err := c.Write(hop.AppendVerdict(nil, socks5.Succeeded))
		c.SetWriteDeadline(time.Time{})
		if err != nil {
			s.untrack(up)
			resetClose(up)
			s.endFlow(role, outcomeReset)
			resetClose(c)
			return nil
		}
	}
	log.Debug("exit", "role", role, "target", t.String())
	return up
}

// sendVerdict answers a refusal's verdict on c and closes it with a FIN.
func (s *Server) sendVerdict(c *net.TCPConn, code byte) {
	c.SetWriteDeadline(time.Now().Add(s.accept.header))
	c.Write(hop.AppendVerdict(nil, code))
	c.CloseWrite() // the FIN follows the verdict
	c.Close()
}

func flowString(id [16]byte) string {
	return fmt.Sprintf("%x", id[:8])
}
