package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/controller"
	"github.com/mosto-net/mosto/internal/etcdhttp"
	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/store"
	"github.com/mosto-net/mosto/internal/store/boltstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
)

// ControllerDBFile is the bbolt file of a single controller, under --data.
const ControllerDBFile = "controller.db"

// maxICW bounds --icw: a million segments is more than any route
// initcwnd a kernel accepts.
const maxICW = 1_000_000

// runController implements `mosto controller`: the chain controller's API
// server, and dispatches `mosto controller init`.
func runController(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 && args[0] == "init" {
		return runControllerInit(ctx, env, args[1:])
	}
	fs := newFlagSet(env, "controller")
	data := fs.String("data", "", "data directory: PKI from `mosto controller init`, tokens, and the bbolt store (required)")
	listen := fs.String("listen", ":7443", "API listen address")
	etcd := fs.String("etcd", "", "comma-separated etcd endpoints: share state with other controllers (leader election) instead of DIR/"+ControllerDBFile)
	etcdPrefix := fs.String("etcd-prefix", "/mosto/", "key prefix in etcd")
	etcdTLSFlags := addEtcdTLSFlags(fs)
	id := fs.String("id", "", "this controller's name in the leader election (default: hostname:listen)")
	period := fs.Duration("period", 5*time.Minute, "recompute tables at least this often")
	debounce := fs.Duration("debounce", time.Second, "wait this long after a change for more before recomputing")
	sizes := fs.String("sizes", "14KB,50KB,100KB,450KB,1MB,5MB,15MB", "transfer sizes tables carry a chain for")
	onPathFile := fs.String("onpath", "", "YAML file: paths through on-path relays (tproxy entries) whose interception the controller decides (docs/tts.md)")
	lopMap := fs.String("lop-map", "", "YAML file: lops (the FEPs acting as LoPs), inp (InP -> LoP overrides), egress (destination prefixes)")
	rotate := fs.Duration("key-rotation", 24*time.Hour, "rotate the hop HMAC key this often (0 disables)")
	keySwitch := fs.Duration("key-switch-after", 2*time.Minute, "a rotation publishes the new key (accept only) and signs with it once every LoP has it, or this long after a table with it is first served")
	memberCheck := fs.Bool("member-check", true, "refuse member addresses (hop_addr, probe_addr) that are names, special-purpose addresses, or not the address the FEP registers from (see --allow-member-net)")
	allowMembers := fs.String("allow-member-net", "", "comma-separated CIDR prefixes where member addresses may be anything (private networks, labs, NAT)")
	drainTimeout := fs.Duration("drain-timeout", 10*time.Second, "a FEP deletion first publishes tables whose chains avoid it and waits (at most this long) until every proxy holds them; negative: delete at once")
	lightBound := fs.Bool("light-bound", true, "refuse RTT reports below the speed of light in fibre between the two FEPs' coordinates")
	near := fs.Int("near", 8, "each FEP measures its N nearest peers")
	far := fs.Int("far", 2, "plus N far peers chosen by a stable hash")
	dests := fs.Int("dests", 8, "each destination with a probe address is measured by its N nearest FEPs (>= 1)")
	icw := fs.Int("icw", 10, "planner model: initial congestion window in segments of the links between proxies (the route initcwnd of the FEPs, or the window a pooled hop keeps)")
	mss := fs.Int("mss", 1460, "planner model: maximum segment size in bytes")
	endICW := fs.Int("end-icw", 0, "planner model: initial window in segments of the end segments (client - InP, EgP - origin: fresh connections) while the hops keep --icw; 0: the ends ramp like the hops (docs/planner.md)")
	endRTT := fs.Float64("end-rtt", 0, "planner model: RTT in `ms` assumed for each end segment (with --end-icw)")
	maxProxies := fs.Int("max-proxies", 0, "at most N intermediate proxies per chain (0 = default 4, negative = unlimited, at most 14)")
	insecure := fs.Bool("insecure", false, "serve plain HTTP without client authentication (labs and tests only)")
	ui := addUIFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto controller --data DIR [--listen :7443] [--etcd URLS [--etcd-ca FILE --etcd-cert FILE --etcd-key FILE]] [--period 5m] [--sizes LIST] [--lop-map FILE]\n       mosto controller init --data DIR [--hosts NAMES]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *data == "" {
		return usageErrorf("--data is required")
	}
	if *period <= 0 || *debounce <= 0 {
		return usageErrorf("--period and --debounce must be > 0")
	}
	if *dests < 1 {
		return usageErrorf("--dests %d: want >= 1 (FEPs measuring each destination)", *dests)
	}
	var sizeList []int64
	for _, s := range splitList(*sizes) {
		v, err := pathcomp.ParseSize(s)
		if err != nil {
			return usageErrorf("--sizes: %v", err)
		}
		if v <= 0 {
			return usageErrorf("--sizes: %s: want > 0", s)
		}
		sizeList = append(sizeList, v)
	}
	if *icw < 1 || *icw > maxICW || *mss < 1 || *mss > 65535 {
		return usageErrorf("--icw %d, --mss %d: want 1-%d segments and 1-65535 bytes", *icw, *mss, maxICW)
	}
	if *endICW < 0 || *endICW > maxICW || *endRTT < 0 || *endRTT > pathcomp.MaxRTT || *endRTT != *endRTT {
		return usageErrorf("--end-icw %d, --end-rtt %v: want 0-%d segments and 0-%v ms", *endICW, *endRTT, maxICW, float64(pathcomp.MaxRTT))
	}
	if *endRTT > 0 && *endICW == 0 {
		return usageErrorf("--end-rtt needs --end-icw (the ends' window)")
	}
	model := pathcomp.Model{ICW: *icw, MSS: *mss}
	if model == (pathcomp.Model{ICW: 10, MSS: 1460}) {
		model = pathcomp.Model{} // the default: tables stay as before
	}
	model.EndICW, model.EndRTT = *endICW, *endRTT
	var topo controller.Topology
	if *lopMap != "" {
		f, err := os.Open(*lopMap)
		if err != nil {
			return fmt.Errorf("lop map: %w", err)
		}
		topo, err = controller.ParseTopology(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("lop map %s: %w", *lopMap, err)
		}
	}
	opcfg, err := loadOnPath(*onPathFile)
	if err != nil {
		return err
	}
	keyRotation := *rotate
	if keyRotation == 0 {
		keyRotation = -1
	}
	// TLS and joins come from the PKI of `mosto controller init`.
	var ca *pki.CA
	if _, err := os.Stat(filepath.Join(pki.Dir(*data), "ca.crt")); err == nil {
		if ca, err = pki.LoadCA(*data); err != nil {
			return err
		}
	} else if !*insecure {
		return fmt.Errorf("no CA in %s: run `mosto controller init --data %s` first, or pass --insecure for plain HTTP", pki.Dir(*data), *data)
	}
	// Only now create the data directory (for the bbolt store), so a start
	// that fails on configuration leaves nothing behind.
	if err := os.MkdirAll(*data, 0o700); err != nil {
		return err
	}
	var initial *store.Keys
	if ks, err := pki.LoadOverlayKeys(filepath.Join(pki.Dir(*data), pki.OverlayKeysFile)); err == nil {
		initial = &store.Keys{Current: ks.Current.Secret, Rotated: ks.Rotated}
		if ks.Previous != nil {
			initial.Previous = ks.Previous.Secret
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	defer ln.Close()
	if *id == "" {
		host, _ := os.Hostname()
		*id = host + ":" + ln.Addr().String()
	}

	var st store.Store
	if *etcd != "" {
		tlsCfg, err := etcdTLSFlags.config()
		if err != nil {
			return err
		}
		es, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: splitList(*etcd), Prefix: *etcdPrefix, ID: *id, TLS: tlsCfg, Log: env.Log})
		if err != nil {
			return err
		}
		st = es
	} else {
		bs, err := boltstore.Open(filepath.Join(*data, ControllerDBFile), 2*time.Second)
		if err != nil {
			return fmt.Errorf("%w (is another controller running on %s?)", err, *data)
		}
		st = bs
	}
	defer st.Close()

	reg := metrics.NewRegistry()
	reg.RegisterRuntime()
	members := controller.MemberPolicy{Enforce: *memberCheck}
	for _, p := range strings.Split(*allowMembers, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return fmt.Errorf("--allow-member-net %q: %w", p, err)
		}
		members.Allow = append(members.Allow, pfx.Masked())
	}
	ctl, err := controller.New(controller.Config{
		Store:          st,
		Period:         *period,
		Debounce:       *debounce,
		Sizes:          sizeList,
		Topology:       topo,
		OnPath:         opcfg,
		Targets:        controller.TargetPolicy{Near: *near, Far: *far, Dests: *dests},
		Model:          model,
		MaxProxies:     *maxProxies,
		KeyRotation:    keyRotation,
		KeySwitchAfter: *keySwitch,
		LightBound:     *lightBound,
		DrainTimeout:   *drainTimeout,
		Members:        members,
		InitialKeys:    initial,
		Log:            env.Log,
		Metrics:        reg,
	})
	if err != nil {
		return err
	}
	scfg := api.ServerConfig{
		Backend: ctl,
		Metrics: metrics.Handler(reg),
		Log:     env.Log,
	}
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	scheme := "http"
	if ca != nil {
		tlsCfg, err := ca.ServerTLSConfig()
		if err != nil {
			return err
		}
		pki.RefuseRevoked(tlsCfg, ctl.Revoked)
		srv.TLSConfig = tlsCfg
		scfg.RequireClientCert = true
		scfg.Identity = func(r *http.Request) (string, bool) {
			id, err := pki.FEPFromRequest(r)
			return id, err == nil
		}
		scfg.Joiner = &pki.Joiner{CA: ca, Tokens: pki.DirTokenStore{Dir: pki.TokenDir(*data)}, Store: st}
		scheme = "https"
	}
	srv.Handler = api.NewHandler(scfg)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// SIGHUP asks the leader to recompute at once.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-runCtx.Done():
				return
			case <-hup:
				env.Log.Info("SIGHUP: recomputing")
				ctl.Trigger()
			}
		}
	}()
	storeKind := "bbolt"
	if *etcd != "" {
		storeKind = "etcd"
	}
	uis, err := startUI(runCtx, ui, ctl, storeKind, env.Log)
	if err != nil {
		return err
	}
	defer uis.stop()
	ctlDone := make(chan error, 1)
	go func() { ctlDone <- ctl.Run(runCtx) }()
	srvDone := make(chan error, 1)
	go func() {
		if ca != nil {
			srvDone <- srv.ServeTLS(ln, "", "")
		} else {
			srvDone <- srv.Serve(ln)
		}
	}()
	where := "bbolt " + filepath.Join(*data, ControllerDBFile)
	if *etcd != "" {
		where = "etcd " + *etcd
	}
	env.Log.Info("controller serving", "url", scheme+"://"+ln.Addr().String(), "store", where, "id", *id, "period", *period)

	var serveErr error
	ctlRunning := true
	select {
	case <-ctx.Done():
	case serveErr = <-srvDone:
	case serveErr = <-ctlDone:
		ctlRunning = false
		if serveErr == nil {
			serveErr = errors.New("controller stopped")
		}
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	if ctlRunning {
		<-ctlDone
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// etcdTLSFlags are the flags of a TLS connection to etcd (https endpoints).
type etcdTLSFlags struct{ ca, cert, key *string }

func addEtcdTLSFlags(fs *flag.FlagSet) etcdTLSFlags {
	return etcdTLSFlags{
		ca:   fs.String("etcd-ca", "", "PEM file of etcd's CA (https endpoints; default the system roots)"),
		cert: fs.String("etcd-cert", "", "PEM client certificate for etcd (with --etcd-key)"),
		key:  fs.String("etcd-key", "", "PEM key of --etcd-cert"),
	}
}

// config returns the TLS configuration, or nil if no flag was given.
func (f etcdTLSFlags) config() (*tls.Config, error) {
	if *f.ca == "" && *f.cert == "" && *f.key == "" {
		return nil, nil
	}
	cfg, err := etcdhttp.TLSConfig(*f.ca, *f.cert, *f.key)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return cfg, nil
}
