package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/router"
	"github.com/mosto-net/mosto/internal/topo"
	"github.com/mosto-net/mosto/internal/xagent"
)

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// runRouter runs the HTTP request router (seed 004) until ctx is cancelled.
func runRouter(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet(env, "router")
	listen := fs.String("listen", "", "HTTP listen address (host:port); empty runs only the DNS responder")
	mode := fs.String("mode", "302", "redirection: 302, proxy or handoff")
	var surrogates, near listFlag
	fs.Var(&surrogates, "surrogate", "a surrogate: NAME=HOST:PORT[@SITE] (repeat; SITE is a location of --rtt-matrix)")
	fs.Var(&near, "near", "a client location: PREFIX=NAME:MS,NAME:MS... (static RTTs) or PREFIX@SITE (RTTs from --rtt-matrix) (repeat)")
	matrix := fs.String("rtt-matrix", "", "RTT matrix for @SITE locations: a CSV file or \"wonderproxy\" (embedded)")
	site := fs.String("site", "", "proxy, handoff: the router's own site in --rtt-matrix; the response crosses the router, so surrogates are ranked by their RTT from it (the client's RTT to the router is the same for every surrogate) instead of by --near")
	dnsAddr := fs.String("dns", "", "also answer DNS queries on this UDP address (DNS-based redirection baseline)")
	dnsName := fs.String("dns-name", "cdn.mosto.test", "the name the DNS responder is authoritative for")
	dnsTTL := fs.Uint("dns-ttl", 5, "TTL of DNS answers in seconds")
	pool := fs.Int("pool", 8, "pre-established connections per surrogate (proxy, handoff); 0 for none")
	headerTimeout := fs.Duration("header-timeout", 10*time.Second, "time allowed for a complete request head (slowloris)")
	pinDir := fs.String("pin-dir", "", "handoff: bpffs directory pinning the translation, so handed-off sessions survive a killed router and a restarted one adopts them; \"off\" for none (default /sys/fs/bpf/mosto/net<netns>/router-<port>; a clean stop removes it)")
	placement := fs.String("placement", "rr", "handoff: where the response direction is translated: rr (this host) or surrogate (the surrogate's host, by its `mosto xagent`, when connected; else this host)")
	var agents listFlag
	fs.Var(&agents, "agent", "--placement surrogate: a surrogate's agent, SURROGATE_HOST=AGENT_HOST:PORT (repeat)")
	agentKey := fs.String("agent-key-file", "", "--placement surrogate: file with the key shared with the agents (at least 16 bytes)")
	fs.Usage = func() {
		fmt.Fprintln(env.Stderr, "usage: mosto router --listen ADDR --mode 302|proxy|handoff --surrogate NAME=HOST:PORT... [--near ...] [--dns ADDR]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected arguments %q", pos)
	}
	if *listen == "" && *dnsAddr == "" {
		return usageErrorf("--listen or --dns is required")
	}
	m, err := router.ParseMode(*mode)
	if err != nil {
		return usageErrorf("%v", err)
	}
	triangleSite := ""
	if *site != "" {
		if m == router.ModeRedirect {
			return usageErrorf("--site applies to proxy and handoff (a 302's client goes to the surrogate itself: use --near)")
		}
		if *placement == "surrogate" {
			// The response goes surrogate -> client: rank by the
			// triangle's RTT(router, surrogate) + RTT(surrogate, client).
			triangleSite = *site
		} else {
			near = siteNear(*site)
		}
	}
	pcfg, err := pickConfig(surrogates, near, *matrix, triangleSite)
	if err != nil {
		return usageErrorf("%v", err)
	}
	picker, err := router.NewPicker(pcfg)
	if err != nil {
		return usageErrorf("%v", err)
	}
	if *pool == 0 {
		*pool = -1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The listener is bound before the translation is opened: a restarted
	// router's adopted joins then do not hold the listening port.
	var ln net.Listener
	if *listen != "" {
		if ln, err = net.Listen("tcp", *listen); err != nil {
			return fmt.Errorf("router: %w", err)
		}
		defer ln.Close()
	}
	var placer *xagent.Placer
	switch *placement {
	case "rr":
		if len(agents) > 0 || *agentKey != "" {
			return usageErrorf("--agent and --agent-key-file need --placement surrogate")
		}
	case "surrogate":
		if m != router.ModeHandoff {
			return usageErrorf("--placement surrogate applies to --mode handoff")
		}
		if placer, err = newPlacer(env, agents, *agentKey); err != nil {
			return usageErrorf("%v", err)
		}
	default:
		return usageErrorf("--placement %q: want rr or surrogate", *placement)
	}
	var joiner router.Joiner
	if m == router.ModeHandoff {
		if *listen == "" {
			return usageErrorf("--mode handoff needs --listen")
		}
		pin, err := routerPinDir(*pinDir, *listen)
		if err != nil {
			return usageErrorf("%v", err)
		}
		j, closeJoiner, err := newJoiner(ctx, env, pin)
		if err != nil {
			return fmt.Errorf("router: handoff needs the kernel translation: %w", err)
		}
		defer closeJoiner()
		defer cancel()
		if placer != nil {
			placer.Start(ctx)
			defer placer.Wait()
			defer cancel()
			j.Placer = placer
			j.Triangle = picker.Triangle
			defer func() {
				placed, released := j.Placement()
				env.Log.Info("router: surrogate-side placement", "placed", placed, "released", released, "placer", fmt.Sprintf("%+v", placer.Stats()))
			}()
		}
		joiner = j
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	if *dnsAddr != "" {
		d, err := router.NewDNSServer(*dnsName, uint32(*dnsTTL), picker, env.Log)
		if err != nil {
			return err
		}
		pc, err := net.ListenPacket("udp", *dnsAddr)
		if err != nil {
			return fmt.Errorf("router: dns: %w", err)
		}
		env.Log.Info("dns responder", "addr", pc.LocalAddr().String(), "name", *dnsName)
		wg.Go(func() { errc <- d.Serve(ctx, pc) })
	}
	if *listen != "" {
		r, err := router.New(router.Config{Mode: m, Picker: picker, PoolSize: *pool, HeaderTimeout: *headerTimeout, Joiner: joiner}, env.Log)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		env.Log.Info("request router", "addr", ln.Addr().String(), "mode", m, "surrogates", len(pcfg.Surrogates))
		wg.Go(func() {
			errc <- r.Serve(ctx, ln)
			env.Log.Info("request router stopped", "stats", fmt.Sprintf("%+v", r.Stats()))
		})
	}
	err = <-errc
	cancel()
	wg.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// pickConfig builds the picker's configuration from the command line.
// triangleRanks ranks the surrogates of --placement surrogate: a handed-off
// answer goes surrogate -> client when that is shorter than through the
// router (RTT(s, c) < RTT(s, router) + RTT(router, c)), else through the
// router; cfg's client locations get RTT(router, s) plus the shorter leg,
// and cfg.Triangle says which placement each (client, surrogate) gets.
func triangleRanks(m *topo.Matrix, cfg *router.PickConfig, clientSites map[netip.Prefix]string, sites map[string]string, site string) error {
	from, err := router.LocationsFromMatrix(m, map[netip.Prefix]string{netip.MustParsePrefix("0.0.0.0/0"): site}, sites)
	if err != nil {
		return err
	}
	toRouter, err := router.LocationsFromMatrix(m, clientSites, map[string]string{"router": site})
	if err != nil {
		return err
	}
	rc := map[netip.Prefix]time.Duration{}
	for _, l := range toRouter {
		rc[l.Prefix] = l.RTT["router"]
	}
	cfg.Triangle = map[netip.Prefix]map[string]bool{}
	for _, l := range cfg.Locations {
		c, ok := rc[l.Prefix]
		if !ok {
			continue
		}
		cfg.Triangle[l.Prefix] = map[string]bool{}
		for name, sc := range l.RTT {
			rs := from[0].RTT[name]
			through := rs + c
			cfg.Triangle[l.Prefix][name] = sc < through
			l.RTT[name] = rs + min(sc, through)
		}
	}
	return nil
}

// siteNear places every client at the router's own site (--site): the
// picker then ranks surrogates by their RTT from the router.
func siteNear(site string) []string { return []string{"0.0.0.0/0@" + site, "::/0@" + site} }

// With triangleSite (the router's site, --placement surrogate), every
// client location's RTT to a surrogate gets the surrogate's RTT from that
// site added: the path of a handed-off answer is client -> router ->
// surrogate -> client.
func pickConfig(surrogates, near []string, matrix, triangleSite string) (router.PickConfig, error) {
	var cfg router.PickConfig
	sites := map[string]string{}
	for _, s := range surrogates {
		name, addr, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return cfg, fmt.Errorf("--surrogate %q: want NAME=HOST:PORT[@SITE]", s)
		}
		addr, site, hasSite := strings.Cut(addr, "@")
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return cfg, fmt.Errorf("--surrogate %q: %v", s, err)
		}
		if hasSite {
			sites[name] = site
		}
		cfg.Surrogates = append(cfg.Surrogates, router.Surrogate{Name: name, Addr: addr})
	}
	clientSites := map[netip.Prefix]string{}
	for _, n := range near {
		if p, site, ok := strings.Cut(n, "@"); ok {
			prefix, err := netip.ParsePrefix(p)
			if err != nil {
				return cfg, fmt.Errorf("--near %q: %v", n, err)
			}
			clientSites[prefix] = site
			continue
		}
		p, list, ok := strings.Cut(n, "=")
		prefix, err := netip.ParsePrefix(p)
		if !ok || err != nil {
			return cfg, fmt.Errorf("--near %q: want PREFIX=NAME:MS,... or PREFIX@SITE", n)
		}
		loc := router.Location{Prefix: prefix, RTT: map[string]time.Duration{}}
		for _, e := range strings.Split(list, ",") {
			name, ms, ok := strings.Cut(e, ":")
			v, err := strconv.ParseFloat(ms, 64)
			if !ok || err != nil || v < 0 {
				return cfg, fmt.Errorf("--near %q: entry %q: want NAME:MILLISECONDS", n, e)
			}
			loc.RTT[name] = time.Duration(v * float64(time.Millisecond))
		}
		cfg.Locations = append(cfg.Locations, loc)
	}
	if len(clientSites) > 0 {
		if matrix == "" {
			return cfg, errors.New("--near PREFIX@SITE needs --rtt-matrix")
		}
		if len(sites) != len(cfg.Surrogates) {
			return cfg, errors.New("--near PREFIX@SITE needs every --surrogate placed at a site (NAME=HOST:PORT@SITE)")
		}
		var m *topo.Matrix
		if matrix == "wonderproxy" {
			m = topo.WonderProxy()
		} else {
			var err error
			if m, _, err = topo.Load(matrix, ""); err != nil {
				return cfg, err
			}
		}
		locs, err := router.LocationsFromMatrix(m, clientSites, sites)
		if err != nil {
			return cfg, err
		}
		cfg.Locations = append(cfg.Locations, locs...)
		if triangleSite != "" {
			if err := triangleRanks(m, &cfg, clientSites, sites, triangleSite); err != nil {
				return cfg, err
			}
		}
	} else if triangleSite != "" {
		return cfg, errors.New("--site with --placement surrogate needs client locations (--near PREFIX@SITE)")
	}
	return cfg, nil
}
