package relay

// Stage: event loops (service flows), through the unexported loopHandler;
// see the comment below.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/mosto-net/mosto/internal/evloop"
	"github.com/mosto-net/mosto/internal/hop"
	"golang.org/x/sys/unix"
)

// The fast path: service listeners are served by event loops
// (internal/evloop) instead of an accept goroutine. A loop accepts, asks
// Open where the flow goes, connects and copies a short flow without any
// goroutine; a flow that turns bulk is handed back (Handover) to the
// goroutine path, which splices. Flows the loops cannot open without
// blocking (a host name to resolve, a remote lookup) are taken over at
// once by the goroutine path
// (evloop.ErrTaken), exactly as if the accept goroutine had accepted them.

// loopFlow is a service or hop flow carried by a loop.
type loopFlow struct {
	l      *listener
	fd     int // the client's socket
	src    netip.AddrPort
	in     Intent
	role   role   // roleInP; a hop flow's roleTrP/roleEgP once its header is read
	active bool   // counted in the role's active flows
	peer   string // metrics label of the upstream: a member or "origin"
	hop    bool   // the upstream is the first hop of a chain
	header []byte // the hop header sent to it
	pooled bool
	// A Fast Open dial waits for the client's first bytes (Dial); a hop
	// flow's retry dials here again with prefix.
	dialTo netip.AddrPort
	prefix []byte
	// Hop flows (hoploop_linux.go).
	phase   hopPhase
	refused bool        // counted as a refusal already
	headLen int         // bytes of the hop header (and pool hello) read
	taken   *hop.Header // the header of a flow given to the goroutine path
}

// loopHandler is the evloop.Handler of a Server: the loops call it to
// open, dial, retry, end and hand over flows. It is unexported so these
// callbacks are not part of Server's API.
type loopHandler struct{ s *Server }

var _ evloop.Handler = loopHandler{}

// errLoopRefused ends a connection the handler refused (already counted).
var errLoopRefused = errors.New("refused")

// loopCount returns the number of event loops to run (0: none).
func (s *Server) loopCount() int {
	switch n := s.cfg.Loops; {
	case n < 0:
		return 0
	case n == 0:
		return runtime.GOMAXPROCS(0)
	default:
		return n
	}
}

// startLoops starts the loops and gives them every service listener; the
// listeners they serve are marked so no accept goroutine runs for them.
func (s *Server) startLoops() error {
	n := s.loopCount()
	if n == 0 {
		return nil
	}
	var svc []*listener
	for _, l := range s.accept.listeners {
		if l.kind == kindService || l.kind == kindHop {
			svc = append(svc, l)
		}
	}
	if len(svc) == 0 {
		return nil
	}
	ls, err := evloop.Start(evloop.Config{
		Loops:          n,
		Idle:           s.flows.idle,
		ConnectTimeout: s.out.dialer.Timeout,
		BufSize:        smallCopy,
		Bulk:           true,
	}, loopHandler{s}, s.log)
	if err != nil {
		return err
	}
	for _, l := range svc {
		if err := s.loopListen(ls, l, n); err != nil {
			ls.Close()
			return fmt.Errorf("listener %s: %w", l.ln.Addr(), err)
		}
		l.looped = true
	}
	s.loops.Store(ls)
	s.log.Info("event loops serving service and hop listeners", "loops", n)
	return nil
}

// loopListen gives listener l to the loops. With socket.reuseport and more
// than one loop, each loop gets a listening socket of its own (l's and n-1
// more bound to its address), so the kernel hands each connection to one
// loop and wakes that one alone; otherwise every loop shares l's socket,
// and each connection wakes every idle loop (evloop.ListenEach). A socket
// that cannot be added (an activated listener bound without SO_REUSEPORT)
// falls back to sharing. The loops hold the sockets through duplicates:
// l.ln and the extra listeners are closed here, which also takes them out
// of the runtime's poller (it would otherwise wake for every connection
// nobody accepts there).
func (s *Server) loopListen(ls *evloop.Loops, l *listener, n int) error {
	lns := []*net.TCPListener{l.ln}
	if n > 1 && s.cfg.reusePort() {
		lc := net.ListenConfig{Control: s.listenControl()}
		for len(lns) < n {
			ln, err := lc.Listen(context.Background(), "tcp", l.ln.Addr().String())
			if err != nil {
				s.log.Info("event loops share a listening socket", "listener", l.ln.Addr().String(), "err", err)
				break
			}
			lns = append(lns, ln.(*net.TCPListener))
		}
		if len(lns) < n {
			for _, ln := range lns[1:] {
				ln.Close()
			}
			lns = lns[:1]
		}
	}
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	fds := make([]int, 0, len(lns))
	for _, ln := range lns {
		rc, err := ln.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		cerr := rc.Control(func(fd uintptr) {
			// Accepted sockets inherit TCP_NODELAY from the listener: one
			// system call per listener instead of one per flow.
			if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY, boolInt(s.noDelay())); err != nil {
				serr = fmt.Errorf("set TCP_NODELAY: %w", err)
			}
			fds = append(fds, int(fd))
		})
		if err := errors.Join(cerr, serr); err != nil {
			return err
		}
	}
	// The descriptors stay valid until the deferred Close: evloop
	// duplicates them first.
	if len(fds) == 1 {
		return ls.Listen(fds[0], l)
	}
	return ls.ListenEach(fds, l)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// noDelay is the TCP_NODELAY setting of flow sockets (Go's default: on).
func (s *Server) noDelay() bool {
	nd := s.cfg.Socket.NoDelay
	return nd == nil || *nd
}

// Open implements evloop.Handler: admission, then the chain or origin of a
// service flow, or the wait for a hop flow's header.
func (lh loopHandler) Open(tag any, fd int, src netip.AddrPort) (evloop.Upstream, any, error) {
	s := lh.s
	l := tag.(*listener)
	isHop := l.kind == kindHop
	if reason := s.accept.limits.acquire(src.Addr(), isHop); reason != "" {
		s.m.refusals.WithLabelValues(reason).Inc()
		s.refLog.refused(reason, src, nil)
		return evloop.Upstream{}, nil, errLoopRefused
	}
	s.flows.wg.Add(1)
	if ka := s.cfg.Socket.KeepAlive; ka > 0 {
		setKeepAlive(fd, time.Duration(ka))
	}
	if isHop {
		return s.openHop(l, fd, src)
	}
	t, err := l.origin, l.originErr
	if err != nil { // Validate checked it
		s.m.refusals.WithLabelValues(refuseEntryProto).Inc()
		s.loopRelease(src, false)
		return evloop.Upstream{}, nil, errLoopRefused
	}
	fl := &loopFlow{l: l, fd: fd, src: src, role: roleInP, in: Intent{Target: t, Size: int64(l.service.Size), Client: src}}
	s.learnSize(&fl.in, l.service.Name, nil)
	u, err := s.loopUpstream(fl)
	if errors.Is(err, errLoopTake) {
		return evloop.Upstream{}, nil, s.takeFromLoop(l, fd, src)
	}
	if err != nil {
		s.loopOpenError(fl, err)
		if !errors.Is(err, errPolicy) {
			s.endFlow(roleInP, outcomeDialError)
		}
		s.loopRelease(src, false)
		return evloop.Upstream{}, nil, err
	}
	s.m.roles[roleInP].active.Inc()
	fl.active = true
	return u, fl, nil
}

// errLoopTake: the goroutine path must serve this flow.
var errLoopTake = errors.New("served by the goroutine path")

// loopUpstream picks the flow's upstream like open does, without blocking:
// a pooled connection or a nonblocking connect to an address.
func (s *Server) loopUpstream(fl *loopFlow) (evloop.Upstream, error) {
	if !fl.in.Target.ip().IsValid() {
		return evloop.Upstream{}, errLoopTake // a name to resolve (EgP or direct)
	}
	egp := s.origin.egress.lookup(fl.in.Target)
	if egp == s.self {
		s.m.directFor("self_egress").Inc()
		return s.loopOriginDial(fl, false)
	}
	if s.cfg.LoP != "" {
		return evloop.Upstream{}, errLoopTake
	}
	route, reason := s.route(egp, fl.in.Size)
	if route == nil {
		s.m.directFor(reason).Inc()
		return s.loopOriginDial(fl, false)
	}
	next := route[1]
	addr, _ := s.member(next)
	if ap, err := netip.ParseAddrPort(addr); err == nil && s.memberAddrAllowed(ap.String()) != nil {
		return evloop.Upstream{}, errLoopTake // dialHop refuses it and the flow goes direct
	}
	if err := s.localAddr(fl); err != nil {
		return evloop.Upstream{}, err
	}
	h := &hop.Header{
		Source: fl.in.Client,
		Dest:   fl.in.Local,
		Route:  route,
		Hop:    1,
		Target: fl.in.Target.String(),
		Size:   fl.in.Size,
		Time:   time.Now(),
	}
	rand.Read(h.FlowID[:])
	b, err := h.Marshal(s.keyring())
	if err != nil {
		return evloop.Upstream{}, fmt.Errorf("marshal hop header: %w", err)
	}
	fl.peer, fl.hop, fl.header = next, true, b
	if s.out.hopPool != nil {
		s.out.hopPool.learn(addr)
	}
	if u, ok := s.loopPooled(s.out.hopPool, addr, b); ok {
		fl.pooled = true
		s.m.upstream.WithLabelValues(next, "pool").Inc()
		return u, nil
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return evloop.Upstream{}, errLoopTake
	}
	if s.cfg.Socket.FastOpen {
		fl.dialTo, fl.prefix = ap, b
		return s.fastOpenWait(fl)
	}
	ufd, err := s.loopDial(ap, false)
	if err != nil {
		// The first hop is down: serve the flow directly rather than not at all.
		s.m.directFor("hop_unreachable").Inc()
		fl.peer, fl.hop, fl.header = "", false, nil
		return s.loopOriginDial(fl, false)
	}
	s.m.peer(next).dial.Inc()
	return evloop.Upstream{FD: ufd, Prefix: b, Retry: true}, nil
}

// loopOriginDial opens the flow's connection to its origin. With plain it
// never asks for the goroutine path's Fast Open dial (a retry cannot leave
// the loop).
func (s *Server) loopOriginDial(fl *loopFlow, plain bool) (evloop.Upstream, error) {
	t := fl.in.Target
	if !t.ip().IsValid() {
		return evloop.Upstream{}, errLoopTake // a name to resolve
	}
	dst, err := s.origin.policy.resolve(context.Background(), s.origin.res, t)
	if err != nil {
		return evloop.Upstream{}, err
	}
	var prefix []byte
	if listAllowsAny(s.origin.ppDest, t, dst.Addr()) {
		if err := s.localAddr(fl); err != nil {
			return evloop.Upstream{}, err
		}
		prefix = hop.AppendPlainV2(nil, fl.in.Client, fl.in.Local)
	}
	fl.peer = "origin"
	if s.out.originPool != nil {
		if u, ok := s.loopPooled(s.out.originPool, dst.String(), prefix); ok {
			fl.pooled = true
			s.m.upstream.WithLabelValues("origin", "pool").Inc()
			return u, nil
		}
	}
	if s.cfg.Socket.FastOpen && !plain {
		fl.dialTo, fl.prefix = dst, prefix
		return s.fastOpenWait(fl)
	}
	ufd, err := s.loopDial(dst, false)
	if err != nil {
		return evloop.Upstream{}, err
	}
	if s.out.originPool != nil {
		s.out.originPool.learn(dst.String())
	}
	s.m.peer("origin").dial.Inc()
	return evloop.Upstream{FD: ufd, Prefix: prefix}, nil
}

// localAddr fills in the address the client connected to.
func (s *Server) localAddr(fl *loopFlow) error {
	if fl.in.Local.IsValid() {
		return nil
	}
	if a := addrPort(fl.l.ln.Addr()); a.IsValid() && !a.Addr().IsUnspecified() {
		fl.in.Local = a
		return nil
	}
	a, err := evloop.LocalAddr(fl.fd)
	if err != nil {
		return err
	}
	fl.in.Local = a
	return nil
}

// loopPooled takes a pooled connection to addr from p for a loop, if one
// is ready.
func (s *Server) loopPooled(p *connPool, addr string, prefix []byte) (evloop.Upstream, bool) {
	if p == nil {
		return evloop.Upstream{}, false
	}
	c := p.get(addr)
	if c == nil {
		return evloop.Upstream{}, false
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return evloop.Upstream{}, false
	}
	fd := -1
	rc.Control(func(x uintptr) { fd = int(x) })
	if s.cfg.Socket.NoDelay != nil {
		c.SetNoDelay(*s.cfg.Socket.NoDelay)
	}
	// Retry: a pooled connection the peer closed meanwhile fails the first
	// write; the flow then dials afresh.
	return evloop.Upstream{FD: fd, Conn: c, Connected: true, Prefix: prefix, Retry: true}, true
}

// fastOpenWait has the loop wait up to timeouts.early for the client's
// first bytes before the Fast Open dial (Dial), so they ride in its SYN, as
// the goroutine path does.
func (s *Server) fastOpenWait(fl *loopFlow) (evloop.Upstream, error) {
	if d := s.cfg.earlyWait(); d > 0 {
		return evloop.Upstream{Wait: d}, nil
	}
	return loopHandler{s}.Dial(fl, nil)
}

// Dial implements evloop.Handler: the Fast Open dial of a flow that waited
// for its first bytes. A first hop that fails goes direct (Retry).
func (lh loopHandler) Dial(state any, first []byte) (evloop.Upstream, error) {
	s := lh.s
	fl := state.(*loopFlow)
	if fl.l.kind == kindHop {
		return s.hopDial(fl, first)
	}
	// With nothing to send (no header, a silent client) a Fast Open SYN
	// would wait for bytes that may never come: connect now instead.
	tfo := len(fl.prefix) > 0 || len(first) > 0
	ufd, err := s.loopDial(fl.dialTo, tfo)
	if err != nil {
		if fl.hop {
			s.m.directFor("hop_unreachable").Inc()
			fl.hop, fl.peer, fl.header = false, "", nil
			return s.loopOriginDial(fl, true)
		}
		return evloop.Upstream{}, err
	}
	s.m.peer(fl.peer).dial.Inc()
	if !fl.hop && s.out.originPool != nil {
		s.out.originPool.learn(fl.dialTo.String())
	}
	return evloop.Upstream{FD: ufd, Prefix: fl.prefix, FastOpen: tfo, Retry: fl.hop}, nil
}

// loopDial starts a nonblocking connect with the configured socket options
// (fastOpen: TCP_FASTOPEN_CONNECT, the SYN leaves with the first write).
func (s *Server) loopDial(addr netip.AddrPort, fastOpen bool) (int, error) {
	return evloop.Dial(addr, func(fd int) error {
		if err := s.cfg.Socket.apply(fd); err != nil {
			return err
		}
		if fastOpen {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1); err != nil {
				return fmt.Errorf("set TCP_FASTOPEN_CONNECT: %w", err)
			}
		}
		if err := evloop.SetNoDelay(fd, s.noDelay()); err != nil {
			return err
		}
		if ka := s.cfg.Socket.KeepAlive; ka > 0 {
			setKeepAlive(fd, time.Duration(ka))
		}
		return nil
	})
}

func setKeepAlive(fd int, d time.Duration) {
	secs := max(int(d/time.Second), 1)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs)
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs)
}

// Retry implements evloop.Handler: the first hop or a pooled connection
// failed before the flow's first byte reached it. A stale pooled hop is
// dialed afresh, a first hop that is down is skipped (the flow goes
// direct, as on the goroutine path).
func (lh loopHandler) Retry(state any, failed error) (evloop.Upstream, error) {
	s := lh.s
	fl := state.(*loopFlow)
	if fl.l.kind == kindHop {
		return s.hopRetry(fl, failed)
	}
	s.log.Debug("upstream failed before the first byte, retrying", "peer", fl.peer, "pooled", fl.pooled, "err", failed)
	wasPooled := fl.pooled
	fl.pooled = false
	if fl.hop && wasPooled {
		addr, _ := s.member(fl.peer)
		if ap, err := netip.ParseAddrPort(addr); err == nil {
			if ufd, err := s.loopDial(ap, false); err == nil {
				s.m.peer(fl.peer).dial.Inc()
				return evloop.Upstream{FD: ufd, Prefix: fl.header, Retry: true}, nil
			}
		}
	}
	if fl.hop {
		s.m.directFor("hop_unreachable").Inc()
		fl.hop, fl.peer, fl.header = false, "", nil
	}
	u, err := s.loopOriginDial(fl, true)
	if err != nil {
		s.loopOpenError(fl, err)
	}
	return u, err
}

// Done implements evloop.Handler.
func (lh loopHandler) Done(state any, o evloop.Outcome, st evloop.Stats, err error) {
	s := lh.s
	fl := state.(*loopFlow)
	isHop := fl.l.kind == kindHop
	if fl.role == "" { // a hop flow that ended before its header was served
		if !fl.refused {
			s.hopHeadEnded(fl, o, err)
		}
		s.loopRelease(fl.src, isHop)
		return
	}
	rm := s.m.roles[fl.role]
	if fl.active {
		rm.active.Dec()
	}
	rm.up.Add(float64(st.Up))
	rm.down.Add(float64(st.Down))
	if st.Connect > 0 && fl.peer != "" {
		s.m.peer(fl.peer).connect.Observe(st.Connect.Seconds())
	}
	outcome := outcomeOK
	switch o {
	case evloop.Reset:
		outcome = outcomeReset
	case evloop.Idle:
		outcome = outcomeIdle
	case evloop.ConnectFailed:
		outcome = outcomeDialError
	case evloop.Aborted:
		outcome = outcomeAborted
	}
	if err != nil {
		s.log.Debug("flow ended", "client", fl.src.String(), "target", fl.in.Target.String(), "outcome", outcome, "err", err)
	}
	if outcome == outcomeOK {
		s.sizes.observe(fl.in.learn, st.Down)
	}
	if !errors.Is(err, errPolicy) && !fl.refused { // a refusal, counted as such
		s.endFlow(fl.role, outcome)
	}
	s.loopRelease(fl.src, isHop)
}

// loopRelease releases what Open took for a flow (hop: from the hop
// listener).
func (s *Server) loopRelease(src netip.AddrPort, hop bool) {
	s.accept.limits.release(src.Addr(), hop)
	s.flows.wg.Done()
}

// loopOpenError counts a flow whose upstream could not be opened (the
// loop resets the client).
func (s *Server) loopOpenError(fl *loopFlow, err error) {
	if errors.Is(err, errPolicy) {
		s.m.refusals.WithLabelValues(refusePolicy).Inc()
		s.refLog.refused(refusePolicy, fl.src, fmt.Errorf("target %s", fl.in.Target))
	} else {
		s.log.Debug("open flow", "target", fl.in.Target.String(), "client", fl.src.String(), "err", err)
	}
}

// takeFromLoop moves an accepted socket to the goroutine path (admission
// is done: the handshake worker serves it from the entry protocol on).
func (s *Server) takeFromLoop(l *listener, fd int, src netip.AddrPort) error {
	c, err := evloop.FileConn(fd)
	if err != nil {
		evloop.ResetClose(fd)
		s.log.Warn("take flow from loop", "err", err)
		s.loopRelease(src, false)
		return evloop.ErrTaken
	}
	s.dispatch(handshakeJob{l: l, c: c, src: src})
	return evloop.ErrTaken
}

// Handover implements evloop.Handler: a bulk flow continues on the
// goroutine path, which splices.
func (lh loopHandler) Handover(state any, h evloop.Handover) {
	s := lh.s
	fl := state.(*loopFlow)
	if h.Up < 0 { // a hop flow Dial gave up (ErrTaken)
		s.takeHop(fl, h)
		return
	}
	rm := s.m.roles[fl.role]
	if fl.active {
		rm.active.Dec()
	}
	rm.up.Add(float64(h.Stats.Up))
	rm.down.Add(float64(h.Stats.Down))
	if h.Stats.Connect > 0 && fl.peer != "" {
		s.m.peer(fl.peer).connect.Observe(h.Stats.Connect.Seconds())
	}
	down, err := evloop.FileConn(h.Down)
	var up *net.TCPConn
	if err == nil {
		if tc, ok := h.UpConn.(*net.TCPConn); ok {
			up = tc
		} else if up, err = evloop.FileConn(h.Up); err != nil {
			resetClose(down)
		}
	}
	if err != nil {
		evloop.ResetClose(h.Down)
		if h.UpConn != nil {
			h.UpConn.Close()
		} else {
			evloop.ResetClose(h.Up)
		}
		s.log.Warn("hand bulk flow over", "err", err)
		s.endFlow(fl.role, outcomeReset)
		s.loopRelease(fl.src, fl.l.kind == kindHop)
		return
	}
	s.track(down)
	s.track(up)
	go s.bulkFlow(fl, down, up, h.ToUp, h.ToDown, h.Stats.Down)
}

// bulkFlow relays a flow handed over by a loop: first what the loop still
// held, then the goroutine path's copy; delivered is what the loop gave
// the client already.
func (s *Server) bulkFlow(fl *loopFlow, down, up *net.TCPConn, toUp, toDown []byte, delivered int64) {
	defer s.endConn(fl.l, down, fl.src)
	rm := s.m.roles[fl.role]
	for _, w := range []struct {
		c *net.TCPConn
		b []byte
	}{{up, toUp}, {down, toDown}} {
		if len(w.b) == 0 {
			continue
		}
		w.c.SetWriteDeadline(time.Now().Add(s.out.dialer.Timeout))
		if _, err := w.c.Write(w.b); err != nil {
			s.untrack(up)
			resetClose(up)
			resetClose(down)
			s.endFlow(fl.role, outcomeReset)
			return
		}
		w.c.SetWriteDeadline(time.Time{})
	}
	rm.up.Add(float64(len(toUp)))
	rm.down.Add(float64(len(toDown)))
	s.relay(fl.role, down, up, fl.in.learn, delivered+int64(len(toDown)))
}
