package dashboard

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/testenv"
)

// fakeSource is a controller in memory.
type fakeSource struct {
	mu      sync.Mutex
	feps    []api.FEP
	m       api.Matrix
	states  map[string]api.FEPState
	changed chan struct{}
	tables  map[string]*api.EncodedTable
	rotated time.Time
}

func newFake() *fakeSource {
	v := func(x float64) *float64 { return &x }
	return &fakeSource{
		feps: []api.FEP{{ID: "fra", Lat: 50.1, Lon: 8.7, Location: "Frankfurt"}, {ID: "lon", Lat: 51.5, Lon: -0.1}, {ID: "nyc", Lat: 40.7, Lon: -74}},
		m: api.Matrix{Names: []string{"fra", "lon", "nyc"}, RTTMS: [][]*float64{
			{v(0), v(15), nil}, {v(16), v(0), v(70)}, {nil, v(71), v(0)}}},
		states:  map[string]api.FEPState{},
		rotated: time.Now().Add(-3 * time.Hour),
		changed: make(chan struct{}),
		tables: map[string]*api.EncodedTable{"fra": {Version: 7, JSON: func() []byte {
			return []byte(`{"lop":"fra","version":7}`)
		}}},
	}
}

func (f *fakeSource) FEPs(context.Context) ([]api.FEP, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.FEP(nil), f.feps...), nil
}
func (f *fakeSource) Matrix(context.Context) (api.Matrix, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rows := make([][]*float64, len(f.m.RTTMS))
	for i, r := range f.m.RTTMS {
		rows[i] = append([]*float64(nil), r...)
	}
	return api.Matrix{Names: f.m.Names, RTTMS: rows}, nil
}
func (f *fakeSource) Health(context.Context) api.Health {
	return api.Health{Status: "ok", Leader: true, Version: 7, FEPs: 3}
}
func (f *fakeSource) Destinations(context.Context) ([]api.DestinationStatus, error) { return nil, nil }
func (f *fakeSource) Tables() map[string]*api.EncodedTable                          { return f.tables }
func (f *fakeSource) FEPStates() map[string]api.FEPState {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]api.FEPState{}
	for k, v := range f.states {
		out[k] = v
	}
	return out
}
func (f *fakeSource) KeysRotated(context.Context) (time.Time, error) {
	return f.rotated, nil
}
func (f *fakeSource) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// report stores a state for fep and wakes the dashboard, like a report.
func (f *fakeSource) report(fep string, st api.FEPState) {
	f.mu.Lock()
	f.states[fep] = st
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeSource) setRTT(i, j int, ms float64) {
	f.mu.Lock()
	f.m.RTTMS[i][j] = &ms
	f.mu.Unlock()
}

func start(t *testing.T, src Source, poll time.Duration) (*Dashboard, *httptest.Server) {
	t.Helper()
	d, err := New(Config{Source: src, Poll: poll, DownAfter: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return d, srv
}

// events reads state events from an SSE stream.
func events(t *testing.T, ctx context.Context, url string) <-chan State {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events Content-Type %q", ct)
	}
	out := make(chan State, 16)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		ev := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = line[7:]
			case strings.HasPrefix(line, "data: ") && ev == "state":
				var s State
				if err := json.Unmarshal([]byte(line[6:]), &s); err != nil {
					t.Errorf("state event: %v", err)
					return
				}
				out <- s
			}
		}
	}()
	return out
}

func cell(s State, from, to string) *float64 {
	for i, a := range s.Matrix.Names {
		for j, b := range s.Matrix.Names {
			if a == from && b == to {
				return s.Matrix.RTTMS[i][j]
			}
		}
	}
	return nil
}

// TestLiveUpdate: a report that changes an RTT reaches an SSE client at
// once (not at the next poll), and is in the change list and the pair's
// history.
func TestLiveUpdate(t *testing.T) {
	src := newFake()
	_, srv := start(t, src, time.Hour) // no poll: only the report wakes it
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch := events(t, ctx, srv.URL+"/ui/events")
	first := <-ch
	if v := cell(first, "lon", "nyc"); v == nil || *v != 70 {
		t.Fatalf("first state lon>nyc = %v; want 70", v)
	}
	if len(first.Changes) != 0 {
		t.Errorf("first state has changes %v; the initial matrix is no change", first.Changes)
	}
	src.setRTT(1, 2, 140)
	t0 := time.Now()
	src.report("lon", api.FEPState{LastReport: time.Now()})
	var got State
	for got = range ch {
		if v := cell(got, "lon", "nyc"); v != nil && *v == 140 {
			break
		}
	}
	if v := cell(got, "lon", "nyc"); v == nil || *v != 140 {
		t.Fatalf("no state with lon>nyc 140 (stream ended: %v)", ctx.Err())
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("update took %v", d)
	}
	if len(got.Changes) == 0 || got.Changes[0].From != "lon" || got.Changes[0].To != "nyc" || got.Changes[0].OldMS != 70 || got.Changes[0].NewMS != 140 {
		t.Errorf("changes %+v; want lon>nyc 70 -> 140 first", got.Changes)
	}
	if h := got.History["lon>nyc"]; len(h) != 2 || h[0].MS != 70 || h[1].MS != 140 {
		t.Errorf("history lon>nyc %+v; want 70 then 140", h)
	}
}

// TestRatesAndStatus: two counter pushes give flows/s and bytes/s; a
// restart (new Started) is no negative rate; old reports are down.
func TestRatesAndStatus(t *testing.T) {
	src := newFake()
	d, err := New(Config{Source: src, DownAfter: 20 * time.Second, Store: "etcd"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	d.cfg.Now = func() time.Time { return now }
	src.rotated = now.Add(-3 * time.Hour)
	started := now.Add(-time.Hour)
	push := func(fep string, at time.Time, flows, bytes float64, st time.Time) {
		src.report(fep, api.FEPState{LastReport: at, Stats: &api.ProxyStats{Started: st, At: at,
			Flows: map[string]float64{"ok": flows}, Bytes: bytes, Direct: map[string]float64{"no_chain": 2, "self_egress": 1},
			Active: map[string]float64{"inp": 3, "trp": 1}}})
	}
	get := func(id string) FEPView {
		t.Helper()
		d.refresh(context.Background())
		for _, f := range d.State().FEPs {
			if f.ID == id {
				return f
			}
		}
		t.Fatalf("no fep %s", id)
		return FEPView{}
	}
	push("fra", now.Add(-10*time.Second), 100, 1e6, started)
	push("lon", now.Add(-time.Minute), 5, 10, started)
	if f := get("fra"); f.Status != "up" || f.FlowsPerS != 0 || f.Active != 4 || f.Direct != 3 {
		t.Errorf("fra after one push: %+v", f)
	}
	push("fra", now.Add(-5*time.Second), 150, 6e6, started)
	if f := get("fra"); f.FlowsPerS != 10 || f.BytesPerS != 1e6 {
		t.Errorf("fra flows/s %v bytes/s %v; want 10 and 1e6", f.FlowsPerS, f.BytesPerS)
	}
	push("fra", now, 3, 100, now.Add(-time.Second)) // restarted
	if f := get("fra"); f.FlowsPerS != 0 || f.BytesPerS != 0 {
		t.Errorf("after a restart flows/s %v bytes/s %v; want 0", f.FlowsPerS, f.BytesPerS)
	}
	if f := get("lon"); f.Status != "down" {
		t.Errorf("lon reported a minute ago: status %q; want down", f.Status)
	}
	if f := get("nyc"); f.Status != "unknown" {
		t.Errorf("nyc never reported: status %q; want unknown", f.Status)
	}
	if s := d.State().Controller.Store; s != "etcd" {
		t.Errorf("store %q; want etcd (Config.Store)", s)
	}
	if k := d.State().Controller.KeyAgeS; k < 3*3600-60 || k > 3*3600+60 {
		t.Errorf("key age %v s; want about 3 h", k)
	}
}

// TestHandler: the page, its assets, the state, a table; read-only.
func TestHandler(t *testing.T) {
	testenv.CheckLeaks(t)
	src := newFake()
	d, srv := start(t, src, 50*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for d.State() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	get := func(path string) (int, string, http.Header) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	// The page comes with its style, script and the current state inline
	// (one request to the first render); the policy allows exactly those
	// inline blocks by hash.
	code, body, h := get("/ui/")
	csp := h.Get("Content-Security-Policy")
	if code != 200 || !strings.Contains(csp, "script-src 'self' 'sha256-") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("/ui/: %d, CSP %q", code, csp)
	}
	inline := func(open, close string) string {
		i := strings.Index(body, open)
		j := strings.Index(body[i+len(open):], close)
		if i < 0 || j < 0 {
			t.Fatalf("/ui/ lacks %s...%s", open, close)
		}
		return body[i+len(open) : i+len(open)+j]
	}
	for _, b := range []struct{ open, close, src string }{{"<script>", "</script>", "script-src"}, {"<style>", "</style>", "style-src"}} {
		sum := sha256.Sum256([]byte(inline(b.open, b.close)))
		if want := b.src + " 'self' 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q (the inline block's hash)", csp, want)
		}
	}
	var st0 State
	if err := json.Unmarshal([]byte(inline(`<script type="application/json" id="state0">`, "</script>")), &st0); err != nil || len(st0.FEPs) == 0 {
		t.Errorf("/ui/: inline state %v, %d FEPs; want the current state", err, len(st0.FEPs))
	}
	if code, _, _ := get("/ui/app.js"); code != 200 {
		t.Errorf("/ui/app.js: %d", code)
	}
	if code, body, _ := get("/ui/state"); code != 200 || !strings.Contains(body, `"Frankfurt"`) {
		t.Errorf("/ui/state: %d %.200s", code, body)
	}
	if code, body, _ := get("/ui/table/fra"); code != 200 || !strings.Contains(body, `"version":7`) {
		t.Errorf("/ui/table/fra: %d %s", code, body)
	}
	if code, _, _ := get("/ui/table/nyc"); code != 404 {
		t.Errorf("/ui/table/nyc (no table): %d; want 404", code)
	}
	if code, _, _ := get("/ui/table/..%2f"); code != 400 && code != 404 {
		t.Errorf("/ui/table/..%%2f: %d; want 400 or 404", code)
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		req, _ := http.NewRequest(m, srv.URL+"/ui/state", strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s /ui/state: %d; want 405", m, resp.StatusCode)
		}
	}
}

// TestPageWeight: every asset together is at most 300 KB, and the page
// loads nothing from another origin.
func TestPageWeight(t *testing.T) {
	var total int
	ext := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`)
	err := fs.WalkDir(assets, "assets", func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		b, err := fs.ReadFile(assets, p)
		if err != nil {
			return err
		}
		total += len(b)
		if ext.Match(b) {
			t.Errorf("%s loads from another origin", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page weight: %d bytes", total)
	if total > 300_000 {
		t.Errorf("page weight %d bytes > 300 KB", total)
	}
}
