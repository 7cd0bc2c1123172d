package relay

// Stage: dial and pools. Connecting onward: to the next member with its
// signed header, or to an origin the destination policy allows, from a
// pool of ready connections when one is there.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
)

// originPolicy decides where a flow may leave the overlay.
type originPolicy struct {
	egress *egressMap
	policy policy
	ppDest []matcher // origins that want a PROXY v2 header
	res    resolver
}

// outbound is how this daemon connects onward.
type outbound struct {
	dialer     net.Dialer
	poolDialer net.Dialer // no TCP_FASTOPEN_CONNECT: a pooled connection is opened at once
	hopPool    *connPool  // nil: no pool of member connections
	originPool *connPool  // nil: no pool of origin connections
	// members is the destination policy of member dials (hop.member_allow);
	// nil: only never-legitimate member addresses are refused.
	members *policy
}

// MaxPooledMembers is the largest overlay whose every member gets a hop
// pool up front. In a larger one a proxy pools only the next hops its flows
// used in the last 10 minutes (learned on use), so idle connections grow
// with the routes a proxy serves, not with the overlay.
const MaxPooledMembers = 16

// hopPoolTargets returns the members to keep pooled connections to up
// front: all of them in a small overlay, none (learned on use) in a large one.
func (s *Server) hopPoolTargets() []string {
	if len(s.overlay.members.Load().src.Members()) > MaxPooledMembers+1 {
		return nil
	}
	return slices.DeleteFunc(s.memberAddrs(), func(a string) bool { return s.memberAddrAllowed(a) != nil })
}

// runPool runs one connection pool until ctx ends.
func (s *Server) runPool(wg *sync.WaitGroup, ctx context.Context, p *connPool) {
	defer wg.Done()
	p.run(ctx)
}

// dialHop connects to the next member and sends it the signed header h
// followed by the flow's early bytes in one write.
func (s *Server) dialHop(next, addr string, h *hop.Header, early []byte) (*net.TCPConn, error) {
	if err := s.memberAddrAllowed(addr); err != nil {
		return nil, fmt.Errorf("member %s: %w", next, err)
	}
	b, err := h.Marshal(s.keyring())
	if err != nil {
		return nil, fmt.Errorf("marshal hop header: %w", err)
	}
	b = append(b, early...)
	if s.out.hopPool != nil {
		s.out.hopPool.learn(addr) // keeps addr pooled in an overlay too large to pool up front
	}
	if up := s.fromPool(s.out.hopPool, addr); up != nil {
		up.SetWriteDeadline(time.Now().Add(s.out.dialer.Timeout))
		if _, err := up.Write(b); err == nil {
			up.SetWriteDeadline(time.Time{})
			s.m.upstream.WithLabelValues(next, "pool").Inc()
			return up, nil
		}
		// The pooled connection broke since the check: dial a fresh one.
		s.untrack(up)
		resetClose(up)
	}
	up, err := s.dial(next, addr)
	if err != nil {
		return nil, err
	}
	up.SetWriteDeadline(time.Now().Add(s.out.dialer.Timeout))
	if _, err := up.Write(b); err != nil {
		s.untrack(up)
		resetClose(up)
		return nil, fmt.Errorf("send hop header to %s: %w", next, err)
	}
	up.SetWriteDeadline(time.Time{})
	if err := s.awaitFastOpen(up); err != nil {
		s.untrack(up)
		resetClose(up)
		return nil, fmt.Errorf("connect %s %s: %w", next, addr, err)
	}
	return up, nil
}

// memberPolicy returns the destination policy of member dials:
// hop.member_allow when configured (the operator's override), else the
// member policy the controller sends with its table (the policy it
// registers member addresses by); nil: neither. A policy from the table
// that does not parse refuses every member dial.
func (s *Server) memberPolicy() (*policy, string, error) {
	if s.out.members != nil {
		return s.out.members, "hop.member_allow", nil
	}
	mb := s.overlay.members.Load()
	if mb == nil {
		return nil, "", nil
	}
	ps, ok := mb.src.(MemberPolicySource)
	if !ok {
		return nil, "", nil
	}
	list := ps.MemberPolicy()
	if len(list) == 0 {
		return nil, "", nil
	}
	if c := s.overlay.memberPol.Load(); c != nil && slices.Equal(c.list, list) {
		return c.p, "the controller's member policy", c.err
	}
	c := &parsedPolicy{list: list}
	if ms, err := parseMatchers(list); err != nil {
		c.err = fmt.Errorf("%w: the controller's member policy %q: %w", errPolicy, list, err)
	} else {
		c.p = &policy{allow: ms}
	}
	s.overlay.memberPol.Store(c)
	return c.p, "the controller's member policy", c.err
}

// memberAddrAllowed applies the member policy (memberPolicy) to a member
// address, or, with none, refuses a member address no overlay uses:
// link-local (169.254.0.0/16 holds cloud metadata services, fe80::/10),
// multicast, unspecified, unless the destination policy names it.
// Loopback and private members stay allowed then (labs, private overlays
// with static configs or a controller without its member check).
func (s *Server) memberAddrAllowed(addr string) error {
	p, from, err := s.memberPolicy()
	if err != nil {
		return err
	}
	if p != nil {
		t, err := ParseTarget(addr)
		if err != nil {
			return fmt.Errorf("%w: member address %s: %w", errPolicy, addr, err)
		}
		ctx := context.Background() // an address: no lookup
		if !t.ip().IsValid() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(s.flows.ctx, s.out.dialer.Timeout)
			defer cancel()
		}
		if _, err := p.resolve(ctx, s.origin.res, t); err != nil {
			return fmt.Errorf("member address %s (%s): %w", addr, from, err)
		}
		return nil
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil // a name from a static config
	}
	ip := ap.Addr().Unmap()
	if !(ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast()) {
		return nil
	}
	for _, m := range s.origin.policy.allow {
		if ok, explicit := m.matches("", ip, ap.Port()); ok && explicit {
			return nil
		}
	}
	return fmt.Errorf("%w: member address %s is link-local, multicast or unspecified", errPolicy, addr)
}

func (s *Server) dialOrigin(t Target, client, local netip.AddrPort) (*net.TCPConn, error) {
	var dst netip.AddrPort
	var err error
	if t.ip().IsValid() { // an address: no lookup, so no timeout context
		dst, err = s.origin.policy.resolve(context.Background(), s.origin.res, t)
	} else {
		ctx, cancel := context.WithTimeout(s.flows.ctx, s.out.dialer.Timeout)
		dst, err = s.origin.policy.resolve(ctx, s.origin.res, t)
		cancel()
	}
	if err != nil {
		return nil, err
	}
	up := s.fromPool(s.out.originPool, dst.String())
	if up != nil {
		s.m.upstream.WithLabelValues("origin", "pool").Inc()
	} else {
		if up, err = s.dial("origin", dst.String()); err != nil {
			return nil, err
		}
		if s.out.originPool != nil {
			s.out.originPool.learn(dst.String())
		}
	}
	if listAllowsAny(s.origin.ppDest, t, dst.Addr()) {
		up.SetWriteDeadline(time.Now().Add(s.out.dialer.Timeout))
		if _, err := up.Write(hop.AppendPlainV2(nil, client, local)); err != nil {
			s.untrack(up)
			resetClose(up)
			return nil, fmt.Errorf("send PROXY header to %s: %w", dst, err)
		}
		up.SetWriteDeadline(time.Time{})
	}
	return up, nil
}

// listAllowsAny reports whether t (by name or by its resolved address)
// matches one of ms; an empty list matches nothing.
func listAllowsAny(ms []matcher, t Target, ip netip.Addr) bool {
	for _, m := range ms {
		if ok, _ := m.matches(t.Host, ip, t.Port); ok {
			return true
		}
	}
	return false
}

// fromPool takes a pooled connection to addr from p (nil when p is nil or
// has none ready) and tracks it like a dialed one.
func (s *Server) fromPool(p *connPool, addr string) *net.TCPConn {
	if p == nil {
		return nil
	}
	c := p.get(addr)
	if c == nil {
		return nil
	}
	if s.cfg.Socket.NoDelay != nil {
		c.SetNoDelay(*s.cfg.Socket.NoDelay)
	}
	s.track(c)
	return c
}

// dialPooled opens a connection for a pool (untracked: the pool owns it).
func (s *Server) dialPooled(ctx context.Context, addr string) (*net.TCPConn, error) {
	nc, err := s.out.poolDialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return nc.(*net.TCPConn), nil
}

// dial connects to addr (peer names the next hop for the metrics) and
// tracks the connection.
func (s *Server) dial(peer, addr string) (*net.TCPConn, error) {
	start := time.Now()
	nc, err := s.out.dialer.DialContext(s.flows.ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s %s: %w", peer, addr, err)
	}
	pm := s.m.peer(peer)
	pm.connect.Observe(time.Since(start).Seconds())
	pm.dial.Inc()
	c := nc.(*net.TCPConn)
	if s.cfg.Socket.NoDelay != nil {
		c.SetNoDelay(*s.cfg.Socket.NoDelay)
	}
	s.track(c)
	return c, nil
}
