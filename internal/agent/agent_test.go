package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	ctlpkg "github.com/mosto-net/mosto/internal/controller"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/probe"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/testenv"
)

// fakeBackend is a controller with just enough behaviour for the agent:
// registration, targets, reports (refused from unregistered FEPs) and
// versioned tables with long-poll.
type fakeBackend struct {
	mu       sync.Mutex
	feps     map[string]api.FEP
	targets  map[string][]api.Target
	reports  []api.Report
	tables   map[string]*api.Table
	changed  chan struct{}
	stale    *api.Table // when set, served whatever since says (a broken controller)
	served   atomic.Int64
	regCount atomic.Int64
}

func newFakeBackend() *fakeBackend {
	return &fakeBackend{
		feps:    map[string]api.FEP{},
		targets: map[string][]api.Target{},
		tables:  map[string]*api.Table{},
		changed: make(chan struct{}),
	}
}

func (f *fakeBackend) publish(t *api.Table) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tables[t.LoP] = t
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeBackend) RegisterFEP(ctx context.Context, fep api.FEP) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.feps[fep.ID] = fep
	f.regCount.Add(1)
	return nil
}

func (f *fakeBackend) DeleteFEP(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.feps, id)
	return nil
}

func (f *fakeBackend) FEPs(ctx context.Context) ([]api.FEP, error) { return nil, nil }

func (f *fakeBackend) Targets(ctx context.Context, id string) ([]api.Target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.feps[id]; !ok {
		return nil, fmt.Errorf("%w: fep %s", api.ErrNotFound, id)
	}
	return f.targets[id], nil
}

func (f *fakeBackend) DestTargets(ctx context.Context, id string) ([]api.DestTarget, error) {
	return nil, nil
}

func (f *fakeBackend) RegisterDestination(ctx context.Context, d api.Destination) error { return nil }

func (f *fakeBackend) DeleteDestination(ctx context.Context, id string) error { return api.ErrNotFound }

func (f *fakeBackend) Destinations(ctx context.Context) ([]api.DestinationStatus, error) {
	return nil, nil
}

func (f *fakeBackend) Report(ctx context.Context, r api.Report) (api.ReportResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.feps[r.FEP]; !ok {
		return api.ReportResult{}, fmt.Errorf("%w: fep %s is not registered", api.ErrForbidden, r.FEP)
	}
	f.reports = append(f.reports, r)
	return api.ReportResult{Accepted: len(r.Samples)}, nil
}

func (f *fakeBackend) WaitTable(ctx context.Context, lop string, since uint64, epoch string) (*api.EncodedTable, error) {
	for {
		f.mu.Lock()
		t := f.tables[lop]
		if f.stale != nil {
			t = f.stale
		} else if t != nil && t.Version <= since {
			t = nil
		}
		ch := f.changed
		f.mu.Unlock()
		if t != nil {
			b, err := json.Marshal(t)
			if err != nil {
				return nil, err
			}
			f.served.Add(1)
			return &api.EncodedTable{Version: t.Version, JSON: func() []byte { return b }}, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

func (f *fakeBackend) Matrix(ctx context.Context) (api.Matrix, error) { return api.Matrix{}, nil }
func (f *fakeBackend) Health(ctx context.Context) api.Health          { return api.Health{Status: "ok"} }

func (f *fakeBackend) reportedPeers(fep string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.reports {
		if r.FEP != fep {
			continue
		}
		for _, s := range r.Samples {
			if !slices.Contains(out, s.Peer) {
				out = append(out, s.Peer)
			}
		}
	}
	slices.Sort(out)
	return out
}

// controller is a TLS controller API (the real api handler, the real pki)
// over a fake backend.
type controller struct {
	ca    *pki.CA
	store pki.DirTokenStore
	fb    *fakeBackend
	srv   *httptest.Server
}

func newController(t *testing.T) *controller {
	t.Helper()
	dir := t.TempDir()
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &controller{ca: ca, store: pki.DirTokenStore{Dir: pki.TokenDir(dir)}, fb: newFakeBackend()}
	h := api.NewHandler(api.ServerConfig{
		Backend:           c.fb,
		Joiner:            &pki.Joiner{CA: ca, Tokens: c.store},
		RequireClientCert: true,
	})
	tcfg, err := ca.ServerTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	c.srv = httptest.NewUnstartedServer(h)
	c.srv.TLS = tcfg
	c.srv.StartTLS()
	t.Cleanup(c.srv.Close)
	return c
}

func (c *controller) token(t *testing.T, opt pki.TokenOptions) string {
	t.Helper()
	tok, _, err := c.ca.CreateToken(context.Background(), c.store, opt)
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

func testTable(t *testing.T, lop string, version uint64, keys pki.OverlayKeys) *api.Table {
	return testTableB(t, keys, lop, version)
}

var benchNow = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func testTableB(t testing.TB, keys pki.OverlayKeys, args ...any) *api.Table {
	t.Helper()
	lop, version := "fra", uint64(1)
	if len(args) == 2 {
		lop, version = args[0].(string), args[1].(uint64)
	}
	return &api.Table{
		LoP:     lop,
		Version: version,
		Keys:    api.Keys{Current: ctlpkg.FEPKeyOf(keys.Current.Secret, lop, []string{"fra", "par", "ams"})},
		Members: map[string]string{"fra": "127.0.0.1:1", "par": "127.0.0.1:2", "ams": "127.0.0.1:3"},
		Table: pathcomp.TableFile{
			Version:   version,
			Locations: []string{"fra", "par", "ams"},
			Chains: []pathcomp.ChainEntry{
				{From: "fra", To: "ams", Size: 14000, Rounds: 1, Path: []string{"fra", "ams"}},
				{From: "fra", To: "ams", Size: 1 << 20, Rounds: 7, Path: []string{"fra", "par", "ams"}},
			},
		},
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startAgent(t *testing.T, cfg Config) (*Agent, func() error) {
	t.Helper()
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := a.Run(ctx)
		if err != nil && ctx.Err() == nil {
			// Say so at once, not as a later timeout waiting for its work.
			t.Errorf("agent %s: Run ended: %v", cfg.FEP.ID, err)
		}
		done <- err
	}()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				runErr = errors.New("Run did not return 10 s after cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	return a, stop
}

func fepConfig(c *controller, dir, token string) Config {
	return Config{
		Controller:  c.srv.URL,
		Token:       token,
		DataDir:     dir,
		FEP:         api.FEP{ID: "fra", HopAddr: "127.0.0.1:1", ProbeAddr: "127.0.0.1:9", Lat: 50.1, Lon: 8.7},
		ProbeListen: "127.0.0.1:0",
		Probe:       probe.Config{Interval: 50 * time.Millisecond, Jitter: -1, Probes: 1},
		Wait:        2 * time.Second,
	}
}

func TestAgentJoinReportWatchPersist(t *testing.T) {
	c := newController(t)
	keys, err := pki.NewOverlayKeys(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// A peer's measurement endpoint for the prober.
	peer := probe.NewServer(probe.ServerConfig{}, nil)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pctx, pstop := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- peer.Serve(pctx, pc) }()
	t.Cleanup(func() { pstop(); <-pdone })
	c.fb.targets["fra"] = []api.Target{{ID: "par", ProbeAddr: pc.LocalAddr().String(), Reason: "near"}}

	dir := t.TempDir()
	var updates atomic.Int64
	cfg := fepConfig(c, dir, c.token(t, pki.TokenOptions{FEP: "fra"}))
	cfg.OnUpdate = func(*Snapshot) { updates.Add(1) }
	a, stop := startAgent(t, cfg)

	eventually(t, "a report about par", func() bool { return slices.Equal(c.fb.reportedPeers("fra"), []string{"par"}) })
	if _, err := os.Stat(filepath.Join(dir, certFile)); err != nil {
		t.Fatalf("no certificate after join: %v", err)
	}
	if est := a.Estimates()["par"]; est <= 0 || est > time.Second {
		t.Errorf("estimate for par = %v", est)
	}

	c.fb.publish(testTable(t, "fra", 1, keys))
	eventually(t, "version 1", func() bool { return a.Version() == 1 })
	if e, ok := a.Lookup("fra", "ams", 1<<20); !ok || !slices.Equal(e.Path, []string{"fra", "par", "ams"}) {
		t.Errorf("Lookup(fra, ams, 1 MiB) = %v, %v", e.Path, ok)
	}
	if e, ok := a.Lookup("fra", "ams", 1000); !ok || !slices.Equal(e.Path, []string{"fra", "ams"}) {
		t.Errorf("Lookup(fra, ams, 1000) = %v, %v", e.Path, ok)
	}
	if a.Members()["par"] != "127.0.0.1:2" {
		t.Errorf("Members() = %v", a.Members())
	}
	if kr := a.Keys(); kr == nil || kr.CurrentID() != keys.Current.ID {
		t.Errorf("Keys() = %v; want current id %d", kr, keys.Current.ID)
	}

	c.fb.publish(testTable(t, "fra", 3, keys))
	eventually(t, "version 3", func() bool { return a.Version() == 3 })

	// A broken controller serves an older version: the agent never goes back.
	c.fb.mu.Lock()
	c.fb.stale = testTable(t, "fra", 2, keys)
	c.fb.mu.Unlock()
	n := c.fb.served.Load()
	eventually(t, "the stale table served", func() bool { return c.fb.served.Load() > n+1 })
	if v := a.Version(); v != 3 {
		t.Fatalf("after a stale table Version() = %d; want 3", v)
	}
	c.fb.mu.Lock()
	c.fb.stale = nil
	c.fb.mu.Unlock()

	// An invalid table is refused, the current one kept, the next valid taken.
	bad := testTable(t, "fra", 4, keys)
	bad.Table.Chains[0].Path = []string{"fra", "nowhere", "ams"}
	c.fb.publish(bad)
	n = c.fb.served.Load()
	eventually(t, "the invalid table served", func() bool { return c.fb.served.Load() > n })
	time.Sleep(50 * time.Millisecond)
	if v := a.Version(); v != 3 {
		t.Fatalf("after an invalid table Version() = %d; want 3", v)
	}
	rot, _ := keys.Rotate(time.Now())
	next := testTable(t, "fra", 5, rot)
	next.Keys.Previous = ctlpkg.FEPKeyOf(rot.Previous.Secret, "fra", []string{"fra", "par", "ams"})
	c.fb.publish(next)
	eventually(t, "version 5", func() bool { return a.Version() == 5 })
	if kr := a.Keys(); kr.CurrentID() != rot.Current.ID {
		t.Errorf("after rotation current key id %d; want %d", kr.CurrentID(), rot.Current.ID)
	}
	if got := updates.Load(); got != 3 {
		t.Errorf("OnUpdate called %d times; want 3 (versions 1, 3, 5)", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Restart with the controller down: the persisted table routes at once,
	// and Run keeps retrying without losing it.
	c.srv.Close()
	cfg2 := fepConfig(c, dir, "") // joined already: no token needed
	a2, stop2 := startAgent(t, cfg2)
	if v := a2.Version(); v != 5 {
		t.Fatalf("restarted agent Version() = %d; want 5 from disk", v)
	}
	if e, ok := a2.Lookup("fra", "ams", 1<<20); !ok || !slices.Equal(e.Path, []string{"fra", "par", "ams"}) {
		t.Errorf("restarted Lookup = %v, %v", e.Path, ok)
	}
	if kr := a2.Keys(); kr == nil || kr.CurrentID() != rot.Current.ID {
		t.Errorf("restarted Keys() = %v", kr)
	}
	time.Sleep(300 * time.Millisecond) // some failed retries
	if err := stop2(); err != nil {
		t.Fatalf("Run with the controller down = %v; want nil after cancel", err)
	}
	if v := a2.Version(); v != 5 {
		t.Errorf("Version() = %d after running without controller; want 5", v)
	}
}

func TestAgentJoinRefused(t *testing.T) {
	c := newController(t)
	other := newController(t)
	tests := []struct {
		name  string
		token func(t *testing.T) string
	}{
		{"unknown token", func(t *testing.T) string {
			tok, _ := pki.ParseToken(c.token(t, pki.TokenOptions{}))
			tok.Secret = "00000000000000000000000000000000"
			return tok.String()
		}},
		{"expired token", func(t *testing.T) string {
			return c.token(t, pki.TokenOptions{TTL: time.Minute, Now: time.Now().Add(-time.Hour)})
		}},
		{"token bound to another FEP", func(t *testing.T) string { return c.token(t, pki.TokenOptions{FEP: "par"}) }},
		{"token of another controller (pin mismatch)", func(t *testing.T) string { return other.token(t, pki.TokenOptions{}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			a, err := New(fepConfig(c, dir, tt.token(t)), nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = a.Run(ctx)
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("Run = %v; want ErrRefused", err)
			}
			if _, err := os.Stat(filepath.Join(dir, certFile)); err == nil {
				t.Error("a refused join left a certificate")
			}
		})
	}
	// Not joined and no token.
	a, err := New(fepConfig(c, t.TempDir(), ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); !errors.Is(err, ErrRefused) {
		t.Errorf("Run without token = %v; want ErrRefused", err)
	}
}

func TestAgentReregistersWhenForgotten(t *testing.T) {
	c := newController(t)
	c.fb.targets["fra"] = nil
	cfg := fepConfig(c, t.TempDir(), c.token(t, pki.TokenOptions{}))
	a, _ := startAgent(t, cfg)
	eventually(t, "registration", func() bool { return c.fb.regCount.Load() >= 2 }) // join + register
	// The controller forgets the FEP; the next report is refused (403) and
	// the agent registers again.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := probe.NewServer(probe.ServerConfig{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, pc) }()
	t.Cleanup(func() { cancel(); <-done })
	n := c.fb.regCount.Load()
	c.fb.mu.Lock()
	delete(c.fb.feps, "fra")
	c.fb.targets["fra"] = []api.Target{{ID: "par", ProbeAddr: pc.LocalAddr().String()}}
	c.fb.mu.Unlock()
	a.prober.SetTargets([]probe.Target{{ID: "par", Addr: pc.LocalAddr().String()}})
	eventually(t, "re-registration", func() bool { return c.fb.regCount.Load() > n })
	eventually(t, "a report after re-registration", func() bool { return len(c.fb.reportedPeers("fra")) == 1 })
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := Config{Controller: "https://c:7443", DataDir: t.TempDir(), FEP: api.FEP{ID: "fra", HopAddr: "h:1", ProbeAddr: "h:2"}}
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"no controller", func(c *Config) { c.Controller = "" }},
		{"ftp controller", func(c *Config) { c.Controller = "ftp://c" }},
		{"no data dir", func(c *Config) { c.DataDir = "" }},
		{"bad fep id", func(c *Config) { c.FEP.ID = "a/b" }},
		{"bad hop addr", func(c *Config) { c.FEP.HopAddr = "nohost" }},
		{"malformed token", func(c *Config) { c.Token = "abc" }},
	}
	if _, err := New(good, nil); err != nil {
		t.Fatalf("New(good) = %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.mod(&cfg)
			if _, err := New(cfg, nil); err == nil {
				t.Error("New succeeded")
			}
		})
	}
}

func TestCorruptPersistedTableIgnored(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, tableFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Controller: "https://c:7443", DataDir: dir, FEP: api.FEP{ID: "fra", HopAddr: "h:1", ProbeAddr: "h:2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Version() != 0 || a.Members() != nil || a.Keys() != nil {
		t.Error("a corrupt table file produced a snapshot")
	}
	if _, ok := a.Lookup("a", "b", 1); ok {
		t.Error("Lookup without table succeeded")
	}
}

// TestAgentStopsEverything checks that Run leaves no goroutine and no open
// file behind.
func TestAgentStopsEverything(t *testing.T) {
	testenv.CheckLeaks(t)
	c := newController(t)
	c.fb.targets["fra"] = nil
	a, stop := startAgent(t, fepConfig(c, t.TempDir(), c.token(t, pki.TokenOptions{})))
	keys, _ := pki.NewOverlayKeys(time.Now())
	c.fb.publish(testTable(t, "fra", 1, keys))
	eventually(t, "version 1", func() bool { return a.Version() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c.srv.Close()
}

// The relay takes the agent as its chain source.
var _ relay.ChainSource = (*Agent)(nil)
