package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mosto-net/mosto/internal/evloop"
	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
)

// ChainSource answers chain lookups; *pathcomp.Index satisfies it. The
// controller replaces it at run time with SetChains.
type ChainSource interface {
	Lookup(from, to string, size int64) (pathcomp.ChainEntry, bool)
}

// MemberSource answers the current member list (FEP id -> hop address);
// the controller agent satisfies it. The map must not be modified.
type MemberSource interface {
	Members() map[string]string
}

// KeySource answers the current overlay keyring (nil: keep the configured
// one); the controller agent satisfies it.
type KeySource interface {
	Keys() *hop.Keyring
}

// Server is one proxy daemon. Create it with New, then call Run once (or
// Close if Run is never called). Its fields are grouped by the stage that
// owns them; each stage lives in its own file (see doc.go).
type Server struct {
	cfg  *Config
	log  *slog.Logger
	self string // this FEP's id

	// Observability (metrics.go, limit.go, lookup.go).
	m       *metrics
	refLog  *rateLog      // rate-limited refusal log
	lookups lookupMetrics // remote chain lookups

	overlay overlayState                 // members, keys, chains (overlay.go)
	origin  originPolicy                 // where flows may leave the overlay (dial.go)
	out     outbound                     // dialers and pools (dial.go)
	accept  acceptState                  // listeners and admission (accept.go)
	workers workerState                  // handshake workers (workers.go)
	flows   flowState                    // every running flow (lifecycle.go, copy.go)
	admin   adminHTTP                    // metrics and health HTTP (admin.go)
	loops   atomic.Pointer[evloop.Loops] // nil: no event loops (fastpath_linux.go)

	// Lifecycle (lifecycle.go).
	draining atomic.Bool // Run is draining: refuse new work
	ran      atomic.Bool
	close    sync.Once
}

// overlayState is what the overlay looks like from here; the controller
// agent replaces its sources at run time.
type overlayState struct {
	kr      *hop.Keyring // configured keys; nil: no overlay (direct only)
	replay  *hop.ReplayCache
	members atomic.Pointer[memberBox]
	chains  atomic.Pointer[chainBox]
	keys    atomic.Pointer[keyBox]
}

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
}

// acceptState is the accepting side: listeners and admission.
type acceptState struct {
	listeners []*listener
	limits    *connLimiter
	header    time.Duration // time allowed for a hop header or entry handshake
}

// workerState holds the handshake workers (see dispatch): idle ones wait
// on jobs until stop is closed.
type workerState struct {
	jobs chan handshakeJob
	stop chan struct{}
	idle atomic.Int32
	wg   sync.WaitGroup
}

// flowState is every flow in progress.
type flowState struct {
	// ctx is cancelled when flows must stop (after the drain timeout).
	ctx     context.Context
	cancel  context.CancelFunc
	forcing atomic.Bool // the drain timed out: reset every flow
	idle    time.Duration
	bufs    sync.Pool      // small-copy buffers, see copySmall
	wg      sync.WaitGroup // every per-connection goroutine
	mu      sync.Mutex
	conns   map[net.Conn]struct{} // open connections, for the forced close
}

// adminHTTP serves /metrics, /healthz and pprof.
type adminHTTP struct {
	srv *http.Server
	ln  net.Listener
}

type chainBox struct{ src ChainSource }
type memberBox struct{ src MemberSource }
type keyBox struct{ src KeySource }

// staticMembers is a fixed member list.
type staticMembers map[string]string

func (m staticMembers) Members() map[string]string { return m }

// listener is one bound listening socket with what it serves.
type listener struct {
	ln      *net.TCPListener
	kind    entryKind
	service *ServiceConfig // kindService
	allow   []matcher      // kindSOCKS5, kindConnect
	looped  bool           // served by the event loops, not acceptLoop
}

type entryKind uint8

const (
	kindHop entryKind = iota
	kindService
	kindSOCKS5
	kindConnect
)

func (k entryKind) String() string {
	return [...]string{"hop", "service", "socks5", "http_connect"}[k]
}

// New builds a daemon from cfg: it reads the keys and the chain table and
// binds every listener, so configuration errors surface here. log may be nil.
func New(cfg *Config, log *slog.Logger) (*Server, error) {
	return newServer(cfg, log, true)
}

// Check does what New does except binding listeners: it validates cfg and
// loads its keys and chain table.
func Check(cfg *Config) error {
	_, err := newServer(cfg, nil, false)
	return err
}

func newServer(cfg *Config, log *slog.Logger, bind bool) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:  cfg,
		log:  log.With("fep", cfg.ID),
		self: cfg.ID,
		m:    newMetrics(),
	}
	s.origin.res = net.DefaultResolver
	s.accept.header = cfg.headerTimeout()
	s.flows.idle = cfg.idleTimeout()
	s.flows.conns = make(map[net.Conn]struct{})
	s.refLog = newRateLog(s.log, 10*time.Second)
	s.lookups = newLookupMetrics(s.m.reg)
	s.flows.bufs.New = newSmallBuf
	s.workers.jobs = make(chan handshakeJob)
	s.workers.stop = make(chan struct{})
	s.flows.ctx, s.flows.cancel = context.WithCancel(context.Background())
	s.out.dialer = net.Dialer{Timeout: cfg.connectTimeout(), Control: cfg.Socket.control(sockDial), KeepAlive: cfg.Socket.keepAlive()}
	s.out.poolDialer = s.out.dialer
	s.out.poolDialer.Control = cfg.Socket.control(sockPoolDial)
	if n := cfg.Pool.Hop; n > 0 {
		s.out.hopPool = newConnPool("hop", n, cfg.hopMaxIdle(), s.dialPooled, s.hopPoolTargets, s.m.pool, s.log)
		s.out.hopPool.hello = s.poolHelloDial
	}
	if n := cfg.Pool.Origin; n > 0 {
		s.out.originPool = newConnPool("origin", n, cfg.originMaxIdle(), s.dialPooled, nil, s.m.pool, s.log)
	}
	maxConns := cfg.Limits.MaxConns
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	perSource := cfg.Limits.MaxConnsPerSource
	if perSource == 0 {
		perSource = DefaultMaxConnsPerSource
	}
	s.accept.limits = newConnLimiter(maxConns, perSource, cfg.Limits.HopMaxConnsPerSource)

	if cfg.Keys.Current != nil {
		kr, err := loadKeyring(cfg)
		if err != nil {
			return nil, err
		}
		s.overlay.kr = kr
	}
	s.overlay.replay = hop.NewReplayCache(cfg.maxSkew(), 1<<18)
	s.SetMembers(cfg.Members)
	if cfg.Table != "" {
		ix, err := loadTable(cfg.path(cfg.Table))
		if err != nil {
			return nil, err
		}
		s.overlay.chains.Store(&chainBox{ix})
	}
	var err error
	if s.origin.egress, err = newEgressMap(cfg.ID, cfg.Egress); err != nil {
		return nil, err
	}
	if s.origin.policy.allow, err = parseMatchers(cfg.Destinations.Allow); err != nil {
		return nil, fmt.Errorf("destinations.allow: %w", err)
	}
	if s.origin.ppDest, err = parseMatchers(cfg.ProxyProtocol); err != nil {
		return nil, fmt.Errorf("proxy_protocol: %w", err)
	}
	if !bind {
		return s, nil
	}
	if err := s.bind(); err != nil {
		s.closeListeners()
		return nil, err
	}
	return s, nil
}

func newSmallBuf() any {
	b := make([]byte, smallCopy)
	return &b
}

func loadKeyring(cfg *Config) (*hop.Keyring, error) {
	cur, err := cfg.Keys.Current.secret(cfg.dir)
	if err != nil {
		return nil, fmt.Errorf("keys.current: %w", err)
	}
	var prev *hop.Key
	if p := cfg.Keys.Previous; p != nil {
		sec, err := p.secret(cfg.dir)
		if err != nil {
			return nil, fmt.Errorf("keys.previous: %w", err)
		}
		prev = &hop.Key{ID: p.ID, Secret: sec}
	}
	kr, err := hop.NewKeyring(hop.Key{ID: cfg.Keys.Current.ID, Secret: cur}, prev)
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	return kr, nil
}

func loadTable(path string) (*pathcomp.Index, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("chain table: %w", err)
	}
	defer f.Close()
	tf, err := pathcomp.ReadTableFile(f)
	if err != nil {
		return nil, fmt.Errorf("chain table %s: %w", path, err)
	}
	return pathcomp.NewIndex(tf)
}

func (s *Server) bind() error {
	lc := net.ListenConfig{Control: s.listenControl(), KeepAlive: s.cfg.Socket.keepAlive()}
	listen := func(addr string, l *listener) error {
		ln, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s %s: %w", l.kind, addr, err)
		}
		l.ln = ln.(*net.TCPListener)
		s.accept.listeners = append(s.accept.listeners, l)
		return nil
	}
	if a := s.cfg.Hop.Listen; a != "" {
		if s.overlay.kr == nil && s.cfg.Controller == nil {
			return errors.New("hop.listen needs keys.current")
		}
		if err := listen(a, &listener{kind: kindHop}); err != nil {
			return err
		}
	}
	for i := range s.cfg.Services {
		svc := &s.cfg.Services[i]
		if err := listen(svc.Listen, &listener{kind: kindService, service: svc}); err != nil {
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
	if a := s.cfg.Metrics.Listen; a != "" {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("listen metrics %s: %w", a, err)
		}
		s.admin.ln = ln
	}
	return nil
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

// MetricsAddr returns the metrics listener's address, or nil.
func (s *Server) MetricsAddr() net.Addr {
	if s.admin.ln == nil {
		return nil
	}
	return s.admin.ln.Addr()
}

// SetMembers replaces the member list (FEP id -> hop address) atomically
// with a copy of members.
func (s *Server) SetMembers(members map[string]string) {
	m := make(staticMembers, len(members))
	for k, v := range members {
		m[k] = v
	}
	s.overlay.members.Store(&memberBox{m})
	if s.out.hopPool != nil {
		s.out.hopPool.refill()
	}
}

// SetMemberSource makes ms the member list, asked on every hop decision.
func (s *Server) SetMemberSource(ms MemberSource) {
	if ms == nil {
		ms = staticMembers{}
	}
	s.overlay.members.Store(&memberBox{ms})
	if s.out.hopPool != nil {
		s.out.hopPool.refill()
	}
}

// SetKeySource makes ks supply the overlay keyring; while it returns nil
// (or with no source) the configured keys are used.
func (s *Server) SetKeySource(ks KeySource) {
	if ks == nil {
		s.overlay.keys.Store(nil)
		return
	}
	s.overlay.keys.Store(&keyBox{ks})
}

// keyring returns the keyring in force, or nil when there is none.
func (s *Server) keyring() *hop.Keyring {
	if kb := s.overlay.keys.Load(); kb != nil {
		if kr := kb.src.Keys(); kr != nil {
			return kr
		}
	}
	return s.overlay.kr
}

// SetChains replaces the chain source atomically; nil means no chains.
func (s *Server) SetChains(cs ChainSource) {
	if cs == nil {
		s.overlay.chains.Store(nil)
		return
	}
	s.overlay.chains.Store(&chainBox{cs})
}

// memberAddrs returns the hop addresses of the other members (the hop
// pool's targets).
func (s *Server) memberAddrs() []string {
	ms := s.overlay.members.Load().src.Members()
	out := make([]string, 0, len(ms))
	for id, a := range ms {
		if id != s.self {
			out = append(out, a)
		}
	}
	return out
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
	return s.memberAddrs()
}

// isMemberIP reports whether ip is the host of a member's hop address
// (given as an IP literal; host names never match).
func (s *Server) isMemberIP(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, a := range s.overlay.members.Load().src.Members() {
		ap, err := netip.ParseAddrPort(a)
		if err == nil && ap.Addr().Unmap() == ip {
			return true
		}
	}
	return false
}

func (s *Server) member(id string) (string, bool) {
	a, ok := s.overlay.members.Load().src.Members()[id]
	return a, ok
}

// Run serves until ctx is cancelled, then drains: it stops accepting, waits
// up to the drain timeout for flows to end, resets the rest and returns.
func (s *Server) Run(ctx context.Context) error {
	if s.ran.Swap(true) {
		return errors.New("relay: Run called twice")
	}
	s.log.Info("proxy serving", "listeners", len(s.accept.listeners), "members", len(s.overlay.members.Load().src.Members()))
	for _, l := range s.accept.listeners {
		s.log.Info("listening", "entry", l.kind.String(), "addr", l.ln.Addr().String())
		if l.kind != kindSOCKS5 && l.kind != kindConnect {
			continue
		}
		open := (l.kind == kindSOCKS5 && len(s.cfg.SOCKS5.Users) == 0) || (l.kind == kindConnect && len(s.cfg.HTTPConnect.Users) == 0)
		if ip := addrPort(l.ln.Addr()).Addr(); open && len(l.allow) == 0 && !ip.IsLoopback() {
			s.log.Warn("entry without users or allowlist on a non-loopback address: anyone reaching it may use this proxy (the EgP's destination policy still applies)", "entry", l.kind.String(), "addr", l.ln.Addr().String())
		}
	}
	var acceptWG sync.WaitGroup
	fatal := make(chan error, len(s.accept.listeners)+1)
	poolCtx, stopPools := context.WithCancel(context.Background())
	defer stopPools()
	var poolWG sync.WaitGroup
	for _, p := range []*connPool{s.out.hopPool, s.out.originPool} {
		if p != nil {
			poolWG.Add(1)
			go s.runPool(&poolWG, poolCtx, p)
		}
	}
	if err := s.startLoops(); err != nil {
		s.log.Warn("event loops unavailable, serving every flow on goroutines", "err", err)
	}
	for _, l := range s.accept.listeners {
		if l.looped {
			continue
		}
		acceptWG.Add(1)
		go s.acceptLoop(&acceptWG, l, fatal)
	}
	if s.admin.ln != nil {
		s.admin.srv = s.newHTTPServer()
		acceptWG.Add(1)
		go s.serveMetrics(&acceptWG, fatal)
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-fatal:
	}
	s.draining.Store(true)
	s.closeListeners()
	stopPools()
	poolWG.Wait()
	s.log.Info("proxy draining", "active", s.accept.limits.total(), "timeout", s.cfg.drainTimeout())
	if !s.waitFlows(s.cfg.drainTimeout()) {
		s.log.Warn("drain timeout: resetting remaining connections", "active", s.accept.limits.total())
		s.forceClose()
		s.flows.wg.Wait()
	}
	if s.admin.srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.admin.srv.Shutdown(sctx)
		cancel()
	}
	acceptWG.Wait()
	if ls := s.loops.Load(); ls != nil {
		ls.Close()
	}
	close(s.workers.stop)
	s.workers.wg.Wait()
	s.flows.cancel()
	s.log.Info("proxy stopped")
	return runErr
}

// Close releases the listeners of a Server whose Run was never called.
func (s *Server) Close() error {
	if s.ran.Load() {
		return nil
	}
	s.closeListeners()
	s.flows.cancel()
	return nil
}

func (s *Server) closeListeners() {
	s.close.Do(func() {
		if ls := s.loops.Load(); ls != nil {
			ls.StopAccepting()
		}
		for _, l := range s.accept.listeners {
			if l.ln != nil {
				l.ln.Close()
			}
		}
		if s.admin.ln != nil && s.admin.srv == nil {
			s.admin.ln.Close()
		}
	})
}

func (s *Server) waitFlows(d time.Duration) bool {
	done := make(chan struct{})
	go waitGroupDone(&s.flows.wg, done)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// runPool runs one connection pool until ctx ends.
func (s *Server) runPool(wg *sync.WaitGroup, ctx context.Context, p *connPool) {
	defer wg.Done()
	p.run(ctx)
}

func waitGroupDone(wg *sync.WaitGroup, done chan<- struct{}) {
	wg.Wait()
	close(done)
}

func (s *Server) forceClose() {
	s.flows.forcing.Store(true)
	s.flows.cancel()
	if ls := s.loops.Load(); ls != nil {
		ls.ResetAll()
	}
	s.flows.mu.Lock()
	defer s.flows.mu.Unlock()
	for c := range s.flows.conns {
		resetClose(c)
	}
}

func (s *Server) track(c net.Conn) {
	s.flows.mu.Lock()
	s.flows.conns[c] = struct{}{}
	s.flows.mu.Unlock()
	if s.flows.forcing.Load() {
		resetClose(c)
	}
}

func (s *Server) untrack(c net.Conn) {
	s.flows.mu.Lock()
	delete(s.flows.conns, c)
	s.flows.mu.Unlock()
}

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

// handshakeJob is one accepted connection for a handshake worker.
type handshakeJob struct {
	l   *listener
	c   *net.TCPConn
	src netip.AddrPort
	// A hop flow an event loop gave up after reading its header (checked,
	// not replayed): h and the bytes that followed it.
	h     *hop.Header
	early []byte
}

// maxIdleWorkers bounds the handshake workers kept waiting for work.
const maxIdleWorkers = 32

// dispatch hands j to an idle handshake worker, or starts a new one.
// Workers live on after their handshake, so the deep stack a handshake
// needs (the dial path) is grown once per worker instead of once per flow;
// each flow's copy phase runs on fresh small-stack goroutines.
func (s *Server) dispatch(j handshakeJob) {
	select {
	case s.workers.jobs <- j:
		return
	default:
	}
	s.workers.wg.Add(1)
	go s.handshakeWorker(j)
}

// handshakeWorker runs handshakes until it is told to stop, or finds
// enough workers idle already.
func (s *Server) handshakeWorker(j handshakeJob) {
	defer s.workers.wg.Done()
	for {
		s.serveConn(j)
		if s.workers.idle.Add(1) > maxIdleWorkers {
			s.workers.idle.Add(-1)
			return
		}
		select {
		case j = <-s.workers.jobs:
			s.workers.idle.Add(-1)
		case <-s.workers.stop:
			s.workers.idle.Add(-1)
			return
		}
	}
}

// serveConn runs the accept-side protocol of one connection (header or
// entry protocol, chain choice, dial) on a handshake worker, then hands the
// flow to its own goroutine for the copy phase.
func (s *Server) serveConn(j handshakeJob) {
	l, c, src := j.l, j.c, j.src
	s.track(c)
	if nd := s.cfg.Socket.NoDelay; nd != nil {
		c.SetNoDelay(*nd)
	}
	var role role
	var up *net.TCPConn
	switch {
	case j.h != nil:
		role, up = s.hopOnward(c, src, j.h, j.early)
	case l.kind == kindHop:
		role, up = s.serveHop(c, src)
	default:
		role, up = roleInP, s.serveEntry(l, c, src)
	}
	if up == nil { // refused or failed: already counted and closed
		s.endConn(l, c, src)
		return
	}
	go s.relayConn(l, c, src, role, up)
}

// relayConn owns an accepted connection for its copy phase.
func (s *Server) relayConn(l *listener, c *net.TCPConn, src netip.AddrPort, role role, up *net.TCPConn) {
	defer s.endConn(l, c, src)
	s.relay(role, c, up)
}

// endConn releases what an accepted connection held.
func (s *Server) endConn(l *listener, c *net.TCPConn, src netip.AddrPort) {
	s.untrack(c)
	c.Close() // every path closes c already; this is the safety net
	s.accept.limits.release(src.Addr(), l.kind == kindHop)
	s.flows.wg.Done()
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
	var hr io.Reader = c
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
	return roleEgP, s.exit(c, roleEgP, t, h.Source, h.Dest, log, early)
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
// they go first.
func (s *Server) exit(c *net.TCPConn, role role, t Target, client, local netip.AddrPort, log *slog.Logger, early []byte) *net.TCPConn {
	up, err := s.dialOrigin(t, client, local)
	if errors.Is(err, errPolicy) {
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
		resetClose(c)
		return nil
	}
	log.Debug("exit", "role", role, "target", t.String())
	return up
}

// dialHop connects to the next member and sends it the signed header h
// followed by the flow's early bytes in one write.
func (s *Server) dialHop(next, addr string, h *hop.Header, early []byte) (*net.TCPConn, error) {
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

// dialOrigin checks t against the destination policy (errPolicy), connects
// to the allowed address and sends a PROXY v2 header to origins that want
// one.
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

// relay moves the flow's bytes until both directions end; down is the
// accepted connection, up the dialed one (closed and untracked here).
func (s *Server) relay(role role, down, up *net.TCPConn) {
	defer s.untrack(up)
	rm := s.m.roles[role]
	rm.active.Inc()
	defer rm.active.Dec()
	p := &pipe{
		down: down, up: up, idle: s.flows.idle,
		upBytes: rm.up,
		dnBytes: rm.down,
		bufs:    &s.flows.bufs,
	}
	outcome := p.run()
	if s.flows.forcing.Load() && outcome != outcomeOK {
		outcome = outcomeAborted
	}
	s.endFlow(role, outcome)
}

func (s *Server) endFlow(r role, o outcome) {
	s.m.roles[r].flow(o).Inc()
}

func flowString(id [16]byte) string {
	return fmt.Sprintf("%x", id[:8])
}

func (s *Server) newHTTPServer() *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.m.handler())
	mux.HandleFunc("/healthz", s.healthz)
	if s.cfg.Metrics.PProf {
		mux.HandleFunc("/debug/pprof/", servePProf)
	}
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// serveMetrics serves /metrics and /healthz until shutdown.
func (s *Server) serveMetrics(wg *sync.WaitGroup, fatal chan<- error) {
	defer wg.Done()
	if err := s.admin.srv.Serve(s.admin.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fatal <- fmt.Errorf("metrics: %w", err)
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}
