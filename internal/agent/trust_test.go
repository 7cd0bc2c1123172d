package agent

// Regression tests of issue 13 (trust model and control-plane hardening)
// against the real controller, the real API handler with mutual TLS and the
// real pki: each one failed on the code before its fix (see
// /work/notes/issue-13.md and docs/security.md).

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	ctlpkg "github.com/mosto-net/mosto/internal/controller"
	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/store/boltstore"
)

// trustWorld is a controller (bbolt store) behind the API with mutual TLS
// and joins, plus an admin client.
type trustWorld struct {
	dir    string
	ca     *pki.CA
	st     *boltstore.Store
	ctl    *ctlpkg.Controller
	srv    *httptest.Server
	tokens pki.DirTokenStore
	admin  *api.Client
}

func newTrustWorld(t *testing.T, cfg ctlpkg.Config) *trustWorld {
	t.Helper()
	w := &trustWorld{dir: t.TempDir()}
	if _, err := pki.Init(w.dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	w.ca = ca
	w.st, err = boltstore.Open(filepath.Join(w.dir, "controller.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.st.Close() })
	cfg.Store = w.st
	if cfg.Debounce == 0 {
		cfg.Debounce = 20 * time.Millisecond
	}
	if cfg.Period == 0 {
		cfg.Period = time.Hour
	}
	w.ctl, err = ctlpkg.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	cdone := make(chan error, 1)
	go func() { cdone <- w.ctl.Run(cctx) }()
	t.Cleanup(func() { ccancel(); <-cdone })
	w.tokens = pki.DirTokenStore{Dir: pki.TokenDir(w.dir)}
	w.srv = httptest.NewUnstartedServer(nil)
	w.srv.Config.Handler = api.NewHandler(trustServerConfig(w.ctl, ca, w.tokens, w.st))
	w.srv.TLS = trustTLSConfig(t, w.ctl, ca)
	w.srv.StartTLS()
	t.Cleanup(w.srv.Close)
	if err := ca.IssueAdmin(w.dir, time.Time{}); err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(filepath.Join(pki.Dir(w.dir), pki.AdminCertFile))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(pki.Dir(w.dir), pki.AdminKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	w.admin = w.client(t, certPEM, keyPEM)
	return w
}

func (w *trustWorld) client(t *testing.T, certPEM, keyPEM []byte) *api.Client {
	t.Helper()
	tcfg, err := pki.ClientTLSConfig(w.ca.PEM(), certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: tcfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &api.Client{BaseURL: w.srv.URL, HTTP: &http.Client{Transport: tr, Timeout: 20 * time.Second}}
}

func (w *trustWorld) token(t *testing.T, opt pki.TokenOptions) string {
	t.Helper()
	tok, _, err := w.ca.CreateToken(context.Background(), w.tokens, opt)
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

// join joins f with tok as a proxy does and returns a client that presents
// the new certificate.
func (w *trustWorld) join(t *testing.T, tok string, f api.FEP) (*api.Client, error) {
	t.Helper()
	key, keyPEM, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: pki.JoinTLSConfig(w.ca.Hash())}
	defer tr.CloseIdleConnections()
	jc := &api.Client{BaseURL: w.srv.URL, HTTP: &http.Client{Transport: tr, Timeout: 20 * time.Second}}
	resp, err := jc.Join(context.Background(), api.JoinRequest{Token: tok, FEP: f, CSRPEM: string(csr)})
	if err != nil {
		return nil, err
	}
	return w.client(t, []byte(resp.CertPEM), keyPEM), nil
}

func (w *trustWorld) fep(t *testing.T, id string) (api.FEP, bool) {
	t.Helper()
	feps, err := w.ctl.FEPs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range feps {
		if f.ID == id {
			return f, true
		}
	}
	return api.FEP{}, false
}

var trustFEPs = map[string]api.FEP{
	"fra": {ID: "fra", HopAddr: "127.0.0.1:7001", ProbeAddr: "127.0.0.1:8001", Lat: 50.1, Lon: 8.7},
	"par": {ID: "par", HopAddr: "127.0.0.1:7002", ProbeAddr: "127.0.0.1:8002", Lat: 48.9, Lon: 2.4},
	"ams": {ID: "ams", HopAddr: "127.0.0.1:7003", ProbeAddr: "127.0.0.1:8003", Lat: 52.4, Lon: 4.9},
}

// TestJoinCannotTakeOverRegisteredID (issue 13 item 1): a reusable or
// unbound token never takes over a registered FEP id; a token bound to the
// id may re-join it.
func TestJoinCannotTakeOverRegisteredID(t *testing.T) {
	w := newTrustWorld(t, ctlpkg.Config{})
	fra := trustFEPs["fra"]
	if _, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "fra"}), fra); err != nil {
		t.Fatalf("first join of fra: %v", err)
	}
	evil := fra
	evil.HopAddr, evil.ProbeAddr = "127.0.0.1:6666", "127.0.0.1:6667"
	for _, tc := range []struct {
		name string
		opt  pki.TokenOptions
	}{
		{"reusable", pki.TokenOptions{Reusable: true}},
		{"single-use unbound", pki.TokenOptions{}},
		{"bound to another id", pki.TokenOptions{FEP: "par"}},
	} {
		_, err := w.join(t, w.token(t, tc.opt), evil)
		var se *api.StatusError
		if !errors.As(err, &se) || se.Code != http.StatusForbidden {
			t.Errorf("%s token joining the registered id fra: err = %v; want 403", tc.name, err)
		}
		if got, _ := w.fep(t, "fra"); got.HopAddr != fra.HopAddr {
			t.Fatalf("after a %s token join: fra's hop_addr = %q; want %q (taken over)", tc.name, got.HopAddr, fra.HopAddr)
		}
	}
	// A reusable token still joins new ids.
	if _, err := w.join(t, w.token(t, pki.TokenOptions{Reusable: true}), trustFEPs["par"]); err != nil {
		t.Errorf("reusable token joining a new id: %v", err)
	}
	// The operator re-joins fra (a new host) with a token bound to it.
	moved := fra
	moved.HopAddr = "127.0.0.1:7101"
	if _, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "fra"}), moved); err != nil {
		t.Fatalf("re-join of fra with a token bound to it: %v", err)
	}
	if got, _ := w.fep(t, "fra"); got.HopAddr != moved.HopAddr {
		t.Errorf("after the bound re-join: fra's hop_addr = %q; want %q", got.HopAddr, moved.HopAddr)
	}
}

// TestDeletedFEPIsLockedOut (issue 13 item 2): deleting a FEP revokes its
// certificate (it can neither re-register nor read anything), a FEP
// re-joined under a bound token leaves its old certificate powerless, and a
// FEP's certificate reads only its own table.
func TestDeletedFEPIsLockedOut(t *testing.T) {
	w := newTrustWorld(t, ctlpkg.Config{})
	ctx := context.Background()
	fra, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "fra"}), trustFEPs["fra"])
	if err != nil {
		t.Fatal(err)
	}
	par, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "par"}), trustFEPs["par"])
	if err != nil {
		t.Fatal(err)
	}
	w.ctl.Trigger()
	if _, err := fra.Table(ctx, "fra", 0, 10*time.Second); err != nil {
		t.Fatalf("fra reading its own table: %v", err)
	}
	if tab, err := par.Table(ctx, "fra", 0, time.Second); err == nil {
		t.Errorf("par read fra's table (version %d, keys %v); want 403", tab.Version, tab.Keys.Current != nil)
	}
	if _, err := par.Targets(ctx, "fra"); err == nil {
		t.Error("par read fra's probe targets; want 403")
	}

	if err := w.admin.DeleteFEP(ctx, "fra"); err != nil {
		t.Fatal(err)
	}
	if err := fra.RegisterFEP(ctx, trustFEPs["fra"]); err == nil {
		t.Error("the deleted fra re-registered with its certificate")
	}
	if _, ok := w.fep(t, "fra"); ok {
		t.Fatal("fra is registered again after its deletion")
	}
	if _, err := fra.Table(ctx, "fra", 0, time.Second); err == nil {
		t.Error("the deleted fra still reads a table")
	}
	if _, err := fra.FEPs(ctx); err == nil {
		t.Error("the deleted fra still lists the FEPs")
	}
	// The operator brings fra back with a bound token: the new certificate
	// works, the old one stays revoked.
	fra2, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "fra"}), trustFEPs["fra"])
	if err != nil {
		t.Fatalf("re-join of the deleted fra with a bound token: %v", err)
	}
	if err := fra2.RegisterFEP(ctx, trustFEPs["fra"]); err != nil {
		t.Errorf("the re-joined fra registering: %v", err)
	}
	if err := fra.RegisterFEP(ctx, trustFEPs["fra"]); err == nil {
		t.Error("the revoked certificate of fra registered after fra re-joined")
	}
	// A re-join (new key) also retires the certificate it replaces.
	par2, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "par"}), trustFEPs["par"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := par.FEPs(ctx); err == nil {
		t.Error("par's replaced certificate still works after par re-joined")
	}
	if _, err := par2.FEPs(ctx); err != nil {
		t.Errorf("par's new certificate: %v", err)
	}
}

// keyringOf returns the keyring an agent builds from a table.
func keyringOf(t *testing.T, tab *api.Table) *hop.Keyring {
	t.Helper()
	s, err := newSnapshot(tab, tab.LoP)
	if err != nil {
		t.Fatalf("table version %d: %v", tab.Version, err)
	}
	if s.Keyring == nil {
		t.Fatalf("table version %d has no keys", tab.Version)
	}
	return s.Keyring
}

// compatible reports whether a header signed under a verifies under b
// (per-FEP keyrings: from a's FEP to b's).
func compatible(a, b *hop.Keyring) error {
	h := &hop.Header{Route: []string{cmp.Or(a.Self(), "fra"), cmp.Or(b.Self(), "par")}, Hop: 1, Target: "127.0.0.1:80", Time: time.Now()}
	raw, err := h.Marshal(a)
	if err != nil {
		return err
	}
	_, err = hop.Read(bytes.NewReader(raw), b, time.Now(), time.Minute)
	return err
}

// TestKeyRotationKeepsTablesCompatible (issue 13 item 3): while the
// controller rotates the overlay key, a proxy on any table and a proxy on
// the next one accept each other's headers in both directions: a proxy
// that got the new table first never signs with a key its peers refuse.
func TestKeyRotationKeepsTablesCompatible(t *testing.T) {
	w := newTrustWorld(t, trustRotationConfig())
	ctx := context.Background()
	for _, id := range []string{"fra", "par"} {
		if err := w.admin.RegisterFEP(ctx, trustFEPs[id]); err != nil {
			t.Fatal(err)
		}
	}
	// Both LoPs poll, as agents do (a poll with since=V acknowledges V);
	// each of fra's tables is paired with par's newest at that moment.
	type pair struct{ fra, par *api.Table }
	var tabs []pair
	var par *api.Table
	since, parSince := uint64(0), uint64(0)
	keys := map[uint8]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for len(keys) < 4 && time.Now().Before(deadline) {
		tab, err := w.admin.Table(ctx, "fra", since, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if pt, err := w.admin.Table(ctx, "par", parSince, 0); err == nil && pt != nil {
			par, parSince = pt, pt.Version
		}
		if tab != nil {
			since = tab.Version
		}
		if tab == nil || par == nil || tab.Members["par"] == "" || par.Members["fra"] == "" {
			continue // (the first tables may be made before both registered)
		}
		tabs = append(tabs, pair{tab, par})
		keys[tab.Keys.Current.ID] = true
	}
	if len(keys) < 4 {
		t.Fatalf("saw %d signing keys in %d tables within 30 s; want 4 (3 rotations)", len(keys), len(tabs))
	}
	for i := 1; i < len(tabs); i++ {
		for _, c := range []struct {
			from, to *api.Table
		}{{tabs[i].fra, tabs[i-1].par}, {tabs[i-1].fra, tabs[i].par}, {tabs[i].par, tabs[i-1].fra}, {tabs[i-1].par, tabs[i].fra}} {
			if err := compatible(keyringOf(t, c.from), keyringOf(t, c.to)); err != nil {
				t.Errorf("header signed by %s under table %d refused by %s on table %d: %v", c.from.LoP, c.from.Version, c.to.LoP, c.to.Version, err)
			}
		}
	}
}

// switchBackend serves the API from one controller and then from another
// (a controller whose store was lost, or moved from bbolt to etcd).
type switchBackend struct {
	mu sync.Mutex
	api.Backend
}

func (s *switchBackend) get() api.Backend {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Backend
}

func (s *switchBackend) set(b api.Backend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Backend = b
}

// The methods the agent calls go to the current controller.
func (s *switchBackend) RegisterFEP(ctx context.Context, f api.FEP) error {
	return s.get().RegisterFEP(ctx, f)
}
func (s *switchBackend) FEPs(ctx context.Context) ([]api.FEP, error) { return s.get().FEPs(ctx) }
func (s *switchBackend) Targets(ctx context.Context, id string) ([]api.Target, error) {
	return s.get().Targets(ctx, id)
}
func (s *switchBackend) DestTargets(ctx context.Context, id string) ([]api.DestTarget, error) {
	return s.get().DestTargets(ctx, id)
}
func (s *switchBackend) Report(ctx context.Context, r api.Report) (api.ReportResult, error) {
	return s.get().Report(ctx, r)
}
func (s *switchBackend) WaitTable(ctx context.Context, lop string, since uint64, epoch string) (*api.EncodedTable, error) {
	return s.get().WaitTable(ctx, lop, since, epoch)
}

// TestAgentFollowsResetController (issue 13 item 6): after the controller's
// store is replaced by an empty one (versions start again from 1), the
// agent installs the new controller's tables instead of keeping its stale
// one forever.
func TestAgentFollowsResetController(t *testing.T) {
	old := newTrustWorld(t, ctlpkg.Config{})
	fresh := newTrustWorld(t, ctlpkg.Config{})
	ctx := context.Background()
	sw := &switchBackend{Backend: old.ctl}
	srv := httptest.NewUnstartedServer(api.NewHandler(trustServerConfig(sw, old.ca, old.tokens, old.st)))
	srv.TLS = trustTLSConfig(t, old.ctl, old.ca)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	if err := old.admin.RegisterFEP(ctx, trustFEPs["par"]); err != nil {
		t.Fatal(err)
	}
	f := trustFEPs["fra"]
	pc, addr := probeConn(t)
	f.ProbeAddr = addr
	a, _ := startAgent(t, Config{
		Controller: srv.URL, Token: old.token(t, pki.TokenOptions{FEP: "fra"}), DataDir: t.TempDir(), FEP: f, ProbeConn: pc,
		TargetsEvery: 100 * time.Millisecond, Wait: time.Second,
	})
	eventually(t, "fra's table from the old controller", func() bool { return a.Members()["par"] != "" })
	// Several versions on the old controller.
	for i := 0; i < 3; i++ {
		before := old.ctl.Version()
		if err := old.admin.RegisterFEP(ctx, api.FEP{ID: "tmp", HopAddr: "127.0.0.1:7999", ProbeAddr: "127.0.0.1:8999", Lat: float64(i)}); err != nil {
			t.Fatal(err)
		}
		old.ctl.Trigger()
		eventually(t, "a new version on the old controller", func() bool { return old.ctl.Version() > before })
	}
	oldVersion := a.Version()
	if err := fresh.admin.RegisterFEP(ctx, trustFEPs["ams"]); err != nil {
		t.Fatal(err)
	}
	sw.set(fresh.ctl)
	eventually(t, "fra installs the reset controller's table (ams a member)", func() bool {
		return a.Members()["ams"] != ""
	})
	if a.Members()["tmp"] != "" {
		t.Errorf("members %v still name the old controller's FEP tmp", a.Members())
	}
	t.Logf("old version %d, now version %d", oldVersion, a.Version())
}

// TestReportsOnlyForAssignedTargets (issue 13 item 7): a FEP's samples
// about peers it was not asked to measure, and RTTs below the speed of
// light in fibre between the two FEPs' coordinates, are refused and
// counted; honest samples are kept.
func TestReportsOnlyForAssignedTargets(t *testing.T) {
	w := newTrustWorld(t, trustLightConfig(ctlpkg.Config{Targets: ctlpkg.TargetPolicy{Near: 1, Far: -1}}))
	ctx := context.Background()
	sites := []api.FEP{
		{ID: "fra", HopAddr: "127.0.0.1:7001", ProbeAddr: "127.0.0.1:8001", Lat: 50.1, Lon: 8.7},
		{ID: "muc", HopAddr: "127.0.0.1:7002", ProbeAddr: "127.0.0.1:8002", Lat: 48.1, Lon: 11.6},
		{ID: "syd", HopAddr: "127.0.0.1:7003", ProbeAddr: "127.0.0.1:8003", Lat: -33.9, Lon: 151.2},
		{ID: "mel", HopAddr: "127.0.0.1:7004", ProbeAddr: "127.0.0.1:8004", Lat: -37.8, Lon: 145.0},
	}
	var fra *api.Client
	for _, f := range sites {
		c, err := w.join(t, w.token(t, pki.TokenOptions{FEP: f.ID}), f)
		if err != nil {
			t.Fatal(err)
		}
		if f.ID == "fra" {
			fra = c
		}
	}
	targets, err := fra.Targets(ctx, "fra")
	if err != nil {
		t.Fatal(err)
	}
	assigned := map[string]bool{}
	for _, tg := range targets {
		assigned[tg.ID] = true
	}
	if !assigned["muc"] || assigned["syd"] || assigned["mel"] {
		t.Fatalf("fra's targets %v; want muc only (Near 1, no far)", targets)
	}
	now := time.Now().UTC()
	// fra -> syd is ~16,500 km: 0.1 ms is impossible, and syd is no target.
	res, err := fra.Report(ctx, api.Report{FEP: "fra", Samples: []api.Sample{
		{Peer: "syd", RTTMS: 0.1, At: now},
		{Peer: "mel", RTTMS: 300, At: now},
	}})
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if res.Accepted != 0 {
		t.Errorf("report about unassigned peers: accepted %d samples; want 0", res.Accepted)
	}
	// fra -> muc is ~300 km: at least ~3 ms in fibre.
	res, err = fra.Report(ctx, api.Report{FEP: "fra", Samples: []api.Sample{{Peer: "muc", RTTMS: 0.1, At: now}}})
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if res.Accepted != 0 {
		t.Errorf("0.1 ms fra -> muc (300 km): accepted %d; want 0 (faster than light in fibre)", res.Accepted)
	}
	res, err = fra.Report(ctx, api.Report{FEP: "fra", Samples: []api.Sample{{Peer: "muc", RTTMS: 9.5, At: now}}})
	if err != nil || res.Accepted != 1 {
		t.Errorf("honest 9.5 ms fra -> muc: %+v, %v; want 1 accepted", res, err)
	}
	m, err := w.ctl.Matrix(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, from := range m.Names {
		for j, to := range m.Names {
			if v := m.RTTMS[i][j]; i != j && v != nil && from == "fra" && (to == "syd" || to == "mel" || *v < 1) {
				t.Errorf("matrix holds fra -> %s = %v ms", to, *v)
			}
		}
	}
}

// TestMemberAddressesValidated (issue 13 item 5): a FEP cannot register a
// hop address another FEP has, and with the controller's member check a
// name, a special-purpose address (loopback, private, link-local...) or
// an address other than the one it registers from is refused unless the
// operator allowed its range.
func TestMemberAddressesValidated(t *testing.T) {
	ctx := context.Background()
	open := newTrustWorld(t, ctlpkg.Config{})
	if _, err := open.join(t, open.token(t, pki.TokenOptions{FEP: "fra"}), trustFEPs["fra"]); err != nil {
		t.Fatal(err)
	}
	par := trustFEPs["par"]
	par.HopAddr = trustFEPs["fra"].HopAddr
	if _, err := open.join(t, open.token(t, pki.TokenOptions{FEP: "par"}), par); err == nil {
		t.Error("par joined with fra's hop address")
	}
	if got, _ := open.fep(t, "fra"); got.HopAddr != trustFEPs["fra"].HopAddr {
		t.Errorf("fra's hop_addr = %q", got.HopAddr)
	}
	if err := open.admin.RegisterFEP(ctx, par); err == nil {
		t.Error("the admin registered par with fra's hop address")
	}

	strict := newTrustWorld(t, trustMemberConfig(nil))
	for _, tc := range []struct{ name, hop string }{
		{"loopback", "127.0.0.1:7001"},
		{"name", "localhost:7001"},
		{"private", "10.1.2.3:7001"},
		{"link-local (metadata service)", "169.254.169.254:80"},
		{"not the registering address", "192.0.2.10:7001"},
	} {
		f := trustFEPs["fra"]
		f.HopAddr, f.ProbeAddr = tc.hop, "192.0.2.10:8001"
		_, err := strict.join(t, strict.token(t, pki.TokenOptions{FEP: "fra"}), f)
		var se *api.StatusError
		if !errors.As(err, &se) || se.Code != http.StatusBadRequest {
			t.Errorf("%s hop_addr %s: err = %v; want 400", tc.name, tc.hop, err)
		}
	}
	allowed := newTrustWorld(t, trustMemberConfig([]string{"192.0.2.0/24"}))
	f := trustFEPs["fra"]
	f.HopAddr, f.ProbeAddr = "192.0.2.10:7001", "192.0.2.10:8001"
	if _, err := allowed.join(t, allowed.token(t, pki.TokenOptions{FEP: "fra"}), f); err != nil {
		t.Fatalf("hop_addr in an allowed range: %v", err)
	}
	// The relay side by default: the table carries the controller's
	// member policy, which the agent hands to its relay
	// (relay.MemberPolicySource; relay TestControllerMemberPolicy).
	tab, err := allowed.admin.Table(ctx, "fra", 0, 10*time.Second)
	if err != nil || tab == nil {
		t.Fatalf("fra's table: %v, %v", tab, err)
	}
	snap, err := newSnapshot(tab, "fra")
	if err != nil {
		t.Fatal(err)
	}
	ag := &Agent{}
	ag.snap.Store(snap)
	if got := ag.MemberPolicy(); !slices.Equal(got, []string{"*", "192.0.2.0/24"}) {
		t.Errorf("member policy of fra's table = %q; want [* 192.0.2.0/24] (public addresses and the allowed range)", got)
	}
	if tab, err := open.admin.Table(ctx, "fra", 0, 10*time.Second); err != nil || tab == nil || tab.MemberAllow != nil {
		t.Errorf("table of a controller without its member check: %v (%v); want no member policy", tab, err)
	}
}

// TestControlPlaneChaos (issue 13, the control-plane part of the chaos
// test): six agents on the real controller while, in turn, the overlay key
// rotates several times, a FEP is deleted, a token holder tries to join
// as an existing id, and a FEP reports RTTs faster than light. At every
// sampled instant every pair of live agents accepts each other's hop
// headers (no flow could fail on authentication), and every rogue action
// is refused.
func TestControlPlaneChaos(t *testing.T) {
	// Signing switches when every LoP has the published key, or
	// KeySwitchAfter after it was served. The fallback is the product's
	// bound on how long a live proxy may take to fetch a table: one that
	// lags longer may refuse or be refused (docs/security.md). So it must
	// exceed any stall of this process (six agents and the controller
	// under -race on a loaded 2-core machine). It is used here: fra and syd below join without
	// an agent, never acknowledge, so every rotation after their join
	// switches on the fallback.
	const switchAfter = 8 * time.Second
	cfg := trustLightConfig(ctlpkg.Config{KeyRotation: 800 * time.Millisecond, KeySwitchAfter: switchAfter})
	w := newTrustWorld(t, cfg)
	ctx := context.Background()
	ids := []string{"a1", "a2", "a3", "a4", "a5", "a6"}
	agents := map[string]*Agent{}
	stops := map[string]func() error{}
	for i, id := range ids {
		pc, addr := probeConn(t)
		f := api.FEP{ID: id, HopAddr: "127.0.0.1:" + strconv.Itoa(7101+i), ProbeAddr: addr}
		a, stop := startAgent(t, Config{
			Controller: w.srv.URL, Token: w.token(t, pki.TokenOptions{FEP: id}), DataDir: t.TempDir(), FEP: f, ProbeConn: pc,
			TargetsEvery: 200 * time.Millisecond, Wait: time.Second,
		})
		agents[id], stops[id] = a, stop
	}
	for id, a := range agents {
		eventually(t, id+" has a table with every agent", func() bool { return len(a.Members()) >= len(ids) })
	}
	// Sample the keyrings of the live agents while the keys rotate.
	var mu sync.Mutex
	live := map[string]bool{}
	for _, id := range ids {
		live[id] = true
	}
	failures, samples := 0, 0
	signing := map[uint8]bool{}
	// Diagnostics: when each agent first held each key id (current or
	// next) and when some agent first signed with it.
	knownAt := map[uint8]map[string]time.Time{}
	signAt := map[uint8]time.Time{}
	var firstTick time.Time
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			mu.Lock()
			now := time.Now()
			if firstTick.IsZero() {
				firstTick = now
			}
			for _, x := range ids {
				sx := agents[x].Snapshot()
				if !live[x] || sx == nil || sx.Keyring == nil {
					continue
				}
				for _, k := range []*api.FEPKey{sx.Table.Keys.Current, sx.Table.Keys.Next} {
					if k == nil {
						continue
					}
					if knownAt[k.ID] == nil {
						knownAt[k.ID] = map[string]time.Time{}
					}
					if _, ok := knownAt[k.ID][x]; !ok {
						knownAt[k.ID][x] = now
					}
				}
				if _, ok := signAt[sx.Keyring.CurrentID()]; !ok {
					signAt[sx.Keyring.CurrentID()] = now
				}
			}
			for _, x := range ids {
				for _, y := range ids {
					if x == y || !live[x] || !live[y] {
						continue
					}
					sx, sy := agents[x].Snapshot(), agents[y].Snapshot()
					if sx == nil || sy == nil || sx.Keyring == nil || sy.Keyring == nil {
						continue
					}
					kx, ky := sx.Keyring, sy.Keyring
					samples++
					signing[kx.CurrentID()] = true
					if err := compatible(kx, ky); err != nil {
						failures++
						if failures <= 3 {
							t.Errorf("%s's header (table v%d, signing key %d) refused by %s (table v%d, signing key %d): %v",
								x, sx.Version, kx.CurrentID(), y, sy.Version, ky.CurrentID(), err)
						}
					}
				}
			}
			mu.Unlock()
		}
	}()
	// Each rotation takes KeyRotation plus the acknowledgements, at worst
	// switchAfter (a stalled agent): wait for the worst case.
	waitSigning := func(what string, n int) {
		t.Helper()
		for deadline := time.Now().Add(time.Duration(n)*(switchAfter+time.Second) + 30*time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			ok := len(signing) >= n
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitSigning("three rotations", 4)

	// A FEP is deleted: its agent is locked out.
	mu.Lock()
	live["a6"] = false
	mu.Unlock()
	if err := w.admin.DeleteFEP(ctx, "a6"); err != nil {
		t.Fatal(err)
	}
	// A token holder tries to join as an existing id.
	rogue := api.FEP{ID: "a1", HopAddr: "127.0.0.1:6666", ProbeAddr: "127.0.0.1:6667"}
	if _, err := w.join(t, w.token(t, pki.TokenOptions{Reusable: true}), rogue); err == nil {
		t.Error("a reusable token joined as the existing a1")
	}
	// A FEP reports RTTs faster than light.
	fra, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "fra"}), api.FEP{ID: "fra", HopAddr: "127.0.0.1:7201", ProbeAddr: "127.0.0.1:7202", Lat: 50.1, Lon: 8.7})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.join(t, w.token(t, pki.TokenOptions{FEP: "syd"}), api.FEP{ID: "syd", HopAddr: "127.0.0.1:7203", ProbeAddr: "127.0.0.1:7204", Lat: -33.9, Lon: 151.2}); err != nil {
		t.Fatal(err)
	}
	res, err := fra.Report(ctx, api.Report{FEP: "fra", Samples: []api.Sample{{Peer: "syd", RTTMS: 0.1, At: time.Now().UTC()}}})
	if err != nil || res.Accepted != 0 || res.Refused != 1 {
		t.Errorf("forged 0.1 ms fra -> syd: %+v, %v; want refused", res, err)
	}
	// The rotations go on after the deletion and the joins.
	n := 0
	mu.Lock()
	n = len(signing)
	mu.Unlock()
	waitSigning("two more rotations", n+2) // on the fallback, see above
	close(done)
	<-sampled
	if got, _ := w.fep(t, "a6"); got.ID != "" {
		t.Error("the deleted a6 registered again")
	}
	if got, _ := w.fep(t, "a1"); got.HopAddr == rogue.HopAddr {
		t.Error("the rogue join took over a1")
	}
	mu.Lock()
	defer mu.Unlock()
	if failures > 0 {
		t.Errorf("%d of %d pairwise samples refused a header", failures, samples)
	}
	// How close the switches came to refusing: from the last live agent
	// holding a key to the first one signing with it (negative: refused).
	switches, margin := 0, time.Duration(0)
	for id, at := range signAt {
		if !at.After(firstTick) {
			continue // the signing key when sampling began
		}
		var last time.Time
		for _, x := range ids {
			if k, ok := knownAt[id][x]; live[x] && ok && k.After(last) {
				last = k
			}
		}
		if m := at.Sub(last); switches == 0 || m < margin {
			margin = m
		}
		switches++
	}
	t.Logf("%d key switches; smallest margin from the last agent holding the key to the first signing with it: %v (fallback %v)",
		switches, margin.Round(time.Millisecond), switchAfter)
	t.Logf("%d pairwise samples over %d signing keys, 0 refused", samples, len(signing))
}
