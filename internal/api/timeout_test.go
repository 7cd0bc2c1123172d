package api_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

// slowBackend's reports block until their context ends (a stuck store)
// and say how they ended.
type slowBackend struct {
	*fakeBackend
	ended chan error
}

func (b *slowBackend) Report(ctx context.Context, r api.Report) (api.ReportResult, error) {
	<-ctx.Done()
	b.ended <- ctx.Err()
	return api.ReportResult{}, ctx.Err()
}

// TestRequestTimeout (issue 13 item 10): the server stops working on a
// request after its per-request timeout, or sooner when the client said it
// waits less (Mosto-Timeout, set by api.Client from its context); a
// long-poll's wait is added to the budget, not cut by it.
func TestRequestTimeout(t *testing.T) {
	b := &slowBackend{fakeBackend: newFake(), ended: make(chan error, 4)}
	b.feps["fra"] = api.FEP{ID: "fra"}
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: b, RequestTimeout: 2 * time.Second}))
	defer srv.Close()
	body := []byte(`{"fep":"fra","samples":[{"peer":"par","rtt_ms":5}]}`)

	post := func(header string) (int, time.Duration) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+api.PathReports, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set(api.TimeoutHeader, header)
		}
		start := time.Now()
		resp, err := http.DefaultClient.Do(req) // no client timeout: the server must end it
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, time.Since(start)
	}
	for _, tc := range []struct {
		name, header string
		min, max     time.Duration
	}{
		{"server's timeout", "", 2 * time.Second, 20 * time.Second},
		{"client's shorter wait", "300ms", 300 * time.Millisecond, 1900 * time.Millisecond},
		{"client's longer wait is capped", "1h", 2 * time.Second, 20 * time.Second},
	} {
		code, d := post(tc.header)
		if code != http.StatusServiceUnavailable || d < tc.min || d > tc.max {
			t.Errorf("%s: %d after %v; want 503 within [%v, %v]", tc.name, code, d, tc.min, tc.max)
		}
		select {
		case err := <-b.ended:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: the backend's context ended with %v; want its deadline", tc.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the backend never saw its context end", tc.name)
		}
	}

	// api.Client sends its context's deadline.
	var sent string
	c := &api.Client{BaseURL: srv.URL, HTTP: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r.Header.Get(api.TimeoutHeader)
		return http.DefaultTransport.RoundTrip(r)
	})}}
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	c.Report(ctx, api.Report{FEP: "fra", Samples: []api.Sample{{Peer: "par", RTTMS: 5}}})
	if d, err := time.ParseDuration(sent); err != nil || d <= 0 || d > 400*time.Millisecond {
		t.Errorf("api.Client sent %s %q; want its remaining wait (0, 400ms]", api.TimeoutHeader, sent)
	}
	select {
	case <-b.ended: // its deadline, or the client closing first: either way it stopped
	case <-time.After(1900 * time.Millisecond):
		t.Error("the server kept working past the api.Client's 400 ms deadline")
	}

	// A long-poll waits its whole wait although it exceeds RequestTimeout.
	tb := newFake()
	tsrv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: tb, RequestTimeout: 200 * time.Millisecond}))
	defer tsrv.Close()
	start := time.Now()
	resp, err := http.Get(tsrv.URL + api.PathTables + "fra?since=5&wait=1s")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := time.Since(start); resp.StatusCode != http.StatusNotModified || d < time.Second {
		t.Errorf("long-poll with wait=1s and a 200 ms request timeout: %d after %v; want 304 after >= 1s", resp.StatusCode, d)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
