package relay

// Stage: entry (InP). A client of a service listener, SOCKS5 or HTTP CONNECT
// entry becomes an Intent; open routes it to the first hop of its chain or
// to its origin (serveEntry, open, awaitVerdict).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/httpconnect"
	"github.com/mosto-net/mosto/internal/socks5"
)

// Intent is where a flow accepted by an entry wants to go. Every entry
// (service, SOCKS5, HTTP CONNECT, later transparent interception) reduces
// a client connection to one.
type Intent struct {
	Target Target
	Size   int64          // transfer-size hint, picks the chain's size class
	Client netip.AddrPort // the client's address
	Local  netip.AddrPort // the address the client connected to
	Route  []string       // a chain pinned by the client (pin.go); nil: looked up

	learn sizeKeys // where the flow's size is learned (sizelearn.go)
	// verdict: the entry replies to its client only after the EgP reached
	// the origin (SOCKS5, HTTP CONNECT): open waits for the EgP's verdict.
	verdict bool
}

// learnSize sets in's learning keys and replaces its static size hint by
// the learned one, if any.
func (s *Server) learnSize(in *Intent, service string, early []byte) {
	in.learn = keysOf(service, in.Target, early)
	var src hintSource
	in.Size, src = s.sizes.hint(in.learn, in.Size)
	s.m.sizeHints[src].Inc()
}

// serveEntry runs an entry handshake and opens the upstream side; it
// returns the upstream connection (nil: refused or failed) and the keys the
// flow's size is learned under.
func (s *Server) serveEntry(l *listener, c *net.TCPConn, src netip.AddrPort) (*net.TCPConn, sizeKeys) {
	in := Intent{Client: src, Local: addrPort(c.LocalAddr())}
	switch l.kind {
	case kindService:
		t, err := l.origin, l.originErr
		if err != nil { // Validate checked it; keep serving anyway
			s.refuse(refuseEntryProto, c, src, err)
			return nil, sizeKeys{}
		}
		in.Target, in.Size = t, int64(l.service.Size)
		// The client's first bytes, if already here, leave with the hop
		// header (in the SYN with Fast Open).
		early := s.clientFirstBytes(c)
		s.learnSize(&in, l.service.Name, early)
		up, err := s.open(in, early)
		if err != nil {
			s.entryFailed(c, in, err)
			return nil, sizeKeys{}
		}
		s.m.roles[roleInP].up.Add(float64(len(early)))
		return up, in.learn
	case kindSOCKS5:
		return s.serveSOCKS5(l, c, &in), in.learn
	case kindConnect:
		return s.serveConnect(l, c, &in), in.learn
	case kindTProxy:
		return s.serveTProxy(l, c, in)
	}
	return nil, sizeKeys{}
}

// entryFailed counts a flow whose upstream could not be opened.
func (s *Server) entryFailed(c *net.TCPConn, in Intent, err error) {
	if errors.Is(err, errPolicy) {
		s.refuse(refusePolicy, c, in.Client, fmt.Errorf("target %s", in.Target))
		return
	}
	s.log.Debug("open flow", "target", in.Target.String(), "client", in.Client.String(), "err", err)
	s.endFlow(roleInP, outcomeDialError)
	resetClose(c)
}

func (s *Server) serveSOCKS5(l *listener, c *net.TCPConn, in *Intent) *net.TCPConn {
	cfg := socks5.Config{
		Timeout: s.accept.header,
		Allow: func(target string) bool {
			t, err := ParseTarget(target)
			return err == nil && listAllows(l.allow, t)
		},
	}
	if users := s.cfg.SOCKS5.Users; len(users) > 0 {
		cfg.Auth = func(user, password string) bool {
			want, ok := users[user]
			return socks5.CheckPassword(password, want) && ok
		}
	}
	req, err := socks5.Handshake(s.flows.ctx, c, cfg)
	if err != nil {
		reason := refuseEntryProto
		switch {
		case errors.Is(err, socks5.ErrAuth), errors.Is(err, socks5.ErrNoMethod):
			reason = refuseEntryAuth
		case errors.Is(err, socks5.ErrNotAllowed):
			reason = refuseEntryAllow
		case errors.Is(err, os.ErrDeadlineExceeded):
			reason = refuseHeaderTimeout
		}
		s.refuse(reason, c, in.Client, err)
		return nil
	}
	t, err := ParseTarget(req.Target)
	if err != nil {
		socks5.Reply(c, socks5.AddrTypeNotSupported, netip.AddrPort{})
		s.refuse(refuseEntryProto, c, in.Client, err)
		return nil
	}
	in.Target, in.Size, in.verdict = t, int64(s.cfg.SOCKS5.Size), true
	s.learnSize(in, "", nil)
	up, err := s.open(*in, nil)
	if err != nil {
		code := socks5.ReplyCode(err)
		var ve *verdictError
		switch {
		case errors.As(err, &ve):
			code = ve.code
		case errors.Is(err, errPolicy):
			code = socks5.NotAllowed
		}
		c.SetWriteDeadline(time.Now().Add(s.accept.header))
		socks5.Reply(c, code, netip.AddrPort{})
		s.entryFailed(c, *in, err)
		return nil
	}
	c.SetWriteDeadline(time.Now().Add(s.accept.header))
	if err := socks5.Reply(c, socks5.Succeeded, in.Local); err != nil {
		s.untrack(up)
		resetClose(up)
		s.endFlow(roleInP, outcomeEntry)
		resetClose(c)
		return nil
	}
	c.SetWriteDeadline(time.Time{})
	return up
}

func (s *Server) serveConnect(l *listener, c *net.TCPConn, in *Intent) *net.TCPConn {
	c.SetDeadline(time.Now().Add(s.accept.header))
	br := bufio.NewReaderSize(deadlineReader{c}, 4096)
	target, hdr, err := httpconnect.ReadRequest(br, httpconnect.Limits{})
	if err != nil {
		reason := refuseEntryProto
		if errors.Is(err, os.ErrDeadlineExceeded) {
			reason = refuseHeaderTimeout
		} else {
			httpconnect.WriteReply(c, httpconnect.StatusFor(err))
		}
		s.refuse(reason, c, in.Client, err)
		return nil
	}
	if users := s.cfg.HTTPConnect.Users; len(users) > 0 {
		user, pass, ok := httpconnect.ProxyAuth(hdr)
		want, known := users[user]
		if !ok || !known || !socks5.CheckPassword(pass, want) {
			httpconnect.WriteReply(c, http.StatusProxyAuthRequired)
			s.refuse(refuseEntryAuth, c, in.Client, fmt.Errorf("user %q", user))
			return nil
		}
	}
	t, err := ParseTarget(target)
	if err != nil {
		httpconnect.WriteReply(c, http.StatusBadRequest)
		s.refuse(refuseEntryProto, c, in.Client, err)
		return nil
	}
	if !listAllows(l.allow, t) {
		httpconnect.WriteReply(c, http.StatusForbidden)
		s.refuse(refuseEntryAllow, c, in.Client, fmt.Errorf("target %s", t))
		return nil
	}
	if v := hdr.Get(RouteHeader); v != "" {
		if in.Route, err = s.pinnedRoute(v); err != nil {
			httpconnect.WriteReply(c, http.StatusBadRequest)
			s.refuse(refuseEntryProto, c, in.Client, err)
			return nil
		}
	}
	in.Target, in.Size, in.verdict = t, int64(s.cfg.HTTPConnect.Size), true
	s.learnSize(in, "", nil)
	up, err := s.open(*in, nil)
	if err != nil {
		code := http.StatusBadGateway
		var ve *verdictError
		switch {
		case errors.Is(err, errRoute):
			code = http.StatusBadRequest
		case errors.Is(err, errPolicy):
			code = http.StatusForbidden
		case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ve) && ve.code == socks5.TTLExpired:
			code = http.StatusGatewayTimeout
		}
		httpconnect.WriteReply(c, code)
		s.entryFailed(c, *in, err)
		return nil
	}
	if err := httpconnect.WriteReply(c, http.StatusOK); err == nil && br.Buffered() > 0 {
		// Bytes the client sent right after its request head (say a TLS
		// ClientHello) go first.
		early, _ := br.Peek(br.Buffered())
		up.SetWriteDeadline(time.Now().Add(s.accept.header))
		_, err = up.Write(early)
		up.SetWriteDeadline(time.Time{})
		if err != nil {
			s.untrack(up)
			resetClose(up)
			s.endFlow(roleInP, outcomeReset)
			resetClose(c)
			return nil
		}
	}
	c.SetDeadline(time.Time{})
	return up
}

// open connects the upstream side of a flow for the InP: through the chain
// to the EgP closest to the target, or straight to the origin when this FEP
// is the EgP or no chain is known.
// early holds client bytes already read from the client's connection:
// they are sent first on the returned connection.
func (s *Server) open(in Intent, early []byte) (*net.TCPConn, error) {
	if in.Route != nil {
		return s.openPinned(in, early)
	}
	egp := s.origin.egress.lookup(in.Target)
	if egp == s.self {
		s.m.directFor("self_egress").Inc()
		return s.dialOriginEarly(in, early)
	}
	if s.cfg.LoP != "" { // a remote lookup proxy completes the route (lookup.go)
		return s.openViaLoP(in, egp, early)
	}
	route, reason := s.route(egp, in.Size)
	if route == nil {
		s.m.directFor(reason).Inc()
		return s.dialOriginEarly(in, early)
	}
	next := route[1]
	addr, _ := s.member(next)
	h := &hop.Header{
		Source:  in.Client,
		Dest:    in.Local,
		Route:   route,
		Hop:     1,
		Target:  in.Target.String(),
		Size:    in.Size,
		Time:    time.Now(),
		Verdict: in.verdict,
	}
	rand.Read(h.FlowID[:])
	log := s.log.With("flow", flowString(h.FlowID))
	up, err := s.dialHop(next, addr, h, early)
	if err != nil {
		// The first hop is down: serve the flow directly rather than not at all.
		log.Debug("first hop unreachable, going direct", "next", next, "err", err)
		s.m.directFor("hop_unreachable").Inc()
		return s.dialOriginEarly(in, early)
	}
	if err := s.awaitVerdict(up, in); err != nil {
		return nil, err
	}
	if log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug("flow", "role", roleInP, "client", in.Client.String(), "target", in.Target.String(), "route", route)
	}
	return up, nil
}

// dialOriginEarly connects to the origin for in and sends early first.
func (s *Server) dialOriginEarly(in Intent, early []byte) (*net.TCPConn, error) {
	up, err := s.dialOrigin(in.Target, in.Client, in.Local)
	if err != nil || len(early) == 0 {
		return up, err
	}
	up.SetWriteDeadline(time.Now().Add(s.out.dialer.Timeout))
	if _, err := up.Write(early); err != nil {
		s.untrack(up)
		resetClose(up)
		return nil, fmt.Errorf("send early bytes to %s: %w", in.Target, err)
	}
	up.SetWriteDeadline(time.Time{})
	return up, nil
}

// clientFirstBytes returns the client's bytes already queued on c. With
// Fast Open it first waits up to the early timeout for them, so they ride
// in the SYNs along the chain instead of following one handshake behind.
func (s *Server) clientFirstBytes(c *net.TCPConn) []byte {
	if d := s.cfg.earlyWait(); d > 0 {
		if rc, err := c.SyscallConn(); err == nil {
			c.SetReadDeadline(time.Now().Add(d))
			waitReadable(rc)
			c.SetReadDeadline(time.Time{})
		}
	}
	return s.earlyBytes(c)
}

// earlyMax bounds the client bytes sent along with a hop header.
const earlyMax = 16 << 10

// queued reads and returns up to max bytes already received on c, without
// waiting (nil when none). It reads with MSG_DONTWAIT rather than asking
// SIOCINQ, which answers 0 while a Fast Open connection is still in
// SYN_RECV although its SYN's data is there.
func queued(c *net.TCPConn, max int) []byte {
	return queuedInto(c, make([]byte, max))
}

// queuedInto reads bytes already received on c into b, without waiting,
// and returns them (nil when none).
func queuedInto(c *net.TCPConn, b []byte) []byte {
	n := readQueued(c, b)
	if n == 0 {
		return nil
	}
	return b[:n]
}

// earlyBytes is queued(c, earlyMax) through a pooled buffer: only the
// bytes read are allocated.
func (s *Server) earlyBytes(c *net.TCPConn) []byte {
	bp := s.flows.bufs.Get().(*[]byte)
	defer s.flows.bufs.Put(bp)
	b := queuedInto(c, (*bp)[:min(earlyMax, len(*bp))])
	if b == nil {
		return nil
	}
	return bytes.Clone(b)
}

// route returns the chain from this FEP to egp for a transfer of size
// bytes, or nil and why there is none usable.
func (s *Server) route(egp string, size int64) ([]string, string) {
	cb := s.overlay.chains.Load()
	if cb == nil || s.keyring() == nil {
		return nil, "no_chain"
	}
	e, ok := cb.src.Lookup(s.self, egp, size)
	if !ok {
		return nil, "no_chain"
	}
	p := e.Path
	if len(p) < 2 || p[0] != s.self || p[len(p)-1] != egp || len(p) > hop.MaxRoute {
		return nil, "bad_chain"
	}
	if _, ok := s.member(p[1]); !ok {
		return nil, "bad_chain"
	}
	return p, ""
}

// verdictError is an EgP's refusal of a flow, as its verdict said: code is
// a SOCKS5 reply code.
type verdictError struct{ code byte }

func (e *verdictError) Error() string {
	return fmt.Sprintf("the EgP did not reach the destination (SOCKS5 reply code %d)", e.code)
}

// Unwrap makes a refusal by the EgP's destination policy an errPolicy.
func (e *verdictError) Unwrap() error {
	if e.code == socks5.NotAllowed {
		return errPolicy
	}
	return nil
}

// awaitVerdict reads the EgP's verdict from up when in asked for one; on
// any error up is closed. The wait is bounded by the EgP's own dial timeout
// plus the header timeout for the way through the chain.
func (s *Server) awaitVerdict(up *net.TCPConn, in Intent) error {
	if !in.verdict {
		return nil
	}
	up.SetReadDeadline(time.Now().Add(s.out.dialer.Timeout + s.accept.header))
	var v [hop.VerdictLen]byte
	_, err := io.ReadFull(up, v[:])
	up.SetReadDeadline(time.Time{})
	var code byte
	if err == nil {
		code, err = hop.ParseVerdict(v)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("no verdict from the chain: %w", err)
	case code != socks5.Succeeded:
		err = &verdictError{code}
	}
	if err != nil {
		s.untrack(up)
		resetClose(up)
	}
	return err
}
