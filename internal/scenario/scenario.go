package scenario

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/cdnfront"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/transfer"
)

// Mode is a way of fetching an object.
type Mode string

const (
	Direct  Mode = "direct"       // client -> origin
	Single  Mode = "mosto-single" // client -> one proxy (Roles.Single) -> origin
	Chain   Mode = "mosto-chain"  // client -> InP -> computed chain -> EgP -> origin
	CDNWarm Mode = "cdn-warm"     // client -> nginx next to it -> warm keep-alive connection -> origin
	CDNCold Mode = "cdn-cold"     // the same after nginx's idle timeout closed the upstream connection
	// CDNDefault is cdn-warm with Linux's default slow start after idle at
	// the origin (the upstream connection's sender): nginx's kept-alive
	// connection idles for Config.CDNDefaultIdle (many RTOs, shorter than
	// nginx's idle timeout), and the origin's namespace has
	// tcp_slow_start_after_idle=1 during the fetch, so a loss-based origin
	// (CUBIC, Linux's default) starts the response from its initial window
	// on an open connection: the window halves per RTO of idle down to it
	// (tcp_cwnd_restart). A BBR origin skips that restart (the kernel
	// leaves it to congestion controls with their own cong_control, and
	// BBR paces at its bandwidth estimate after idle): there the mode is
	// cdn-warm after an idle.
	CDNDefault Mode = "cdn-default"
)

// DefaultCDNDefaultIdle is Config.CDNDefaultIdle's default: about 14 RTOs
// of a 150 ms path, so the window of a 15 MB response (10000 segments)
// has halved down to the initial 10.
const DefaultCDNDefaultIdle = 5 * time.Second

// AllModes returns every mode in report order.
func AllModes() []Mode {
	return []Mode{Direct, Single, Chain, CDNWarm, CDNCold, CDNDefault, ChainCold, ChainPlain}
}

// isCDN reports whether m fetches through the CDN front-end.
func isCDN(m Mode) bool { return m == CDNWarm || m == CDNCold || m == CDNDefault }

// CDNAtInP as Config.CDNHost runs the CDN front-end on the ingress FEP's
// host: a CDN edge at the same site as mosto's InP, as far from the client.
const CDNAtInP = "inp"

// Ports used inside the world.
const (
	originPort  = 80
	hopPort     = 7000
	metricsPort = 9100
	cdnPort     = 8080
	servicePort = 8000 // + size index, one service per size class
	// pairServicePort + FEP index: the services of Config.PairPort.
	pairServicePort = 8100
)

// Config configures a Scenario.
type Config struct {
	Roles Roles
	// Sizes are the object sizes that will be fetched through mosto: the InP
	// and the single proxy get one service listener per size (the size picks
	// the chain's rounds class).
	Sizes []int64
	// Mosto is the command that runs the mosto binary, e.g. {os.Executable()}.
	Mosto []string
	// Env is added to the environment of the proxy processes.
	Env []string
	// Dir holds generated files (configs, keys, table, nginx); empty: a new
	// temporary directory, removed by Close.
	Dir string
	// CDN enables the nginx front-end; CDNIdle is its upstream idle timeout
	// (0: 5 s).
	CDN     bool
	CDNIdle time.Duration
	// CDNHost runs the CDN front-end; empty: the client's host (the
	// front-end then sits at 0 RTT from the client). A CDN edge at the
	// ingress FEP's site is CDNHost = that FEP's host, or CDNAtInP.
	CDNHost string
	// CDNDefaultIdle is how long nginx's upstream connection idles before
	// a CDNDefault fetch (0: DefaultCDNDefaultIdle); at most 2/3 of
	// CDNIdle is used.
	CDNDefaultIdle time.Duration
	Nginx          string // nginx binary; empty: "nginx"
	// Table, when set, is the chain table the proxies use instead of the
	// one computed from the world's RTTs.
	Table *pathcomp.TableFile
	// Tune holds the inter-proxy TCP levers, applied to the FEP hosts (and,
	// with TuneCDN, to the CDN front-end's host).
	Tune Tune
	// TuneCDN gives the CDN front-end's host the FEPs' kernel levers
	// (route initcwnd/initrwnd, tcp_rmem, Fast Open), so the front-end and
	// mosto compete with equal tuning; its upstream keep-alive pool is its
	// own (CDNWarm).
	TuneCDN bool
	// OriginWmem, when positive, is the origin's tcp_wmem default (its
	// initial send buffer, bytes) in every mode: a tuned origin whose send
	// buffer does not hold back a warm connection's first round (docs/bench.md,
	// "cdn-warm with CUBIC"); 0: the world's (kernel) default.
	OriginWmem int
	// Model is the planner's slow-start model, for the static table and
	// the controller (--icw, --mss); the zero value is ICW 10 x 1460. With
	// route initcwnd levers on the FEPs it should say so: the chain's links
	// then start with that window. EndICW/EndRTT model the end segments
	// apart (--end-icw, --end-rtt); EndRTT < 0 means the world's client-InP
	// RTT (PlanModel).
	Model pathcomp.Model
	// Controller, when set, runs a real `mosto controller` in the world and
	// gives every proxy a `controller:` section instead of a table file;
	// Start then waits until discovery converged (see WaitConverged).
	// Exclusive with Table.
	Controller *ControllerConfig
	// PairPort, when set, gives every FEP x one service per other FEP y
	// (listening at PairService(x, y)) whose origin is y's host at
	// PairPort, sent to y by an egress route: flows on every ordered pair
	// of FEPs, through each pair's chain. The caller serves PairPort on
	// the FEP hosts.
	PairPort int
	// SizeHints, per size of Sizes, is the static size hint of that
	// size's service ("size"); 0 or missing: the size itself. A hint far
	// from the size shows the InP's size learning (docs/size-learning.md).
	SizeHints []int64
	// SizeMinFlows is the proxies' size_learning.min_flows; 0: their
	// default, -1: learning off.
	SizeMinFlows int
}

// Tune is the TCP tuning of the FEPs (the proxies' hosts): levers a mosto
// operator controls without touching clients or origins.
type Tune struct {
	InitCwnd   int    // route initcwnd in segments (and initrwnd); 0: kernel default
	RmemInit   int    // tcp_rmem default (initial receive buffer) in bytes; 0: unchanged
	Congestion string // TCP_CONGESTION of every hop and origin socket; "": default
	HopPool    int    // proxy pool.hop: idle connections kept to every member; 0: none
	OriginPool int    // proxy pool.origin: idle connections kept to the origin; 0: none
	FastOpen   bool   // proxy socket.fastopen and net.ipv4.tcp_fastopen=3 on the FEPs
	// Offload: proxy offload mode "bytes" with this after_bytes (every
	// proxy joins its own legs in the kernel, internal/xlate); 0: off.
	Offload int64
	// OffloadNoBound: the proxies pause a due flow at once (offload.no_bound,
	// the handover drains whatever they hold), for comparison.
	OffloadNoBound bool
	// OffloadMode: the proxies' offload.mode with Offload ("": bytes;
	// "slow-start": after the flow left slow start, Offload its size class).
	OffloadMode string
	// OffloadJoinShort: offload.join_short on the proxies (join even when a window would limit the joined flow).
	OffloadJoinShort bool
	// OffloadAgeRTTs: offload.age_rtts on the proxies (0: their default).
	OffloadAgeRTTs int
	// OffloadTail, OffloadFreeze: offload.tail (the early join) and
	// offload.freeze (the frozen edge) on the proxies.
	OffloadTail, OffloadFreeze bool
	// OffloadNoRcvbufCap: offload.no_rcvbuf_cap on the proxies.
	OffloadNoRcvbufCap bool
	// OffloadHandover: offload.handover on the proxies ("": their
	// default, frozen; "drain": the handover of sessions 9-12).
	OffloadHandover string
}

// Scenario is a running experiment in a world.
type Scenario struct {
	w       *emu.World
	cfg     Config
	roles   Roles
	log     *slog.Logger
	dir     string
	tempDir bool
	table   *pathcomp.TableFile
	index   *pathcomp.Index

	cancel     context.CancelFunc
	originDone chan error
	originSrv  *origin.Server
	originConn atomic.Int64 // connections the origin accepted
	proxies    []*proxyProc
	cdn        *cdnfront.Front
	lastCDN    time.Time

	clients map[Mode]*transfer.Client

	ctl  *controllerProc // nil: static table file
	conv Convergence

	cold coldState // the cold modes' restarts

	ssai    string       // the origin's tcp_slow_start_after_idle before CDNDefault's fetches
	machine MachineRates // measured rates of this machine (SetMachineRate)
}

type proxyProc struct {
	fep  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	logf string
}

// Start brings up the origin, the proxies and (if enabled) the CDN
// front-end in w, and waits until each accepts connections.
func Start(ctx context.Context, w *emu.World, cfg Config, log *slog.Logger) (_ *Scenario, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Sizes) == 0 {
		return nil, errors.New("scenario: no sizes")
	}
	if len(cfg.Mosto) == 0 {
		return nil, errors.New("scenario: no mosto command to run the proxies")
	}
	if cfg.Controller != nil && cfg.Table != nil {
		return nil, errors.New("scenario: a static table and a controller are exclusive")
	}
	roles, err := cfg.Roles.resolve(w.Hosts(), w.RTT)
	if err != nil {
		return nil, err
	}
	if cfg.CDNHost == CDNAtInP {
		cfg.CDNHost = roles.InP
	}
	if cfg.CDNHost != "" && !slices.Contains(w.Hosts(), cfg.CDNHost) {
		return nil, fmt.Errorf("scenario: CDN host %q is not a host of the world (hosts: %v)", cfg.CDNHost, w.Hosts())
	}
	s := &Scenario{w: w, cfg: cfg, roles: roles, log: log, dir: cfg.Dir, clients: make(map[Mode]*transfer.Client)}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "mosto-scenario-"); err != nil {
			return nil, fmt.Errorf("scenario: %w", err)
		}
		s.tempDir = true
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	var octx context.Context
	octx, s.cancel = context.WithCancel(context.Background())

	// Origin.
	oaddr := s.addr(roles.Origin, originPort)
	ln, err := w.Listen(ctx, roles.Origin, "tcp", oaddr)
	if err != nil {
		return nil, fmt.Errorf("scenario: origin listen: %w", err)
	}
	s.originSrv = origin.New(origin.Config{}, log.With("host", roles.Origin))
	s.originDone = make(chan error, 1)
	cl := &countingListener{Listener: ln, n: &s.originConn}
	go func() { s.originDone <- s.originSrv.Serve(octx, cl) }()

	// Chain table (or controller) and proxies.
	if cfg.Controller != nil {
		if err := s.startController(ctx); err != nil {
			return nil, err
		}
	} else if err := s.buildTable(); err != nil {
		return nil, err
	}
	if err := s.tune(ctx); err != nil {
		return nil, err
	}
	if err := s.tuneCDN(ctx); err != nil {
		return nil, err
	}
	if err := s.tuneOrigin(ctx); err != nil {
		return nil, err
	}
	if err := s.startProxies(ctx); err != nil {
		return nil, err
	}

	// CDN front-end in the client's namespace (co-located with the client).
	if cfg.CDN {
		fcfg := cdnfront.Config{
			Listen: s.addr(s.cdnHost(), cdnPort), Origin: oaddr, IdleTimeout: cfg.CDNIdle,
			Nginx: cfg.Nginx, Dir: filepath.Join(s.dir, "nginx"), User: "root root",
		}
		run := func(ctx context.Context, name string, args ...string) *exec.Cmd {
			return w.Command(ctx, s.cdnHost(), name, args...)
		}
		if s.cdn, err = cdnfront.Start(ctx, fcfg, run, log); err != nil {
			return nil, err
		}
	}

	// Everything answers?
	waits := []struct{ host, addr string }{{roles.Client, oaddr}}
	for _, p := range s.proxies {
		waits = append(waits, struct{ host, addr string }{roles.Client, s.addr(p.fep, metricsPort)})
	}
	if s.cdn != nil {
		waits = append(waits, struct{ host, addr string }{roles.Client, s.cdn.Addr()})
	}
	for _, wt := range waits {
		if err := s.waitAccept(ctx, wt.host, wt.addr); err != nil {
			return nil, err
		}
	}
	if s.ctl != nil {
		if s.conv, err = s.WaitConverged(ctx, 1500*time.Millisecond); err != nil {
			return nil, err
		}
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return w.Dial(ctx, roles.Client, network, addr)
	}
	s.clients[Direct] = &transfer.Client{Addr: oaddr, Dial: dial}
	if s.cdn != nil {
		s.clients[CDNWarm] = &transfer.Client{Addr: s.cdn.Addr(), Dial: dial}
		s.clients[CDNCold] = s.clients[CDNWarm]
		s.clients[CDNDefault] = s.clients[CDNWarm]
	}
	return s, nil
}

func (s *Scenario) addr(host string, port int) string {
	return netip.AddrPortFrom(s.w.Addr(host), uint16(port)).String()
}

// PairService is the address of FEP from's service whose origin is FEP
// to's host at Config.PairPort ("" unless both are FEPs and differ).
func (s *Scenario) PairService(from, to string) string {
	i, j := slices.Index(s.roles.FEPs, from), slices.Index(s.roles.FEPs, to)
	if s.cfg.PairPort == 0 || i < 0 || j < 0 || i == j {
		return ""
	}
	return s.addr(from, pairServicePort+j)
}

// pairServices adds to f's config the services and egress routes of
// Config.PairPort.
func (s *Scenario) pairServices(f string, pc *proxyConfig) {
	if pc.Egress == nil {
		pc.Egress = map[string]any{}
	}
	var routes []map[string]string
	allow, _ := pc.Dest["allow"].([]string)
	for _, y := range s.roles.FEPs {
		o := s.addr(y, s.cfg.PairPort)
		allow = append(allow, o)
		if y == f {
			continue
		}
		routes = append(routes, map[string]string{"match": o, "fep": y})
		pc.Service = append(pc.Service, map[string]any{
			"name": "pair-" + y, "listen": s.PairService(f, y), "origin": o,
			"size": strconv.FormatInt(s.cfg.Sizes[0], 10),
		})
	}
	pc.Egress["routes"] = routes
	pc.Dest["allow"] = allow
}

// Roles returns the hosts' roles with defaults filled in.
func (s *Scenario) Roles() Roles { return s.roles }

// Table returns the chain table the proxies use.
func (s *Scenario) Table() *pathcomp.TableFile { return s.table }

// ComputedChain returns the chain the table holds from the InP to the EgP
// for a transfer of size bytes.
func (s *Scenario) ComputedChain(size int64) ([]string, bool) {
	e, ok := s.index.Lookup(s.roles.InP, s.roles.EgP, size)
	return e.Path, ok
}

// ComputedEntry returns the table entry behind ComputedChain, with the
// model's predicted time (CostMS, which leaves out connection set-up).
func (s *Scenario) ComputedEntry(size int64) (pathcomp.ChainEntry, bool) {
	return s.index.Lookup(s.roles.InP, s.roles.EgP, size)
}

// PlanModel is Config.Model with a negative EndRTT replaced by the
// world's client-InP RTT: the model the table and the controller plan with.
func (s *Scenario) PlanModel() pathcomp.Model {
	m := s.cfg.Model
	if m.EndRTT < 0 {
		m.EndRTT = math.Round(float64(s.w.RTT(s.roles.Client, s.roles.InP))/1e3) / 1e3
	}
	return m
}

// buildTable computes the chain table over the FEPs' configured RTTs (or
// takes Config.Table) and writes it for the proxies.
func (s *Scenario) buildTable() error {
	tf := s.cfg.Table
	if tf == nil {
		n := len(s.roles.FEPs)
		rtt := make([][]float64, n)
		for i, a := range s.roles.FEPs {
			rtt[i] = make([]float64, n)
			for j, b := range s.roles.FEPs {
				if i != j {
					rtt[i][j] = float64(s.w.RTT(a, b)) / 1e6
				}
			}
		}
		f, err := pathcomp.Precompute(rtt, pathcomp.Options{Model: s.PlanModel()})
		if err != nil {
			return fmt.Errorf("scenario: chain precomputation: %w", err)
		}
		// Classes for the sizes and for the services' static hints.
		sizes := slices.Clone(s.cfg.Sizes)
		for _, h := range s.cfg.SizeHints {
			if h > 0 {
				sizes = append(sizes, h)
			}
		}
		tf = pathcomp.BuildTable(s.roles.FEPs, f, sizes)
		tf.Version = 1
	}
	ix, err := pathcomp.NewIndex(tf)
	if err != nil {
		return fmt.Errorf("scenario: chain table: %w", err)
	}
	s.table, s.index = tf, ix
	b, err := json.MarshalIndent(tf, "", " ")
	if err != nil {
		return fmt.Errorf("scenario: encode table: %w", err)
	}
	return os.WriteFile(filepath.Join(s.dir, "table.json"), b, 0o644)
}

// proxyConfig is the part of relay.Config the scenario writes (see
// docs/proxy.md for the format).
type proxyConfig struct {
	ID      string            `yaml:"id"`
	Hop     map[string]string `yaml:"hop"`
	Members map[string]string `yaml:"members,omitempty"`
	Keys    map[string]any    `yaml:"keys,omitempty"`
	Table   string            `yaml:"table,omitempty"`
	Ctl     map[string]any    `yaml:"controller,omitempty"`
	Egress  map[string]any    `yaml:"egress,omitempty"`
	Dest    map[string]any    `yaml:"destinations"`
	Service []map[string]any  `yaml:"services,omitempty"`
	Timeout map[string]string `yaml:"timeouts"`
	Metrics map[string]string `yaml:"metrics"`
	Socket  map[string]any    `yaml:"socket,omitempty"`
	Pool    map[string]int    `yaml:"pool,omitempty"`
	Offload map[string]any    `yaml:"offload,omitempty"`
	Sizes   map[string]int    `yaml:"size_learning,omitempty"`
}

func (s *Scenario) startProxies(ctx context.Context) error {
	var key [32]byte
	rand.Read(key[:])
	members := make(map[string]string)
	for _, f := range s.roles.FEPs {
		members[f] = s.addr(f, hopPort)
	}
	origin := s.addr(s.roles.Origin, originPort)
	for _, f := range s.roles.FEPs {
		// timeouts.header 30s, not the default 5s: the emulated network
		// runs in one process (the test binary, under -race on CI), which a
		// loaded machine can stall for seconds; a hop header held up in the
		// stalled emulator must not be refused as a slow peer's (a chaos
		// run lost 5 flows to a ~9 s stall at load 28-40).
		pc := proxyConfig{
			ID:      f,
			Hop:     map[string]string{"listen": s.addr(f, hopPort)},
			Dest:    map[string]any{"allow": []string{origin}},
			Timeout: map[string]string{"drain": "1s", "connect": "10s", "header": "30s"},
			Metrics: map[string]string{"listen": s.addr(f, metricsPort)},
		}
		if s.ctl != nil {
			// Members, keys and chains come from the controller.
			pc.Ctl = s.controllerSection(f)
		} else {
			pc.Members = members
			pc.Keys = map[string]any{"current": map[string]any{"id": 1, "secret_hex": hex.EncodeToString(key[:])}}
			pc.Table = filepath.Join(s.dir, "table.json")
		}
		// Levers are written out either way: the relay's own defaults turn
		// hop pools and Fast Open on, and the plain modes must not get them.
		pc.Socket = map[string]any{"fastopen": s.cfg.Tune.FastOpen}
		if cc := s.cfg.Tune.Congestion; cc != "" {
			pc.Socket["congestion"] = cc
		}
		pc.Pool = map[string]int{"hop": s.cfg.Tune.HopPool, "origin": s.cfg.Tune.OriginPool}
		if n := s.cfg.Tune.Offload; n > 0 {
			// Every up interface of the FEP's namespace (its emulator TUN
			// devices); not pinned: the scenario's proxies end with it.
			pc.Offload = map[string]any{"mode": "bytes", "after_bytes": n, "pin_dir": "off"}
			if m := s.cfg.Tune.OffloadMode; m != "" {
				pc.Offload["mode"] = m
			}
			if s.cfg.Tune.OffloadJoinShort {
				pc.Offload["join_short"] = true
			}
			if n := s.cfg.Tune.OffloadAgeRTTs; n != 0 {
				pc.Offload["age_rtts"] = n
			}
			if s.cfg.Tune.OffloadNoBound {
				pc.Offload["no_bound"] = true
			}
			if s.cfg.Tune.OffloadTail {
				pc.Offload["tail"] = true
			}
			if s.cfg.Tune.OffloadFreeze {
				pc.Offload["freeze"] = true
			}
			if s.cfg.Tune.OffloadNoRcvbufCap {
				pc.Offload["no_rcvbuf_cap"] = true
			}
			if h := s.cfg.Tune.OffloadHandover; h != "" {
				pc.Offload["handover"] = h
			}
		}
		if t := s.cfg.Tune; t.HopPool > 0 || t.OriginPool > 0 {
			// Members' pooled connections wait idle (pool.hop_max_idle 30 s).
			pc.Hop["member_idle"] = "60s"
		}
		// The InP sends flows for the origin to the EgP through a chain; the
		// single proxy (and every other FEP) connects to the origin itself.
		if f == s.roles.InP {
			pc.Egress = map[string]any{"default": s.roles.EgP}
		}
		if s.cfg.PairPort > 0 {
			s.pairServices(f, &pc)
		}
		if f == s.roles.InP || f == s.roles.Single {
			for i, size := range s.cfg.Sizes {
				hint := size
				if i < len(s.cfg.SizeHints) && s.cfg.SizeHints[i] > 0 {
					hint = s.cfg.SizeHints[i]
				}
				pc.Service = append(pc.Service, map[string]any{
					"name": "obj-" + transfer.FormatSize(size), "listen": s.addr(f, servicePort+i),
					"origin": origin, "size": strconv.FormatInt(hint, 10),
				})
			}
		}
		if s.cfg.SizeMinFlows != 0 {
			pc.Sizes = map[string]int{"min_flows": s.cfg.SizeMinFlows}
		}
		// The plain chain of the cold modes: the same proxy without levers.
		plain := pc
		plain.Socket = map[string]any{"fastopen": false}
		plain.Pool = map[string]int{"hop": 0, "origin": 0}
		plain.Offload = nil
		plain.Hop = map[string]string{"listen": pc.Hop["listen"]}
		for _, c := range []struct {
			pc    proxyConfig
			plain bool
		}{{pc, false}, {plain, true}} {
			b, err := yaml.Marshal(c.pc)
			if err != nil {
				return fmt.Errorf("scenario: proxy config %s: %w", f, err)
			}
			if err := os.WriteFile(s.configPath(f, c.plain), b, 0o600); err != nil {
				return fmt.Errorf("scenario: %w", err)
			}
		}
		path := s.configPath(f, false)
		p, err := s.spawn(f, filepath.Join(s.dir, "proxy-"+f+".log"), f, "proxy", "--config", path)
		if err != nil {
			return err
		}
		s.proxies = append(s.proxies, p)
	}
	return nil
}

// waitAccept polls until addr accepts a TCP connection from host, or a
// proxy died, or 15 s passed.
func (s *Scenario) waitAccept(ctx context.Context, host, addr string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := s.w.Dial(dctx, host, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if err := s.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("scenario: %s does not accept connections from %s: %w", addr, host, err)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Fetch fetches an object of size bytes in mode from the client and checks
// its bytes. For CDNCold it first waits until nginx's upstream connection
// has been idle longer than its timeout, and reports as Cold whether the
// origin really saw a new connection.
func (s *Scenario) Fetch(ctx context.Context, mode Mode, size int64, seed uint64) (Sample, error) {
	c, err := s.client(mode, size)
	if err != nil {
		return Sample{}, err
	}
	if err := s.prepare(ctx, mode); err != nil {
		return Sample{}, err
	}
	if mode == CDNCold {
		idle := s.cfg.CDNIdle
		if idle == 0 {
			idle = 5 * time.Second
		}
		if wait := time.Until(s.lastCDN.Add(idle + idle/5 + 100*time.Millisecond)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return Sample{}, ctx.Err()
			case <-t.C:
			}
		}
	}
	if mode == CDNDefault {
		// The sysctl first: its process start-up counts into the idle,
		// not on top of it.
		if err := s.originSSAI(ctx, "1"); err != nil {
			return Sample{}, err
		}
		idle := s.cfg.CDNIdle
		if idle == 0 {
			idle = 5 * time.Second
		}
		wait := s.cfg.CDNDefaultIdle
		if wait == 0 {
			wait = DefaultCDNDefaultIdle
		}
		if err := sleepCtx(ctx, time.Until(s.lastCDN.Add(min(wait, idle*2/3)))); err != nil {
			s.originSSAI(context.WithoutCancel(ctx), s.ssai)
			return Sample{}, err
		}
	}
	before := s.originConn.Load()
	cpu0 := s.cpuSnap()
	res, err := c.Object(ctx, size, seed)
	cpu := s.cpuSnap().since(cpu0)
	if isCDN(mode) {
		s.lastCDN = time.Now()
	}
	if mode == CDNDefault {
		if rerr := s.originSSAI(ctx, s.ssai); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return Sample{}, fmt.Errorf("%s %s: %w", mode, transfer.FormatSize(size), err)
	}
	if isCold(mode) {
		s.afterCold(ctx, mode)
	}
	return Sample{Mode: mode, Size: size, Result: res, NewOriginConn: s.originConn.Load() > before, CPU: cpu}, nil
}

// Sample is one fetch.
type Sample struct {
	Mode   Mode
	Size   int64
	Result transfer.Result
	// NewOriginConn: the origin accepted a connection during the fetch
	// (always for direct; for cdn-warm it means the connection was not warm).
	NewOriginConn bool
	// CPU is the processor time the fetch used (see CPU).
	CPU CPU
}

func (s *Scenario) client(mode Mode, size int64) (*transfer.Client, error) {
	if c, ok := s.clients[mode]; ok && (mode != Single && mode != Chain) {
		return c, nil
	}
	var fep string
	switch mode {
	case Single:
		fep = s.roles.Single
	case Chain, ChainCold, ChainPlain:
		mode, fep = Chain, s.roles.InP
	case CDNWarm, CDNCold, CDNDefault:
		return nil, fmt.Errorf("scenario: mode %s needs the CDN front-end (Config.CDN)", mode)
	default:
		return nil, fmt.Errorf("scenario: unknown mode %q", mode)
	}
	idx := -1
	for i, v := range s.cfg.Sizes {
		if v == size {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("scenario: size %d has no service listener (sizes: %v)", size, s.cfg.Sizes)
	}
	key := Mode(fmt.Sprintf("%s/%d", mode, idx))
	if c, ok := s.clients[key]; ok {
		return c, nil
	}
	c := &transfer.Client{Addr: s.addr(fep, servicePort+idx), Dial: s.clients[Direct].Dial}
	s.clients[key] = c
	return c, nil
}

// OriginRTT returns the configured client-origin RTT, and the bottleneck
// rate of the direct path in bytes per second (0: no rate limit).
func (s *Scenario) OriginRTT() (time.Duration, float64) {
	d := s.w.RTT(s.roles.Client, s.roles.Origin)
	l, err := s.w.Link(s.roles.Origin, s.roles.Client)
	if err != nil || l.RateMbit <= 0 {
		return d, 0
	}
	return d, l.RateMbit * 1e6 / 8
}

// Close stops the CDN front-end, the proxies and the origin and removes a
// temporary directory. The world stays up.
func (s *Scenario) Close() error {
	var errs []error
	if s.cdn != nil {
		errs = append(errs, s.cdn.Stop())
	}
	procs := slices.Clone(s.proxies)
	if s.ctl != nil && s.ctl.proc != nil {
		procs = append(procs, s.ctl.proc)
	}
	for _, p := range procs {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	for _, p := range procs {
		p.stop(false)
	}
	if s.cancel != nil {
		s.cancel()
		if s.originDone != nil {
			if err := <-s.originDone; err != nil {
				errs = append(errs, err)
			}
		}
	}
	if s.tempDir {
		os.RemoveAll(s.dir)
	}
	return errors.Join(errs...)
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// tune records the FEPs' own settings (restored for the plain chain of the
// cold modes) and applies Config.Tune in every FEP namespace.
func (s *Scenario) tune(ctx context.Context) error {
	t := s.cfg.Tune
	if t.InitCwnd < 0 || t.InitCwnd > 65535 || t.RmemInit < 0 {
		return fmt.Errorf("scenario: bad tuning %+v", t)
	}
	s.cold.route = make(map[string]string)
	s.cold.sysct = make(map[string]map[string]string)
	for _, f := range s.roles.FEPs {
		out, err := s.w.Command(ctx, f, "ip", "route", "show", emu.Prefix.String()).Output()
		if err != nil {
			return fmt.Errorf("scenario: routes of %s: %w", f, err)
		}
		s.cold.route[f] = strings.SplitN(string(out), "\n", 2)[0]
		s.cold.sysct[f] = make(map[string]string)
		for _, k := range []string{"net.ipv4.tcp_fastopen", "net.ipv4.tcp_rmem"} {
			out, err := s.w.Command(ctx, f, "sysctl", "-n", k).Output()
			if err != nil {
				return fmt.Errorf("scenario: sysctl %s on %s: %w", k, f, err)
			}
			s.cold.sysct[f][k] = strings.Join(strings.Fields(string(out)), " ")
		}
	}
	return s.applyTune(ctx, false)
}

// applyTune sets Config.Tune on every FEP, or (plain) restores the settings
// tune recorded.
func (s *Scenario) applyTune(ctx context.Context, plain bool) error {
	t := s.cfg.Tune
	sysctl := func(f, kv string) error {
		if out, err := s.w.Command(ctx, f, "sysctl", "-w", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("scenario: %s on %s: %v: %s", kv, f, err, out)
		}
		return nil
	}
	for _, f := range s.roles.FEPs {
		if plain {
			for k, v := range s.cold.sysct[f] {
				if err := sysctl(f, k+"="+v); err != nil {
					return err
				}
			}
			if t.InitCwnd > 0 {
				args := append([]string{"route", "change"}, strings.Fields(s.cold.route[f])...)
				if out, err := s.w.Command(ctx, f, "ip", args...).CombinedOutput(); err != nil {
					return fmt.Errorf("scenario: restore route on %s: %v: %s", f, err, out)
				}
			}
			continue
		}
		if err := s.tuneHost(ctx, f, s.cold.route[f]); err != nil {
			return err
		}
	}
	return nil
}

// tuneHost applies Config.Tune's kernel levers (Fast Open, route
// initcwnd/initrwnd, tcp_rmem) in host's namespace; route is the host's
// route to the world's prefix as `ip route show` printed it.
func (s *Scenario) tuneHost(ctx context.Context, f, route string) error {
	t := s.cfg.Tune
	sysctl := func(f, kv string) error {
		if out, err := s.w.Command(ctx, f, "sysctl", "-w", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("scenario: %s on %s: %v: %s", kv, f, err, out)
		}
		return nil
	}
	if t.FastOpen {
		if err := sysctl(f, "net.ipv4.tcp_fastopen=3"); err != nil {
			return err
		}
	}
	if t.InitCwnd > 0 {
		fields := strings.Fields(route)
		var args []string
		for i := 0; i < len(fields); i++ {
			if fields[i] == "initcwnd" || fields[i] == "initrwnd" {
				i++
				continue
			}
			args = append(args, fields[i])
		}
		if len(args) == 0 {
			return fmt.Errorf("scenario: %s has no route to %v", f, emu.Prefix)
		}
		n := strconv.Itoa(t.InitCwnd)
		args = append(append([]string{"route", "change"}, args...), "initcwnd", n, "initrwnd", n)
		if out, err := s.w.Command(ctx, f, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("scenario: set initcwnd on %s: %v: %s", f, err, out)
		}
	}
	if t.RmemInit > 0 {
		if err := sysctl(f, fmt.Sprintf("net.ipv4.tcp_rmem=4096 %d %d", t.RmemInit, max(t.RmemInit, emu.DefaultBufMax))); err != nil {
			return err
		}
	}
	return nil
}

// tuneOrigin records the origin's slow start after idle (CDNDefault sets
// it for its fetches) and applies Config.OriginWmem.
func (s *Scenario) tuneOrigin(ctx context.Context) error {
	o := s.roles.Origin
	out, err := s.w.Command(ctx, o, "sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle").Output()
	if err != nil {
		return fmt.Errorf("scenario: slow start after idle of %s: %w", o, err)
	}
	s.ssai = strings.TrimSpace(string(out))
	if n := s.cfg.OriginWmem; n > 0 {
		kv := fmt.Sprintf("net.ipv4.tcp_wmem=4096 %d %d", n, max(n, emu.DefaultBufMax))
		if out, err := s.w.Command(ctx, o, "sysctl", "-w", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("scenario: %s on %s: %v: %s", kv, o, err, out)
		}
	}
	return nil
}

// originSSAI sets tcp_slow_start_after_idle in the origin's namespace.
func (s *Scenario) originSSAI(ctx context.Context, v string) error {
	kv := "net.ipv4.tcp_slow_start_after_idle=" + v
	if out, err := s.w.Command(ctx, s.roles.Origin, "sysctl", "-w", kv).CombinedOutput(); err != nil {
		return fmt.Errorf("scenario: %s on %s: %v: %s", kv, s.roles.Origin, err, out)
	}
	return nil
}

// cdnHost is the host of the CDN front-end.
func (s *Scenario) cdnHost() string {
	if s.cfg.CDNHost != "" {
		return s.cfg.CDNHost
	}
	return s.roles.Client
}

// tuneCDN gives the CDN front-end's host the FEPs' kernel levers
// (Config.TuneCDN). It is not undone for the plain chain: the front-end
// keeps them in every mode. A FEP host has them already.
func (s *Scenario) tuneCDN(ctx context.Context) error {
	h := s.cdnHost()
	if !s.cfg.TuneCDN || !s.cfg.CDN || slices.Contains(s.roles.FEPs, h) {
		return nil
	}
	out, err := s.w.Command(ctx, h, "ip", "route", "show", emu.Prefix.String()).Output()
	if err != nil {
		return fmt.Errorf("scenario: routes of %s: %w", h, err)
	}
	return s.tuneHost(ctx, h, strings.SplitN(string(out), "\n", 2)[0])
}
