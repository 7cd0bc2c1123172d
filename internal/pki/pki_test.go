package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store/boltstore"
	"github.com/mosto-net/mosto/internal/testenv"
)

var t0 = time.Date(2026, 11, 22, 2, 0, 0, 0, time.UTC)

func newTestCA(t testing.TB) (*CA, string) {
	t.Helper()
	dir := t.TempDir()
	if _, err := Init(dir, InitOptions{Now: t0}); err != nil {
		t.Fatalf("Init: %v", err)
	}
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatalf("LoadCA: %v", err)
	}
	return ca, dir
}

func newCSR(t testing.TB, id string) (csrPEM, keyPEM []byte) {
	t.Helper()
	key, keyPEM, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csrPEM, err = NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	return csrPEM, keyPEM
}

func TestInitLoad(t *testing.T) {
	dir := t.TempDir()
	ca, err := Init(dir, InitOptions{Hosts: []string{"ctl.example", "10.1.2.3"}, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if got := ca.Cert.NotAfter.Sub(t0); got < CAValidity-time.Hour {
		t.Errorf("CA valid for %v; want about %v", got, CAValidity)
	}
	if _, err := Init(dir, InitOptions{Now: t0}); !errors.Is(err, ErrExist) {
		t.Errorf("second Init error = %v; want ErrExist", err)
	}
	back, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if back.Hash() != ca.Hash() {
		t.Errorf("loaded CA hash %s; want %s", back.Hash(), ca.Hash())
	}
	leaf := back.server.Leaf
	if leaf == nil {
		t.Fatal("no server leaf")
	}
	if err := leaf.VerifyHostname("ctl.example"); err != nil {
		t.Error(err)
	}
	if err := leaf.VerifyHostname("10.1.2.3"); err != nil {
		t.Error(err)
	}
	// A second controller sharing the CA.
	dir2 := t.TempDir()
	ca2, err := Init(dir2, InitOptions{CADir: Dir(dir), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if ca2.Hash() != ca.Hash() {
		t.Errorf("shared CA hash %s; want %s", ca2.Hash(), ca.Hash())
	}
	if _, err := LoadCA(t.TempDir()); err == nil {
		t.Error("LoadCA of an empty dir succeeded")
	}
}

func TestJoin(t *testing.T) {
	ca, dir := newTestCA(t)
	other, _ := newTestCA(t)
	store := DirTokenStore{Dir: TokenDir(dir)}
	ctx := context.Background()
	mk := func(opt TokenOptions) string {
		t.Helper()
		if opt.Now.IsZero() {
			opt.Now = t0
		}
		tok, _, err := ca.CreateToken(ctx, store, opt)
		if err != nil {
			t.Fatal(err)
		}
		return tok.String()
	}
	good := mk(TokenOptions{})
	tok, _ := ParseToken(good)
	badSecret := Token{ID: tok.ID, Secret: strings.Repeat("0", 32), CAHash: tok.CAHash}.String()
	unknown := Token{ID: "0123456789ab", Secret: tok.Secret, CAHash: tok.CAHash}.String()
	foreignTok, _, err := other.CreateToken(ctx, store, TokenOptions{Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	expiring := mk(TokenOptions{TTL: time.Hour})
	bound := mk(TokenOptions{FEP: "fra"})
	reusable := mk(TokenOptions{Reusable: true})
	once := mk(TokenOptions{})
	csrForBad := mk(TokenOptions{})
	csr, _ := newCSR(t, "fra")

	tests := []struct {
		name  string
		token string
		fep   string
		csr   []byte
		now   time.Time
		want  error // nil: success
	}{
		{"good", good, "fra", csr, t0, nil},
		{"good token used twice", good, "fra", csr, t0, ErrToken},
		{"bad secret", badSecret, "fra", csr, t0, ErrToken},
		{"unknown id", unknown, "fra", csr, t0, ErrToken},
		{"other CA", foreignTok.String(), "fra", csr, t0, ErrToken},
		{"malformed", "mosto1.xyz", "fra", csr, t0, ErrToken},
		{"empty", "", "fra", csr, t0, ErrToken},
		{"expired", expiring, "fra", csr, t0.Add(time.Hour), ErrToken},
		{"bound to other FEP", bound, "par", csr, t0, ErrToken},
		{"bound to this FEP", bound, "fra", csr, t0, nil},
		{"reusable 1", reusable, "fra", csr, t0, nil},
		{"reusable 2", reusable, "par", csr, t0, nil},
		{"reusable expired", reusable, "fra", csr, t0.Add(25 * time.Hour), ErrToken},
		{"bad CSR", csrForBad, "fra", []byte("garbage"), t0, ErrCSR},
		{"bad CSR did not consume token", csrForBad, "fra", csr, t0, nil},
		{"bad FEP id", once, "a/b", csr, t0, ErrCSR},
		{"reserved admin id", once, "admin", csr, t0, ErrCSR},
		{"once", once, "fra", csr, t0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert, caPEM, err := ca.Join(ctx, store, tt.token, tt.fep, tt.csr, tt.now)
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("Join = %v; want %v", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Join: %v", err)
			}
			c, err := ParseCertPEM(cert)
			if err != nil {
				t.Fatal(err)
			}
			if id, err := FEPFromCert(c); err != nil || id != tt.fep {
				t.Errorf("FEPFromCert = %q, %v; want %q", id, err, tt.fep)
			}
			if err := CheckCAPin(caPEM, ca.Hash()); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestSingleUseTokenRace(t *testing.T) {
	ca, dir := newTestCA(t)
	store := DirTokenStore{Dir: TokenDir(dir)}
	ctx := context.Background()
	tok, _, err := ca.CreateToken(ctx, store, TokenOptions{Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := newCSR(t, "x")
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, _, err := ca.Join(ctx, store, tok.String(), "x", csr, t0); err == nil {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Errorf("%d racing joins succeeded with one single-use token; want 1", ok.Load())
	}
}

func TestSignCSRIgnoresRequestedName(t *testing.T) {
	ca, _ := newTestCA(t)
	csr, _ := newCSR(t, "evil") // the request asks for "evil"
	certPEM, err := ca.SignCSR(csr, "good", t0)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := ParseCertPEM(certPEM)
	if id, _ := FEPFromCert(c); id != "good" {
		t.Errorf("certificate names %q; want the token's FEP %q", id, "good")
	}
	if len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != 2 /* ClientAuth */ {
		t.Errorf("ExtKeyUsage = %v; want client auth only", c.ExtKeyUsage)
	}
}

// mtlsServer serves a handler that answers the FEP id of the caller,
// behind RequireClientCert with /v1/join exempt.
func mtlsServer(t testing.TB, ca *CA) *httptest.Server {
	t.Helper()
	cfg, err := ca.ServerTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := FEPFromRequest(r)
		if want := r.URL.Query().Get("as"); want != "" {
			if err := AuthorizeFEP(r, want); err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
		}
		io.WriteString(w, "hello "+id)
	})
	srv := httptest.NewUnstartedServer(RequireClientCert(h, func(r *http.Request) bool { return r.URL.Path == "/v1/join" }))
	srv.TLS = cfg
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func clientFor(t testing.TB, ca *CA, id string) *http.Client {
	t.Helper()
	csr, keyPEM := newCSR(t, id)
	cert, err := ca.SignCSR(csr, id, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ClientTLSConfig(ca.PEM(), cert, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
}

func get(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestMutualTLS(t *testing.T) {
	ca := mustFreshCA(t) // dated now, not t0: TLS checks validity against the clock
	srv := mtlsServer(t, ca)
	other := mustFreshCA(t)

	fra := clientFor(t, ca, "fra")
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	foreign := clientFor(t, other, "fra") // trusts the wrong CA and has a foreign cert
	foreignCertOnly := func() *http.Client {
		csr, keyPEM := newCSR(t, "fra")
		cert, _ := other.SignCSR(csr, "fra", time.Now())
		cfg, _ := ClientTLSConfig(ca.PEM(), cert, keyPEM) // trusts our CA, cert from other
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}()

	tests := []struct {
		name     string
		c        *http.Client
		path     string
		wantCode int // 0: the request must fail
		wantBody string
	}{
		{"fep cert", fra, "/v1/tables/fra", 200, "hello fra"},
		{"fep acts as itself", fra, "/v1/reports?as=fra", 200, "hello fra"},
		{"fep a cannot act as fep b", fra, "/v1/reports?as=par", 403, ""},
		{"no client cert", noCert, "/v1/tables/fra", 401, ""},
		{"no client cert may join", noCert, "/v1/join", 200, "hello "},
		{"client does not trust foreign CA", foreign, "/v1/tables/fra", 0, ""},
		{"server refuses cert of foreign CA", foreignCertOnly, "/v1/tables/fra", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, err := get(tt.c, srv.URL+tt.path)
			if tt.wantCode == 0 {
				if err == nil {
					t.Fatalf("GET succeeded with %d %q; want a TLS failure", code, body)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode {
				t.Fatalf("status %d (%s); want %d", code, body, tt.wantCode)
			}
			if tt.wantBody != "" && body != tt.wantBody {
				t.Errorf("body %q; want %q", body, tt.wantBody)
			}
		})
	}
}

func mustFreshCA(t testing.TB) *CA {
	t.Helper()
	dir := t.TempDir()
	if _, err := Init(dir, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestJoinTLSPinsCA(t *testing.T) {
	testenv.CheckLeaks(t)
	ca := mustFreshCA(t)
	other := mustFreshCA(t)
	srv := mtlsServer(t, ca)
	tests := []struct {
		name   string
		pin    string
		wantOK bool
	}{
		{"right pin", ca.Hash(), true},
		{"pin of another CA", other.Hash(), false},
		{"garbage pin", "sha256:00", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: JoinTLSConfig(tt.pin)}}
			code, _, err := get(c, srv.URL+"/v1/join")
			if tt.wantOK && (err != nil || code != 200) {
				t.Fatalf("join call: %d %v; want 200", code, err)
			}
			if !tt.wantOK && !errors.Is(err, ErrPin) {
				t.Fatalf("join call with a wrong pin: %d, %v; want ErrPin", code, err)
			}
		})
	}
	// An impostor server with its own CA, whose chain holds the pinned CA
	// certificate but whose leaf the pinned CA did not sign.
	imp := mustFreshCA(t)
	cfg, _ := imp.ServerTLSConfig()
	cfg.Certificates[0].Certificate = append(cfg.Certificates[0].Certificate, ca.Cert.Raw)
	isrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	isrv.TLS = cfg
	isrv.StartTLS()
	defer isrv.Close()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: JoinTLSConfig(ca.Hash())}}
	if _, _, err := get(c, isrv.URL+"/v1/join"); err == nil {
		t.Error("join to an impostor carrying the pinned CA certificate succeeded")
	}
}

func TestOverlayKeys(t *testing.T) {
	ks, err := NewOverlayKeys(t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := ks.Rotate(t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if r.Previous == nil || r.Previous.Hex() != ks.Current.Hex() {
		t.Fatalf("after rotation previous = %v; want the old current", r.Previous)
	}
	if r.Current.ID == r.Previous.ID || r.Current.Hex() == ks.Current.Hex() {
		t.Errorf("rotation kept id %d or secret", r.Current.ID)
	}
	r2, _ := r.Rotate(t0)
	if r2.Previous.Hex() != r.Current.Hex() {
		t.Error("second rotation did not drop the oldest key")
	}
	back, err := ParseOverlayKeys(r.Current.Hex(), r.Previous.Hex())
	if err != nil {
		t.Fatal(err)
	}
	if back.Current.ID != r.Current.ID || back.Previous.ID != r.Previous.ID {
		t.Errorf("wire round trip changed ids")
	}
	if _, did, _ := r.RotateIfOlder(t0.Add(2*time.Hour), 24*time.Hour); did {
		t.Error("RotateIfOlder rotated a young key")
	}
	if n, did, _ := r.RotateIfOlder(t0.Add(26*time.Hour), 24*time.Hour); !did || n.Previous.Hex() != r.Current.Hex() {
		t.Error("RotateIfOlder did not rotate an old key")
	}
	for _, bad := range [][2]string{{"zz", ""}, {"00", ""}, {r.Current.Hex(), r.Current.Hex()}, {r.Current.Hex(), "abc"}} {
		if _, err := ParseOverlayKeys(bad[0], bad[1]); err == nil {
			t.Errorf("ParseOverlayKeys(%q, %q) succeeded", bad[0], bad[1])
		}
	}
	path := t.TempDir() + "/k.json"
	if err := SaveOverlayKeys(path, r); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOverlayKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	b1, _ := json.Marshal(got)
	b2, _ := json.Marshal(r)
	if string(b1) != string(b2) {
		t.Errorf("file round trip: %s; want %s", b1, b2)
	}
}

func TestPruneTokens(t *testing.T) {
	ca, dir := newTestCA(t)
	store := DirTokenStore{Dir: TokenDir(dir)}
	ctx := context.Background()
	for _, ttl := range []time.Duration{time.Hour, 2 * time.Hour, 48 * time.Hour} {
		if _, _, err := ca.CreateToken(ctx, store, TokenOptions{TTL: ttl, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := store.PruneTokens(ctx, t0.Add(3*time.Hour))
	if err != nil || n != 2 {
		t.Errorf("PruneTokens = %d, %v; want 2", n, err)
	}
}

func TestAdminCert(t *testing.T) {
	ca, dir := newTestCA(t)
	if err := ca.IssueAdmin(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(Dir(dir), AdminCertFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCertPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject.CommonName != "admin" {
		t.Errorf("admin CN %q", c.Subject.CommonName)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("admin cert does not verify: %v", err)
	}
	csr, _ := newCSR(t, "admin")
	if _, err := ca.SignCSR(csr, "admin", time.Now()); !errors.Is(err, ErrCSR) {
		t.Errorf("SignCSR for admin = %v; want ErrCSR", err)
	}
}

func TestJoinerWithControllerStore(t *testing.T) {
	ca := mustFreshCA(t)
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "c.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	files := DirTokenStore{Dir: TokenDir(dir)}
	j := &Joiner{CA: ca, Tokens: files, Store: st}
	storeTok, _, err := ca.CreateStoreToken(ctx, st, TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	boundTok, _, _ := ca.CreateStoreToken(ctx, st, TokenOptions{FEP: "par"})
	expTok, _, _ := ca.CreateStoreToken(ctx, st, TokenOptions{TTL: time.Minute, Now: time.Now().Add(-time.Hour)})
	fileTok, _, err := ca.CreateToken(ctx, files, TokenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.CreateStoreToken(ctx, st, TokenOptions{Reusable: true}); err == nil {
		t.Error("a reusable store token was created")
	}
	csr, _ := newCSR(t, "fra")
	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"store token", storeTok.String(), true},
		{"store token again", storeTok.String(), false},
		{"store token bound elsewhere", boundTok.String(), false},
		{"expired store token", expTok.String(), false},
		{"file token through the same joiner", fileTok.String(), true},
		{"file token again", fileTok.String(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := j.Join(ctx, tt.token, api.FEP{ID: "fra"}, csr, false)
			if tt.ok {
				if err != nil {
					t.Fatalf("Join: %v", err)
				}
				c, err := ParseCertPEM([]byte(resp.CertPEM))
				if err != nil {
					t.Fatal(err)
				}
				if id, _ := FEPFromCert(c); id != "fra" {
					t.Errorf("cert for %q", id)
				}
				return
			}
			if !errors.Is(err, ErrToken) {
				t.Fatalf("Join = %v; want ErrToken", err)
			}
			if errors.Is(err, api.ErrInvalid) {
				t.Error("a token refusal maps to 400")
			}
		})
	}
	if _, err := j.Join(ctx, fileTok.String(), api.FEP{ID: "fra"}, []byte("junk"), false); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("bad CSR: %v; want api.ErrInvalid (400)", err)
	}
	// A registered id: only tokens bound to it.
	for _, tc := range []struct {
		name string
		tok  func() (Token, error)
		ok   bool
	}{
		{"unbound store token", func() (Token, error) {
			tk, _, err := ca.CreateStoreToken(ctx, st, TokenOptions{})
			return tk, err
		}, false},
		{"reusable file token", func() (Token, error) {
			tk, _, err := ca.CreateToken(ctx, files, TokenOptions{Reusable: true})
			return tk, err
		}, false},
		{"bound store token", func() (Token, error) {
			tk, _, err := ca.CreateStoreToken(ctx, st, TokenOptions{FEP: "fra"})
			return tk, err
		}, true},
		{"bound file token", func() (Token, error) {
			tk, _, err := ca.CreateToken(ctx, files, TokenOptions{FEP: "fra"})
			return tk, err
		}, true},
	} {
		tk, err := tc.tok()
		if err != nil {
			t.Fatal(err)
		}
		_, err = j.Join(ctx, tk.String(), api.FEP{ID: "fra"}, csr, true)
		if tc.ok && err != nil {
			t.Errorf("%s joining the registered fra: %v", tc.name, err)
		}
		if !tc.ok && !errors.Is(err, ErrTokenNotBound) {
			t.Errorf("%s joining the registered fra: %v; want ErrTokenNotBound", tc.name, err)
		}
	}
}
