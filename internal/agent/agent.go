package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/atomicfile"
	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/probe"
)

// Config configures an Agent. It is the `controller:` section of a proxy
// configuration.
type Config struct {
	// Controller is the base URL of the controller API, https://host:port.
	// http:// is accepted for tests and labs only: no join, no TLS.
	Controller string
	// Token is a join token from `mosto token create`; needed only until
	// the FEP has joined (its certificate is in DataDir).
	Token string
	// DataDir holds fep.key, fep.crt, ca.crt and the last table (table.json).
	DataDir string
	// FEP describes this proxy to the controller.
	FEP api.FEP
	// LoP is the lookup proxy whose table this FEP uses; empty means FEP.ID.
	LoP string
	// ProbeListen is the UDP address of the measurement endpoint; empty
	// means FEP.ProbeAddr, "off" runs none.
	ProbeListen string
	// Probe configures the prober (interval, window, threshold...).
	Probe probe.Config
	// DestMeasurer measures the RTT to the destinations the controller
	// asks this FEP to measure (for the choice of their EgP); nil means a
	// TCP handshake (probe.TCPHandshake). The rest of that prober's
	// configuration is Probe's.
	DestMeasurer probe.Measurer
	// ProbeConn, if set, is the measurement endpoint's socket, already
	// bound (socket activation): ProbeListen is then not bound.
	ProbeConn net.PacketConn
	// ProbeServer bounds the measurement endpoint.
	ProbeServer probe.ServerConfig
	// TargetsEvery is how often the peer list is fetched again; 0 means 1m.
	TargetsEvery time.Duration
	// Wait is the long-poll wait of a table request; 0 means 30s.
	Wait time.Duration
	// Stats, if set, returns the proxy's relay counters, pushed to the
	// controller every StatsEvery (StatsFrom reads them from the daemon's
	// registry); nil: none are pushed.
	Stats func() *api.ProxyStats
	// Segments, if set, returns what this FEP's on-path relay observed on
	// the legs it relayed since the last call (docs/tts.md), pushed with
	// the counters every StatsEvery.
	Segments func() []api.SegmentSample
	// StatsEvery is the period of the counters push; 0 means 5s.
	StatsEvery time.Duration
	// OnUpdate, if set, is called with every new snapshot (also the one
	// loaded from disk, from New), from one goroutine at a time.
	OnUpdate func(*Snapshot)
}

// Agent is the controller client of one FEP.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	snap atomic.Pointer[Snapshot]

	updMu sync.Mutex // serializes swap + OnUpdate + persist

	reregister chan struct{}
	retarget   chan struct{} // a new table: fetch the targets again
	prober     *probe.Prober
	destProber *probe.Prober // RTTs to destinations
	probeSrv   *probe.Server
}

// ErrRefused is wrapped by Run's error when the controller refuses this
// FEP for good (bad or expired token, certificate for another FEP).
var ErrRefused = errors.New("agent: refused by the controller")

// New checks cfg and loads the last persisted table, so Lookup answers at
// once even when the controller is unreachable. log may be nil.
func New(cfg Config, log *slog.Logger) (*Agent, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	u, err := url.Parse(cfg.Controller)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("agent: controller %q: want https://host:port", cfg.Controller)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("agent: data directory required")
	}
	if err := cfg.FEP.Validate(); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err := pki.ValidFEPID(cfg.FEP.ID); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if cfg.LoP == "" {
		cfg.LoP = cfg.FEP.ID
	}
	if cfg.ProbeListen == "" {
		cfg.ProbeListen = cfg.FEP.ProbeAddr
	}
	if cfg.TargetsEvery <= 0 {
		cfg.TargetsEvery = time.Minute
	}
	if cfg.Wait <= 0 {
		cfg.Wait = api.DefaultWaitPoll
	}
	if cfg.StatsEvery <= 0 {
		cfg.StatsEvery = 5 * time.Second
	}
	if cfg.Token != "" {
		if _, err := pki.ParseToken(cfg.Token); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a := &Agent{
		cfg:        cfg,
		log:        log.With("fep", cfg.FEP.ID),
		reregister: make(chan struct{}, 1),
		retarget:   make(chan struct{}, 1),
	}
	// Probes are tagged with the overlay key of the current table (none
	// before the first table: then they go untagged).
	switch m := cfg.Probe.Measurer.(type) {
	case nil:
		cfg.Probe.Measurer = &probe.UDPEcho{Keys: a.probeKeys}
	case *probe.UDPEcho:
		if m.Keys == nil {
			m.Keys = a.probeKeys
		}
	}
	a.prober = probe.NewProber(cfg.Probe, a.log)
	dcfg := cfg.Probe
	dcfg.Measurer = cfg.DestMeasurer
	if dcfg.Measurer == nil {
		dcfg.Measurer = probe.TCPHandshake{}
	}
	a.destProber = probe.NewProber(dcfg, a.log.With("probing", "destinations"))
	if cfg.ProbeListen != "off" || cfg.ProbeConn != nil {
		if cfg.ProbeServer.Keys == nil {
			cfg.ProbeServer.Keys = a.probeKeys
		}
		a.probeSrv = probe.NewServer(cfg.ProbeServer, a.log)
	}
	a.cfg = cfg
	if err := a.loadTable(); err != nil {
		a.log.Warn("ignoring the persisted table", "err", err)
	}
	return a, nil
}

// Lookup returns the chain for a transfer of size bytes between two FEPs
// from the current table; it satisfies relay.ChainSource.
func (a *Agent) Lookup(from, to string, size int64) (pathcomp.ChainEntry, bool) {
	s := a.snap.Load()
	if s == nil {
		return pathcomp.ChainEntry{}, false
	}
	return s.Index.Lookup(from, to, size)
}

// Members returns the member list of the current table (FEP id -> hop
// address); nil before the first table. Do not modify it.
func (a *Agent) Members() map[string]string {
	if s := a.snap.Load(); s != nil {
		return s.Members
	}
	return nil
}

// MemberPolicy returns the controller's member policy from the current
// table (relay syntax; nil: none or no table yet). Do not modify it.
func (a *Agent) MemberPolicy() []string {
	if s := a.snap.Load(); s != nil {
		return s.MemberAllow
	}
	return nil
}

// Keys returns the overlay keyring of the current table, or nil.
func (a *Agent) Keys() *hop.Keyring {
	if s := a.snap.Load(); s != nil {
		return s.Keyring
	}
	return nil
}

// Version returns the version of the current table (0: none).
func (a *Agent) Version() uint64 {
	if s := a.snap.Load(); s != nil {
		return s.Version
	}
	return 0
}

// Snapshot returns the current snapshot, or nil.
func (a *Agent) Snapshot() *Snapshot { return a.snap.Load() }

// probeKeys returns the probe keys of the current table, or nil.
func (a *Agent) probeKeys() []probe.Key {
	if s := a.snap.Load(); s != nil {
		return s.ProbeKeys
	}
	return nil
}

// Estimates returns the prober's current RTT estimates per peer.
func (a *Agent) Estimates() map[string]time.Duration { return a.prober.Estimates() }

// DestEstimates returns the current RTT estimates per destination.
func (a *Agent) DestEstimates() map[string]time.Duration { return a.destProber.Estimates() }

// ProbeStats returns the counters of the measurement endpoint.
func (a *Agent) ProbeStats() probe.ServerStats {
	if a.probeSrv == nil {
		return probe.ServerStats{}
	}
	return a.probeSrv.Stats()
}

func (a *Agent) path(name string) string { return filepath.Join(a.cfg.DataDir, name) }

func (a *Agent) loadTable() error {
	b, err := os.ReadFile(a.path(tableFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	t, err := decodeTable(b)
	if err != nil {
		return fmt.Errorf("%s: %w", tableFile, err)
	}
	s, err := newSnapshot(t, a.cfg.LoP)
	if err != nil {
		return fmt.Errorf("%s: %w", tableFile, err)
	}
	a.install(s, false)
	a.log.Info("loaded persisted table", "version", s.Version, "chains", len(t.Table.Chains))
	return nil
}

// install swaps s in if it is newer than the current snapshot: it first
// writes it to disk (when persist), so a version Version reports survives a
// restart, then swaps it and calls OnUpdate. It reports whether it swapped.
func (a *Agent) install(s *Snapshot, persist bool) bool {
	a.updMu.Lock()
	defer a.updMu.Unlock()
	// Versions only compare within one epoch of the controller's store: a
	// table of another epoch (the store was lost or replaced, versions
	// started again) replaces the current one.
	if cur := a.snap.Load(); cur != nil && s.Version <= cur.Version && (s.Epoch == "" || s.Epoch == cur.Epoch) {
		return false
	}
	if persist {
		b, err := json.Marshal(s.Table)
		if err == nil {
			err = atomicfile.Write(a.path(tableFile), append(b, '\n'), 0o600)
		}
		if err != nil {
			a.log.Warn("cannot persist table; a restart without controller would lose it", "version", s.Version, "err", err)
		}
	}
	a.snap.Store(s)
	if a.cfg.OnUpdate != nil {
		a.cfg.OnUpdate(s)
	}
	return true
}

// Run joins if needed, registers, and then measures, reports and watches
// the table until ctx ends (it returns nil then). While the controller is
// unreachable it retries with backoff and keeps the current table. It
// returns an error wrapping ErrRefused when the controller refuses the join
// token or the certificate. Call Run once.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if a.probeSrv != nil {
		// Bind before anything else so a busy port is reported at once.
		lcfg := a.cfg.ProbeListen
		errc := make(chan error, 1)
		ready := make(chan struct{})
		wg.Go(func() { errc <- a.serveProbe(ctx, lcfg, ready) })
		select {
		case err := <-errc:
			return err
		case <-ready:
		}
	}
	client, err := a.connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer client.HTTP.CloseIdleConnections()
	if err := a.register(ctx, client); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	wg.Go(func() { a.watchTargets(ctx, client) })
	wg.Go(func() { a.prober.Run(ctx, a.reporter(client, false)) })
	wg.Go(func() { a.destProber.Run(ctx, a.reporter(client, true)) })
	wg.Go(func() { a.watchTable(ctx, client) })
	if a.cfg.Stats != nil || a.cfg.Segments != nil {
		wg.Go(func() { a.pushStats(ctx, client) })
	}
	<-ctx.Done()
	return nil
}

func (a *Agent) serveProbe(ctx context.Context, addr string, ready chan<- struct{}) error {
	pc := a.cfg.ProbeConn
	if pc == nil {
		var lc net.ListenConfig
		var err error
		if pc, err = lc.ListenPacket(ctx, "udp", addr); err != nil {
			return fmt.Errorf("agent: probe endpoint: %w", err)
		}
	}
	close(ready)
	return a.probeSrv.Serve(ctx, pc)
}

// connect returns an API client, joining first when there is no
// certificate in the data directory.
func (a *Agent) connect(ctx context.Context) (*api.Client, error) {
	if u, _ := url.Parse(a.cfg.Controller); u.Scheme == "http" {
		a.log.Warn("controller URL is plain http: no authentication, no encryption")
		return &api.Client{BaseURL: a.cfg.Controller, HTTP: &http.Client{}}, nil
	}
	if _, err := os.Stat(a.path(certFile)); errors.Is(err, os.ErrNotExist) {
		if err := a.joinRetry(ctx); err != nil {
			return nil, err
		}
	}
	caPEM, err := os.ReadFile(a.path(caFile))
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	certPEM, err := os.ReadFile(a.path(certFile))
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	keyPEM, err := os.ReadFile(a.path(keyFile))
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	cert, err := pki.ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: %w", certFile, err)
	}
	if id, err := pki.FEPFromCert(cert); err != nil || id != a.cfg.FEP.ID {
		return nil, fmt.Errorf("%w: %s is for FEP %q (%v), this is %q", ErrRefused, certFile, id, err, a.cfg.FEP.ID)
	}
	if left := time.Until(cert.NotAfter); left < 30*24*time.Hour {
		a.log.Warn("FEP certificate expires soon; join again with a new token", "not_after", cert.NotAfter)
	}
	tcfg, err := pki.ClientTLSConfig(caPEM, certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	return &api.Client{BaseURL: a.cfg.Controller, HTTP: httpClient(tcfg)}, nil
}

func httpClient(tcfg *tls.Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tcfg
	tr.MaxIdleConnsPerHost = 4
	return &http.Client{Transport: tr}
}

// joinRetry joins, retrying transient failures with backoff.
func (a *Agent) joinRetry(ctx context.Context) error {
	if a.cfg.Token == "" {
		return fmt.Errorf("%w: not joined yet (no %s in %s) and no join token given", ErrRefused, certFile, a.cfg.DataDir)
	}
	b := newBackoff()
	for {
		err := a.join(ctx)
		if err == nil {
			return nil
		}
		var se *api.StatusError
		if errors.As(err, &se) && se.Code/100 == 4 || errors.Is(err, ErrRefused) || errors.Is(err, pki.ErrPin) {
			return fmt.Errorf("%w: join: %w", ErrRefused, err)
		}
		a.log.Warn("join failed; retrying", "err", err)
		if !b.wait(ctx) {
			return ctx.Err()
		}
	}
}

// join makes a key and CSR, presents the token and stores the result.
func (a *Agent) join(ctx context.Context) error {
	tok, err := pki.ParseToken(a.cfg.Token)
	if err != nil {
		return err
	}
	key, keyPEM, err := pki.GenerateKey()
	if err != nil {
		return err
	}
	csr, err := pki.NewCSR(key, a.cfg.FEP.ID)
	if err != nil {
		return err
	}
	c := &api.Client{BaseURL: a.cfg.Controller, HTTP: httpClient(pki.JoinTLSConfig(tok.CAHash))}
	defer c.HTTP.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := c.Join(ctx, api.JoinRequest{Token: a.cfg.Token, FEP: a.cfg.FEP, CSRPEM: string(csr)})
	if err != nil {
		return err
	}
	if err := pki.CheckCAPin([]byte(resp.CAPEM), tok.CAHash); err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	cert, err := pki.ParseCertPEM([]byte(resp.CertPEM))
	if err != nil {
		return fmt.Errorf("%w: certificate: %w", ErrRefused, err)
	}
	if !publicKeyMatches(cert, key) {
		return fmt.Errorf("%w: the certificate is not for our key", ErrRefused)
	}
	if id, err := pki.FEPFromCert(cert); err != nil || id != a.cfg.FEP.ID {
		return fmt.Errorf("%w: certificate names FEP %q (%v), want %q", ErrRefused, id, err, a.cfg.FEP.ID)
	}
	// The key first, the certificate last: its presence means "joined".
	if err := atomicfile.Write(a.path(keyFile), keyPEM, 0o600); err != nil {
		return err
	}
	if err := atomicfile.Write(a.path(caFile), []byte(resp.CAPEM), 0o644); err != nil {
		return err
	}
	if err := atomicfile.Write(a.path(certFile), []byte(resp.CertPEM), 0o644); err != nil {
		return err
	}
	a.log.Info("joined the overlay", "controller", a.cfg.Controller, "not_after", cert.NotAfter)
	return nil
}

// register announces the FEP, retrying transient failures.
func (a *Agent) register(ctx context.Context, c *api.Client) error {
	b := newBackoff()
	for {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := c.RegisterFEP(rctx, a.cfg.FEP)
		cancel()
		if err == nil {
			a.log.Info("registered", "hop_addr", a.cfg.FEP.HopAddr, "probe_addr", a.cfg.FEP.ProbeAddr)
			return nil
		}
		var se *api.StatusError
		if errors.As(err, &se) && (se.Code == http.StatusBadRequest || se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden) {
			return fmt.Errorf("%w: register: %w", ErrRefused, err)
		}
		a.log.Warn("register failed; retrying", "err", err)
		if !b.wait(ctx) {
			return ctx.Err()
		}
	}
}

// watchTargets fetches the peers and destinations to measure every
// TargetsEvery and after every new table, and re-registers when a report
// tells the controller forgot this FEP.
func (a *Agent) watchTargets(ctx context.Context, c *api.Client) {
	b := newBackoff()
	var last []probe.Target // peers and destinations last set
	for {
		tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		ts, err := c.TargetsAndDestinations(tctx, a.cfg.FEP.ID)
		cancel()
		next := a.cfg.TargetsEvery
		if err != nil {
			a.log.Warn("cannot fetch probe targets", "err", err)
			next = b.next()
			var se *api.StatusError
			if errors.As(err, &se) && se.Code == http.StatusNotFound {
				a.wantRegister() // the controller forgot this FEP
			}
		} else {
			b.reset()
			pts := make([]probe.Target, 0, len(ts.Targets))
			for _, t := range ts.Targets {
				if t.ID != a.cfg.FEP.ID {
					pts = append(pts, probe.Target{ID: t.ID, Addr: t.ProbeAddr})
				}
			}
			a.prober.SetTargets(pts)
			dts := make([]probe.Target, 0, len(ts.Destinations))
			for _, d := range ts.Destinations {
				dts = append(dts, probe.Target{ID: d.ID, Addr: d.ProbeAddr})
			}
			a.destProber.SetTargets(dts)
			if all := append(slices.Clone(pts), dts...); !slices.Equal(all, last) {
				// A post-mortem reads what this FEP was asked to measure.
				a.log.Info("probe targets", "peers", len(pts), "destinations", len(dts))
				last = all
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		case <-a.retarget:
		case <-a.reregister:
			if err := a.register(ctx, c); err != nil {
				if ctx.Err() == nil {
					a.log.Error("re-register refused", "err", err)
				}
			}
		}
	}
}

// reporter returns a prober's report callback: samples are RTTs to peers
// (or the report that a peer is unreachable), or to destinations when dests
// (the API has no unreachable destination: such samples are dropped, and the
// destination keeps its last RTT).
func (a *Agent) reporter(c *api.Client, dests bool) probe.ReportFunc {
	return func(ctx context.Context, samples []probe.Sample) error {
		rep := api.Report{FEP: a.cfg.FEP.ID}
		for _, s := range samples {
			ms, at := float64(s.RTT)/float64(time.Millisecond), s.At.UTC()
			switch {
			case dests && s.Unreachable:
			case dests:
				rep.Destinations = append(rep.Destinations, api.DestSample{Dest: s.Peer, RTTMS: ms, At: at})
			case s.Unreachable:
				rep.Samples = append(rep.Samples, api.Sample{Peer: s.Peer, At: at, Unreachable: true})
			default:
				rep.Samples = append(rep.Samples, api.Sample{Peer: s.Peer, RTTMS: ms, At: at})
			}
		}
		if len(rep.Samples) == 0 && len(rep.Destinations) == 0 {
			return nil // only unreachable destinations: nothing to send
		}
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		_, err := c.Report(ctx, rep)
		var se *api.StatusError
		if errors.As(err, &se) && se.Code == http.StatusBadRequest && strings.Contains(se.Message, "unreachable") {
			// A controller older than the unreachable field refuses it:
			// send the RTTs without it rather than none at all.
			var kept []api.Sample
			for _, s := range rep.Samples {
				if !s.Unreachable {
					kept = append(kept, s)
				}
			}
			if len(kept) < len(rep.Samples) {
				a.log.Warn("controller refuses unreachable samples (older version?); reporting RTTs only", "err", err)
				rep.Samples = kept
				if len(rep.Samples) == 0 && len(rep.Destinations) == 0 {
					return nil
				}
				_, err = c.Report(ctx, rep)
			}
		}
		if errors.As(err, &se) && se.Code == http.StatusForbidden {
			a.wantRegister() // an unregistered FEP's reports are refused
		}
		return err
	}
}

// wantRegister asks the targets loop to register the FEP again.
func (a *Agent) wantRegister() {
	select {
	case a.reregister <- struct{}{}:
	default:
	}
}

// watchTable long-polls the LoP's table and installs every newer valid
// version. A table that fails validation is skipped (logged) and the
// current one kept.
func (a *Agent) watchTable(ctx context.Context, c *api.Client) {
	b := newBackoff()
	since := a.Version()
	for {
		tctx, cancel := context.WithTimeout(ctx, a.cfg.Wait+15*time.Second)
		epoch := ""
		if s := a.snap.Load(); s != nil {
			epoch = s.Epoch
		}
		t, err := c.TableEpoch(tctx, a.cfg.LoP, since, epoch, a.cfg.Wait)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			a.log.Warn("table watch failed; keeping the current table", "version", a.Version(), "err", err)
			if !b.wait(ctx) {
				return
			}
			continue
		}
		b.reset()
		if t == nil {
			continue // no newer version within the wait
		}
		s, err := newSnapshot(t, a.cfg.LoP)
		if err != nil {
			a.log.Warn("refusing an invalid table; keeping the current one", "version", t.Version, "err", err)
			if cur := a.snap.Load(); cur == nil || t.Epoch == "" || t.Epoch == cur.Epoch {
				since = max(since, t.Version)
			}
			continue
		}
		if a.install(s, true) {
			a.log.Info("new table", "version", s.Version, "chains", len(t.Table.Chains), "members", len(s.Members))
			// A new table follows a change of the overlay (FEPs,
			// destinations): the targets may have changed too.
			select {
			case a.retarget <- struct{}{}:
			default:
			}
		}
		since = a.Version()
	}
}

// backoff is an exponential backoff with full jitter, 200 ms to 30 s.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 200 * time.Millisecond} }

func (b *backoff) reset() { b.d = 200 * time.Millisecond }

func (b *backoff) next() time.Duration {
	d := b.d/2 + rand.N(b.d/2+1)
	b.d = min(b.d*2, 30*time.Second)
	return d
}

func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
