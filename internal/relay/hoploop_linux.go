package relay

// Stage: event loops (hop flows); see the comment below.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/mosto-net/mosto/internal/evloop"
	"github.com/mosto-net/mosto/internal/hop"
)

// Hop flows on the event loops: the hop listener is served by the same
// loops as the service listeners. A hop flow starts without an upstream,
// waiting for its head (evloop's Upstream.Head): the loop reads the
// client's bytes and asks hopDial, which answers ErrMore until the pool
// hello or the whole hop header is in. The header is then checked exactly
// as serveHop checks it (keyring, replay, route, member, policy) and the
// flow goes on to the next member with a new signed header as the
// upstream's Prefix (the header is consumed, the bytes after it follow),
// or to the origin. Route completion requests (a LoP's work) and targets
// that are host names (DNS) go back to the goroutine path with the header
// and the bytes read (evloop.ErrTaken, then takeHop).

// hopPhase is what a hop flow in a loop waits for.
type hopPhase uint8

const (
	// phaseHeader: the hop header, within timeouts.header.
	phaseHeader hopPhase = iota
	// phaseIdle: a member's connection waits up to hop.member_idle for
	// its first byte.
	phaseIdle
	// phasePreamble: a member's connection: the pool hello, or a header.
	phasePreamble
	// phasePooled: a pooled connection waits (its grant) for its flow's
	// first byte.
	phasePooled
)

// openHop starts a hop flow accepted by a loop (admission done): it
// waits for the header, after member_idle or the pool hello for a
// connection from a member's address, as serveHop and memberPreamble do.
func (s *Server) openHop(l *listener, fd int, src netip.AddrPort) (evloop.Upstream, any, error) {
	fl := &loopFlow{l: l, fd: fd, src: src}
	if s.keyring() == nil {
		s.loopRefuse(fl, refuseAuth, src, errors.New("no overlay keys"))
		s.loopRelease(src, true)
		return evloop.Upstream{}, nil, errLoopRefused
	}
	wait := s.accept.header
	if s.isMemberIP(src.Addr()) {
		fl.phase = phasePreamble
		if mi := time.Duration(s.cfg.Hop.MemberIdle); mi > 0 {
			fl.phase, wait = phaseIdle, mi
		}
	}
	return evloop.Upstream{Wait: wait, Head: true}, fl, nil
}

// hopDial implements Handler.Dial for hop flows: the next step of the
// head with the client's bytes read so far.
func (s *Server) hopDial(fl *loopFlow, first []byte) (evloop.Upstream, error) {
	switch fl.phase {
	case phaseIdle:
		// The first byte came within member_idle: the preamble (or header)
		// within the header timeout from now.
		fl.phase = phasePreamble
		return evloop.Upstream{Wait: s.accept.header, Head: true}, nil
	case phasePooled:
		// The flow's first byte: its header within the header timeout.
		fl.phase = phaseHeader
		return evloop.Upstream{Wait: s.accept.header, Head: true}, nil
	case phasePreamble:
		n := min(len(first), len(poolHello))
		if !bytes.Equal(first[:n], poolHello[:n]) {
			fl.phase = phaseHeader // not a pooled connection: a header
			break
		}
		if n < len(poolHello) {
			return evloop.Upstream{}, evloop.ErrMore
		}
		grant := time.Duration(s.cfg.Hop.MemberIdle)
		if grant <= 0 {
			grant = DefaultPoolGrant
		}
		ans := make([]byte, poolGrantLen)
		copy(ans, poolGrantMagic[:])
		binary.BigEndian.PutUint32(ans[4:], uint32(grant.Milliseconds()))
		fl.phase = phasePooled
		return evloop.Upstream{Wait: grant, Head: true, Consume: len(poolHello), Reply: ans}, nil
	}
	return s.hopHeader(fl, first)
}

// hopHeader reads, checks and serves the hop header at the start of first.
func (s *Server) hopHeader(fl *loopFlow, first []byte) (evloop.Upstream, error) {
	kr := s.keyring()
	if kr == nil {
		return evloop.Upstream{}, s.loopRefuse(fl, refuseAuth, fl.src, errors.New("no overlay keys"))
	}
	r := bytes.NewReader(first)
	h, err := hop.Read(r, kr, time.Now(), s.cfg.maxSkew())
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return evloop.Upstream{}, evloop.ErrMore // hop.Read only says so of a partial header
	}
	if err == nil {
		err = s.overlay.replay.Check(h)
	}
	if err != nil {
		return evloop.Upstream{}, s.loopRefuse(fl, refusalReason(err), fl.src, err)
	}
	fl.headLen = len(first) - r.Len()
	early := len(first) > fl.headLen
	if h.Hop == 0 || h.Route[h.Hop] != s.self {
		return evloop.Upstream{}, s.loopRefuse(fl, refuseNotSelf, fl.src, fmt.Errorf("route %v hop %d", h.Route, h.Hop))
	}
	if h.Lookup != "" { // a route completion request: the goroutine path
		fl.taken = h
		return evloop.Upstream{}, evloop.ErrTaken
	}
	if h.Hop < len(h.Route)-1 {
		next := h.Route[h.Hop+1]
		addr, ok := s.member(next)
		if !ok || next == s.self {
			return evloop.Upstream{}, s.loopRefuse(fl, refuseNotMember, fl.src, fmt.Errorf("next hop %q", next))
		}
		return s.loopForward(fl, h, next, addr)
	}
	t, err := ParseTarget(h.Target)
	if err != nil {
		return evloop.Upstream{}, s.loopRefuse(fl, refusePolicy, fl.src, err)
	}
	if !t.ip().IsValid() || h.Verdict { // a name to resolve, a verdict to answer: the goroutine path
		fl.taken = h
		return evloop.Upstream{}, evloop.ErrTaken
	}
	return s.loopExit(fl, h, t, early)
}

// loopForward sends a TrP's flow on to the next member with a new signed
// header, over a pooled connection or a nonblocking connect.
func (s *Server) loopForward(fl *loopFlow, h *hop.Header, next, addr string) (evloop.Upstream, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil && s.memberAddrAllowed(ap.String()) != nil { // refused by the goroutine path's dialHop (names are resolved there)
		fl.role, fl.taken = "", h
		return evloop.Upstream{}, evloop.ErrTaken
	}
	fwd := *h
	fwd.Hop++
	fwd.Time = time.Now()
	fl.role, fl.peer, fl.in.Size = roleTrP, next, h.Size
	b, err := fwd.Marshal(s.keyring())
	if err != nil {
		return evloop.Upstream{}, fmt.Errorf("marshal hop header: %w", err)
	}
	fl.header, fl.prefix = b, b
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("hop", "flow", flowString(h.FlowID), "role", roleTrP, "next", next, "route", h.Route)
	}
	if s.out.hopPool != nil {
		s.out.hopPool.learn(addr) // keeps addr pooled in an overlay too large to pool up front
	}
	if u, ok := s.loopPooled(s.out.hopPool, addr, b); ok {
		fl.pooled = true
		s.m.upstream.WithLabelValues(next, "pool").Inc()
		u.Consume = fl.headLen
		s.hopActive(fl)
		return u, nil
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil { // a member named by host name
		fl.role, fl.taken = "", h
		return evloop.Upstream{}, evloop.ErrTaken
	}
	fl.dialTo = ap
	u, err := s.hopUpstream(fl, true)
	if err == nil {
		s.hopActive(fl)
	}
	return u, err
}

// hopActive counts a hop flow that has its upstream as active.
func (s *Server) hopActive(fl *loopFlow) {
	fl.active = true
	s.m.roles[fl.role].active.Inc()
}

// loopExit connects an EgP's flow to its origin (an address) if the
// destination policy allows it, with a PROXY v2 header to origins that
// want one.
func (s *Server) loopExit(fl *loopFlow, h *hop.Header, t Target, early bool) (evloop.Upstream, error) {
	dst, err := s.origin.policy.resolve(context.Background(), s.origin.res, t)
	if errors.Is(err, errPolicy) {
		return evloop.Upstream{}, s.loopRefuse(fl, refusePolicy, h.Source, fmt.Errorf("target %s", t))
	}
	fl.role, fl.peer, fl.in.Target = roleEgP, "origin", t
	if err != nil {
		return evloop.Upstream{}, err
	}
	if listAllowsAny(s.origin.ppDest, t, dst.Addr()) {
		fl.prefix = hop.AppendPlainV2(nil, h.Source, h.Dest)
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("exit", "flow", flowString(h.FlowID), "role", roleEgP, "target", t.String())
	}
	if u, ok := s.loopPooled(s.out.originPool, dst.String(), fl.prefix); ok {
		fl.pooled = true
		fl.dialTo = dst
		s.m.upstream.WithLabelValues("origin", "pool").Inc()
		u.Consume = fl.headLen
		s.hopActive(fl)
		return u, nil
	}
	fl.dialTo = dst
	if s.out.originPool != nil {
		s.out.originPool.learn(dst.String())
	}
	u, err := s.hopUpstream(fl, early || len(fl.prefix) > 0)
	if err == nil {
		s.hopActive(fl)
	}
	return u, err
}

// hopUpstream starts a nonblocking connect to fl.dialTo for a hop flow
// (Fast Open if configured and there are bytes to send with the SYN).
func (s *Server) hopUpstream(fl *loopFlow, haveBytes bool) (evloop.Upstream, error) {
	tfo := s.cfg.Socket.FastOpen && haveBytes
	ufd, err := s.loopDial(fl.dialTo, tfo)
	if err != nil {
		return evloop.Upstream{}, fmt.Errorf("dial %s %s: %w", fl.peer, fl.dialTo, err)
	}
	s.m.peer(fl.peer).dial.Inc()
	return evloop.Upstream{FD: ufd, Prefix: fl.prefix, FastOpen: tfo, Consume: fl.headLen}, nil
}

// hopRetry implements Handler.Retry for hop flows: a pooled connection
// that failed before the flow's first byte reached it is replaced by a
// fresh dial, as dialHop does; a fresh dial that fails ends the flow
// (dial_error: a TrP or EgP has no other way to go).
func (s *Server) hopRetry(fl *loopFlow, failed error) (evloop.Upstream, error) {
	s.log.Debug("upstream failed before the first byte, retrying", "peer", fl.peer, "pooled", fl.pooled, "err", failed)
	if !fl.pooled {
		return evloop.Upstream{}, failed
	}
	fl.pooled = false
	if fl.role == roleTrP {
		addr, _ := s.member(fl.peer)
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return evloop.Upstream{}, fmt.Errorf("dial %s %s: %w", fl.peer, addr, err)
		}
		fl.dialTo = ap
	}
	return s.hopUpstream(fl, len(fl.prefix) > 0)
}

// loopRefuse counts and logs a refused hop flow (the loop resets it).
func (s *Server) loopRefuse(fl *loopFlow, reason string, client netip.AddrPort, err error) error {
	s.m.refusals.WithLabelValues(reason).Inc()
	s.refLog.refused(reason, client, err)
	fl.refused = true
	return errLoopRefused
}

// hopHeadEnded counts a hop flow that ended before its header was served,
// the way serveHop and memberPreamble do: a header that did not come whole
// in time is refused; a member's connection that closed while it waited
// idle (a pooled connection retired) ends quietly.
func (s *Server) hopHeadEnded(fl *loopFlow, o evloop.Outcome, err error) {
	if o == evloop.Aborted {
		return
	}
	if fl.phase == phaseIdle || fl.phase == phasePooled {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.loopRefuse(fl, refuseHeaderTimeout, fl.src, err)
		}
		return
	}
	reason := refusalReason(err)
	if errors.Is(err, evloop.ErrHeadTooLarge) {
		reason = refuseTooLarge
	}
	if err == nil {
		err = fmt.Errorf("hop flow ended %v before its header", o)
	}
	s.loopRefuse(fl, reason, fl.src, err)
}

// takeHop moves a hop flow whose header was read (fl.taken) to the
// goroutine path with the bytes that followed the header.
func (s *Server) takeHop(fl *loopFlow, h evloop.Handover) {
	c, err := evloop.FileConn(h.Down)
	if err != nil || fl.taken == nil || fl.headLen > len(h.ToUp) {
		if err == nil {
			resetClose(c)
			err = errors.New("no header")
		}
		s.log.Warn("take hop flow from loop", "err", err)
		s.loopRelease(fl.src, true)
		return
	}
	s.dispatch(handshakeJob{l: fl.l, c: c, src: fl.src, h: fl.taken, early: h.ToUp[fl.headLen:]})
}
