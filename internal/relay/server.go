package relay

// Stage: lifecycle. A Server is built (New, Check), runs (Run) and drains:
// stop accepting, wait for flows up to the drain timeout, reset the rest.
// Its fields are grouped by the stage that owns them, one file per stage:
// accept.go, handshake.go, hopside.go, dial.go, copy.go, admin.go, overlay.go
// and the event loops (fastpath_linux.go, hoploop_linux.go).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mosto-net/mosto/internal/evloop"
	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/pathcomp"
)

// Server is one proxy daemon. Create it with New, then call Run once (or
// Close if Run is never called). Its fields are grouped by the stage that
// owns them; each stage lives in its own file (see this file's opening).
type Server struct {
	cfg  *Config
	log  *slog.Logger
	self string // this FEP's id

	// Observability (metrics.go, limit.go, lookup.go).
	m       *relayMetrics
	refLog  *rateLog      // rate-limited refusal log
	lookups lookupMetrics // remote chain lookups

	overlay overlayState                 // members, keys, chains (overlay.go)
	origin  originPolicy                 // where flows may leave the overlay (dial.go)
	out     outbound                     // dialers and pools (dial.go)
	accept  acceptState                  // listeners and admission (accept.go)
	workers workerState                  // handshake workers (handshake.go)
	flows   flowState                    // every running flow (server.go, copy.go)
	admin   adminHTTP                    // metrics and health HTTP (admin.go)
	loops   atomic.Pointer[evloop.Loops] // nil: no event loops (fastpath_linux.go)
	offload atomic.Pointer[offloader]    // nil: flows stay relayed (offload.go)
	sizes   *sizeLearner                 // learned size hints of the InP's flows; nil: off (sizelearn.go)
	onpath  onPathState                  // the controller's interception decisions (onpath.go)

	// Lifecycle (this file).
	draining atomic.Bool // Run is draining: refuse new work
	ran      atomic.Bool
	close    sync.Once
}

// flowState is every flow in progress.
type flowState struct {
	// ctx is cancelled when flows must stop (after the drain timeout).
	ctx     context.Context
	cancel  context.CancelFunc
	forcing atomic.Bool // the drain timed out: reset every flow
	idle    time.Duration
	bufs    sync.Pool      // small-copy buffers, see copyData
	pipes   *pipePool      // splice pipes of bulk directions (splice.go)
	wg      sync.WaitGroup // every per-connection goroutine
	mu      sync.Mutex
	conns   map[net.Conn]struct{} // open connections, for the forced close
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
	s.offloadMetrics()
	s.flows.bufs.New = newSmallBuf
	s.flows.pipes = newPipePool(pipePoolSize)
	s.sizes = newSizeLearner(cfg.SizeLearning)
	sizes := s.sizes
	s.m.reg.GaugeFunc(metrics.Opts{Name: "mosto_relay_size_keys",
		Help: "Services and destinations (and HTTP path prefixes) whose flow sizes the InP remembers (size_learning.max_keys)."},
		func() float64 { n, _ := sizes.stats(); return float64(n) })
	s.m.reg.CounterFunc(metrics.Opts{Name: "mosto_relay_size_key_evictions_total",
		Help: "Size-learning keys forgotten to stay within size_learning.max_keys."},
		func() float64 { _, n := sizes.stats(); return float64(n) })
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
	hopMax := cfg.Limits.HopMaxConns
	if hopMax == 0 {
		hopMax = maxConns
	}
	hopPerSource := cfg.Limits.HopMaxConnsPerSource
	if hopPerSource == 0 {
		hopPerSource = DefaultHopMaxConnsPerSource
	}
	members := &memberIPs{members: func() map[string]string {
		if b := s.overlay.members.Load(); b != nil {
			return b.src.Members()
		}
		return nil
	}}
	s.accept.limits = newConnLimiter(maxConns, hopMax, perSource, hopPerSource, members.has)

	if cfg.Keys.Current != nil {
		kr, err := loadKeyring(cfg)
		if err != nil {
			return nil, err
		}
		s.overlay.kr = kr
	}
	entries := cfg.Hop.ReplayEntries
	if entries == 0 {
		entries = DefaultReplayEntries
	}
	s.overlay.replay = hop.NewReplayCache(cfg.maxSkew(), entries)
	replay := s.overlay.replay
	s.m.reg.CounterFunc(metrics.Opts{Name: "mosto_relay_replay_evictions_total",
		Help: "Hop headers the replay cache forgot before they expired because it was full (raise hop.replay_entries)."},
		func() float64 { return float64(replay.Evicted()) })
	s.m.reg.GaugeFunc(metrics.Opts{Name: "mosto_relay_replay_entries",
		Help: "Hop headers the replay cache remembers."}, func() float64 { return float64(replay.Len()) })
	s.m.reg.GaugeFunc(metrics.Opts{Name: "mosto_relay_replay_capacity",
		Help: "Size of the replay cache (hop.replay_entries)."}, func() float64 { return float64(entries) })
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
	if len(cfg.Hop.MemberAllow) > 0 {
		ms, err := parseMatchers(cfg.Hop.MemberAllow)
		if err != nil {
			return nil, fmt.Errorf("hop.member_allow: %w", err)
		}
		s.out.members = &policy{allow: ms}
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

// Run serves until ctx is cancelled, then drains: it stops accepting, waits
// up to the drain timeout for flows to end, resets the rest and returns.
func (s *Server) Run(ctx context.Context) error {
	if s.ran.Swap(true) {
		return errors.New("relay: Run called twice")
	}
	stopIntercept, err := s.startIntercept()
	if err != nil {
		s.closeListeners()
		s.flows.cancel()
		return err
	}
	defer stopIntercept()
	// The listeners accept first: what a flow does not need (the pools'
	// refills, the start-up log lines) comes after, off the path of the
	// connection that started a socket-activated proxy (docs/ops.md).
	// Offload stays before: a flow accepted before it would never be
	// offloaded.
	var acceptWG sync.WaitGroup
	fatal := make(chan error, len(s.accept.listeners)+1)
	poolCtx, stopPools := context.WithCancel(context.Background())
	defer stopPools()
	if err := s.startOffload(poolCtx); err != nil {
		s.log.Warn("offload unavailable, every flow stays relayed", "err", err)
	}
	defer s.stopOffload()
	loopErr := s.startLoops()
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
	var poolWG sync.WaitGroup
	for _, p := range []*connPool{s.out.hopPool, s.out.originPool} {
		if p != nil {
			poolWG.Add(1)
			go s.runPool(&poolWG, poolCtx, p)
		}
	}
	s.logServing(loopErr)
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
	s.flows.pipes.drain()
	s.flows.cancel()
	s.log.Info("proxy stopped")
	return runErr
}

// Close releases the listeners of a Server whose Run was never called.
// logServing logs what Run serves, once the listeners accept.
func (s *Server) logServing(loopErr error) {
	if loopErr != nil {
		s.log.Warn("event loops unavailable, serving every flow on goroutines", "err", loopErr)
	}
	if n := len(s.cfg.Activated); n > 0 {
		s.log.Info("socket activation", "listeners", n)
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
}

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
