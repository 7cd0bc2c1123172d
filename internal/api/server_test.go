package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/testenv"
)

// fakeBackend is a minimal in-memory Backend for handler tests.
type fakeBackend struct {
	mu      sync.Mutex
	feps    map[string]api.FEP
	reports []api.Report
	table   *api.EncodedTable
	dests   map[string]api.Destination
}

func newFake() *fakeBackend { return &fakeBackend{feps: map[string]api.FEP{}} }

func (b *fakeBackend) RegisterFEP(ctx context.Context, f api.FEP) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.feps[f.ID] = f
	return nil
}
func (b *fakeBackend) DeleteFEP(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.feps[id]; !ok {
		return fmt.Errorf("fep %s: %w", id, api.ErrNotFound)
	}
	delete(b.feps, id)
	return nil
}
func (b *fakeBackend) FEPs(ctx context.Context) ([]api.FEP, error) { return nil, nil }
func (b *fakeBackend) Targets(ctx context.Context, id string) ([]api.Target, error) {
	return nil, fmt.Errorf("fep %s: %w", id, api.ErrNotFound)
}
func (b *fakeBackend) DestTargets(ctx context.Context, id string) ([]api.DestTarget, error) {
	return nil, fmt.Errorf("fep %s: %w", id, api.ErrNotFound)
}
func (b *fakeBackend) Report(ctx context.Context, r api.Report) (api.ReportResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.feps[r.FEP]; !ok {
		return api.ReportResult{}, fmt.Errorf("%w: fep %s is not registered", api.ErrForbidden, r.FEP)
	}
	b.reports = append(b.reports, r)
	return api.ReportResult{Accepted: len(r.Samples)}, nil
}
func (b *fakeBackend) WaitTable(ctx context.Context, lop string, since uint64, epoch string) (*api.EncodedTable, error) {
	if lop == "slow" { // a lookup that outlasts the wait, then finds nothing
		<-ctx.Done()
		return nil, fmt.Errorf("lop %s: %w", lop, api.ErrNotFound)
	}
	if lop != "fra" {
		return nil, api.ErrNotFound
	}
	if b.table != nil && b.table.Version > since {
		return b.table, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}
func (b *fakeBackend) Matrix(ctx context.Context) (api.Matrix, error) { return api.Matrix{}, nil }
func (b *fakeBackend) Health(ctx context.Context) api.Health          { return api.Health{Status: "ok"} }
func (b *fakeBackend) RegisterDestination(ctx context.Context, d api.Destination) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dests == nil {
		b.dests = map[string]api.Destination{}
	}
	b.dests[d.ID] = d
	return nil
}
func (b *fakeBackend) DeleteDestination(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.dests[id]; !ok {
		return fmt.Errorf("destination %s: %w", id, api.ErrNotFound)
	}
	delete(b.dests, id)
	return nil
}
func (b *fakeBackend) Destinations(ctx context.Context) ([]api.DestinationStatus, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []api.DestinationStatus
	for _, d := range b.dests {
		out = append(out, api.DestinationStatus{Destination: d})
	}
	return out, nil
}

type denyJoiner struct{}

func (denyJoiner) Join(ctx context.Context, token string, f api.FEP, csr []byte, registered bool) (api.JoinResponse, error) {
	if token == "good" {
		return api.JoinResponse{CertPEM: "cert", CAPEM: "ca"}, nil
	}
	return api.JoinResponse{}, fmt.Errorf("token expired")
}

const goodFEP = `{"id":"fra","hop_addr":"10.0.0.1:7000","probe_addr":"10.0.0.1:7001","lat":50.1,"lon":8.7}`

const goodDest = `{"id":"shop","prefix":"198.51.100.0/24","lat":37.3,"lon":-121.9,"probe_addr":"198.51.100.10:443"}`

func TestValidation(t *testing.T) {
	testenv.CheckLeaks(t)
	b := newFake()
	b.feps["fra"] = api.FEP{ID: "fra"}
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: b, Joiner: denyJoiner{}}))
	defer srv.Close()
	now := time.Now().UTC().Format(time.RFC3339)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	tests := []struct {
		name, method, path, body string
		want                     int
		wantErr                  string // substring of the error message
	}{
		{"register ok", "POST", "/v1/feps", goodFEP, 200, ""},
		{"register empty body", "POST", "/v1/feps", "", 400, "empty body"},
		{"register not json", "POST", "/v1/feps", "{", 400, "decode"},
		{"register unknown field", "POST", "/v1/feps", `{"id":"a","bogus":1}`, 400, "unknown field"},
		{"register trailing", "POST", "/v1/feps", goodFEP + `{}`, 400, "trailing"},
		{"register bad id", "POST", "/v1/feps", strings.Replace(goodFEP, `"fra"`, `"-x"`, 1), 400, "fep id"},
		{"register slash id", "POST", "/v1/feps", strings.Replace(goodFEP, `"fra"`, `"a/b"`, 1), 400, "fep id"},
		{"register bad port", "POST", "/v1/feps", strings.Replace(goodFEP, `7000`, `70000`, 1), 400, "hop_addr"},
		{"register no port", "POST", "/v1/feps", strings.Replace(goodFEP, `10.0.0.1:7001`, `10.0.0.1`, 1), 400, "probe_addr"},
		{"register bad lat", "POST", "/v1/feps", strings.Replace(goodFEP, `50.1`, `91`, 1), 400, "lat"},
		{"register bad lon", "POST", "/v1/feps", strings.Replace(goodFEP, `8.7`, `-181`, 1), 400, "lon"},
		{"register wrong type", "POST", "/v1/feps", strings.Replace(goodFEP, `50.1`, `"north"`, 1), 400, "decode"},
		{"register too large", "POST", "/v1/feps", `{"location":"` + strings.Repeat("x", api.MaxBodyBytes) + `"}`, 413, "larger"},
		{"delete unknown", "DELETE", "/v1/feps/nope", "", 404, "not found"},
		{"delete bad id", "DELETE", "/v1/feps/-x", "", 400, "id"},
		{"delete bad id escaped", "DELETE", "/v1/feps/a%2Fb", "", 400, "id"},
		{"targets unknown", "GET", "/v1/feps/nope/targets", "", 404, "not found"},
		{"report ok", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":9.5,"at":"` + now + `"}]}`, 200, ""},
		{"report unregistered", "POST", "/v1/reports", `{"fep":"xyz","samples":[{"peer":"ams","rtt_ms":9.5}]}`, 403, "not registered"},
		{"report no samples", "POST", "/v1/reports", `{"fep":"fra","samples":[]}`, 400, "samples"},
		{"report negative rtt", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":-1}]}`, 400, "rtt_ms"},
		{"report zero rtt", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":0}]}`, 400, "rtt_ms"},
		{"report huge rtt", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":1e9}]}`, 400, "rtt_ms"},
		{"report self", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"fra","rtt_ms":1}]}`, 400, "itself"},
		{"report future", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":1,"at":"` + future + `"}]}`, 400, "future"},
		{"report bad time", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":1,"at":"yesterday"}]}`, 400, "decode"},
		{"report rtt string", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":"1"}]}`, 400, "decode"},
		{"report unreachable", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","unreachable":true}]}`, 200, ""},
		{"report unreachable with rtt", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":3,"unreachable":true}]}`, 400, "not both"},
		{"report unreachable with bad rtt", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","rtt_ms":-3,"unreachable":true}]}`, 400, "not both"},
		{"report no rtt", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams"}]}`, 400, "unreachable: true"},
		{"report reachable no rtt", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","unreachable":false}]}`, 400, "no rtt_ms"},
		{"report unreachable not bool", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"ams","unreachable":"yes"}]}`, 400, "decode"},
		{"report unreachable self", "POST", "/v1/reports", `{"fep":"fra","samples":[{"peer":"fra","unreachable":true}]}`, 400, "itself"},
		{"report dest ok", "POST", "/v1/reports", `{"fep":"fra","samples":[],"destinations":[{"dest":"shop","rtt_ms":20}]}`, 200, ""},
		{"report dest bad id", "POST", "/v1/reports", `{"fep":"fra","destinations":[{"dest":"a/b","rtt_ms":20}]}`, 400, "dest"},
		{"report dest zero rtt", "POST", "/v1/reports", `{"fep":"fra","destinations":[{"dest":"shop","rtt_ms":0}]}`, 400, "rtt_ms"},
		{"report dest future", "POST", "/v1/reports", `{"fep":"fra","destinations":[{"dest":"shop","rtt_ms":1,"at":"` + future + `"}]}`, 400, "future"},
		{"report neither", "POST", "/v1/reports", `{"fep":"fra"}`, 400, "all empty"},
		{"destination ok", "POST", "/v1/destinations", goodDest, 200, ""},
		{"destination no probe", "POST", "/v1/destinations", strings.Replace(goodDest, `,"probe_addr":"198.51.100.10:443"`, ``, 1), 200, ""},
		{"destination bad id", "POST", "/v1/destinations", strings.Replace(goodDest, `"shop"`, `".x"`, 1), 400, "destination id"},
		{"destination bad prefix", "POST", "/v1/destinations", strings.Replace(goodDest, `198.51.100.0/24`, `198.51.100.0/33`, 1), 400, "prefix"},
		{"destination no prefix", "POST", "/v1/destinations", strings.Replace(goodDest, `"198.51.100.0/24"`, `""`, 1), 400, "prefix"},
		{"destination bad lat", "POST", "/v1/destinations", strings.Replace(goodDest, `37.3`, `-90.5`, 1), 400, "lat"},
		{"destination bad probe", "POST", "/v1/destinations", strings.Replace(goodDest, `:443`, ``, 1), 400, "probe_addr"},
		{"destination unknown field", "POST", "/v1/destinations", `{"id":"x","egp":"fra"}`, 400, "unknown field"},
		{"destination list", "GET", "/v1/destinations", "", 200, ""},
		{"destination delete", "DELETE", "/v1/destinations/shop", "", 204, ""},
		{"destination delete again", "DELETE", "/v1/destinations/shop", "", 404, "not found"},
		{"destination delete bad id", "DELETE", "/v1/destinations/-x", "", 400, "id"},
		{"table unknown lop", "GET", "/v1/tables/nope", "", 404, "not found"},
		{"table unknown lop found late", "GET", "/v1/tables/slow", "", 404, "not found"},
		{"table bad since", "GET", "/v1/tables/fra?since=-1", "", 400, "since"},
		{"table bad wait", "GET", "/v1/tables/fra?wait=forever", "", 400, "wait"},
		{"table wait too long", "GET", "/v1/tables/fra?wait=1h", "", 400, "wait"},
		{"table no newer", "GET", "/v1/tables/fra?since=5", "", 304, ""},
		{"join bad token", "POST", "/v1/join", `{"token":"bad","fep":` + goodFEP + `,"csr_pem":"x"}`, 403, "expired"},
		{"join no csr", "POST", "/v1/join", `{"token":"good","fep":` + goodFEP + `}`, 400, "csr_pem"},
		{"join ok", "POST", "/v1/join", `{"token":"good","fep":` + goodFEP + `,"csr_pem":"x"}`, 200, ""},
		{"wrong method", "PUT", "/v1/feps", "", 405, "not allowed"},
		{"unknown path", "GET", "/v2/x", "", 404, "no such path"},
		{"health", "GET", "/healthz", "", 200, ""},
		{"openapi", "GET", "/v1/openapi.yaml", "", 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want {
				t.Fatalf("%s %s = %d %s; want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
			}
			if resp.StatusCode >= 400 {
				var e api.Error
				if err := json.Unmarshal(body, &e); err != nil || e.Error == "" {
					t.Fatalf("error body %q is not {\"error\": ...}", body)
				}
				if !strings.Contains(e.Error, tc.wantErr) {
					t.Errorf("error %q does not mention %q", e.Error, tc.wantErr)
				}
			}
		})
	}
}

func TestRequireClientCert(t *testing.T) {
	testenv.CheckLeaks(t)
	b := newFake()
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: b, RequireClientCert: true}))
	defer srv.Close()
	for path, want := range map[string]int{"/healthz": 200, "/v1/feps": 401, "/v1/matrix": 401, "/v1/tables/fra": 401} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without client cert = %d; want %d", path, resp.StatusCode, want)
		}
	}
}

func TestIdentityMayOnlyActForItself(t *testing.T) {
	b := newFake()
	b.feps["fra"] = api.FEP{ID: "fra"}
	b.feps["ams"] = api.FEP{ID: "ams"}
	h := api.NewHandler(api.ServerConfig{Backend: b, Identity: func(r *http.Request) (string, bool) {
		return r.Header.Get("X-Test-Identity"), true
	}})
	tests := []struct {
		who  string
		want int
	}{{"fra", 200}, {"ams", 403}, {api.AdminIdentity, 200}}
	for _, tc := range tests {
		req := httptest.NewRequest("POST", "/v1/reports", strings.NewReader(`{"fep":"fra","samples":[{"peer":"ams","rtt_ms":3}]}`))
		req.Header.Set("X-Test-Identity", tc.who)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("report for fra by %q = %d %s; want %d", tc.who, rec.Code, rec.Body, tc.want)
		}
	}
	// Destinations are the admin's: no FEP may change them.
	for who, want := range map[string]int{"fra": 403, api.AdminIdentity: 200} {
		req := httptest.NewRequest("POST", "/v1/destinations", strings.NewReader(goodDest))
		req.Header.Set("X-Test-Identity", who)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("register destination by %q = %d %s; want %d", who, rec.Code, rec.Body, want)
		}
	}
}

func TestTableServedGzipOrPlain(t *testing.T) {
	testenv.CheckLeaks(t)
	b := newFake()
	plain := []byte(`{"lop":"fra","version":7}`)
	b.table = &api.EncodedTable{Version: 7, JSON: func() []byte { return plain }, Gzip: func() []byte { return api.GzipBytes(plain) }}
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: b}))
	defer srv.Close()
	// The Go client asks for gzip and decompresses transparently.
	c := &api.Client{BaseURL: srv.URL}
	tab, err := c.Table(context.Background(), "fra", 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tab == nil || tab.Version != 7 {
		t.Fatalf("Table = %+v; want version 7", tab)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/v1/tables/fra", nil)
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(got, plain) || resp.Header.Get(api.VersionHeader) != "7" {
		t.Errorf("plain table = %q (version header %q); want %q, 7", got, resp.Header.Get(api.VersionHeader), plain)
	}
	// An older version than the caller has: 304 within the wait.
	tab, err = c.Table(context.Background(), "fra", 7, 50*time.Millisecond)
	if err != nil || tab != nil {
		t.Errorf("Table(since=7) = %v, %v; want nil, nil (304)", tab, err)
	}
}

func TestParseWatch(t *testing.T) {
	tests := []struct {
		since, wait string
		v           uint64
		d           time.Duration
		ok          bool
	}{
		{"", "", 0, 0, true},
		{"12", "30s", 12, 30 * time.Second, true},
		{"1", "45", 1, 45 * time.Second, true},
		{"x", "", 0, 0, false},
		{"1", "-1s", 0, 0, false},
		{"1", "121s", 0, 0, false},
		{"18446744073709551616", "", 0, 0, false},
	}
	for _, tc := range tests {
		v, d, err := api.ParseWatch(tc.since, tc.wait)
		if (err == nil) != tc.ok || tc.ok && (v != tc.v || d != tc.d) {
			t.Errorf("ParseWatch(%q, %q) = %d, %v, %v; want %d, %v, ok=%v", tc.since, tc.wait, v, d, err, tc.v, tc.d, tc.ok)
		}
	}
}
