package api_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

// FuzzDecode feeds arbitrary bodies to every POST endpoint: the answer must
// never be a 5xx, and a 200 report must have passed validation.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(goodFEP))
	f.Add([]byte(`{"fep":"fra","samples":[{"peer":"ams","rtt_ms":9.5}]}`))
	f.Add([]byte(`{"token":"good","fep":` + goodFEP + `,"csr_pem":"x"}`))
	f.Add([]byte(`{"fep":"fra","samples":[{"peer":"ams","rtt_ms":1e400}]}`))
	f.Add([]byte(`{"fep":"fra","samples":[{"peer":"ams","unreachable":true},{"peer":"par","rtt_ms":3}]}`))
	f.Add([]byte(`{"fep":"fra","samples":[{"peer":"ams","rtt_ms":2,"unreachable":true}]}`))
	f.Add([]byte(`{"fep":"fra","destinations":[{"dest":"shop","rtt_ms":20}]}`))
	f.Add([]byte(goodDest))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Add([]byte("\x00\xff"))
	b := newFake()
	b.feps["fra"] = api.FEP{ID: "fra"}
	h := api.NewHandler(api.ServerConfig{Backend: b, Joiner: denyJoiner{}})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{api.PathFEPs, api.PathReports, api.PathJoin, api.PathDestinations} {
			req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("POST %s %q = %d %s", path, body, rec.Code, rec.Body)
			}
			if rec.Code == http.StatusOK && path == api.PathReports {
				r, err := api.DecodeJSON[api.Report](bytes.NewReader(body))
				if err != nil {
					t.Fatalf("accepted report does not decode: %v", err)
				}
				if err := r.Validate(time.Now()); err != nil {
					t.Fatalf("accepted report is invalid: %v", err)
				}
			}
			if rec.Code == http.StatusOK && path == api.PathDestinations {
				d, err := api.DecodeJSON[api.Destination](bytes.NewReader(body))
				if err != nil || d.Validate() != nil {
					t.Fatalf("accepted destination %q: %v, %v", body, err, d.Validate())
				}
			}
		}
	})
}

// FuzzTablePath checks the table query parser and path handling never fail
// with a 5xx.
func FuzzTablePath(f *testing.F) {
	f.Add("fra", "1", "0")
	f.Add("..", "x", "1h")
	f.Add("fra", "", "30")
	h := api.NewHandler(api.ServerConfig{Backend: newFake()})
	f.Fuzz(func(t *testing.T, lop, since, wait string) {
		req, err := http.NewRequest(http.MethodGet, "http://x/v1/tables/x", nil)
		if err != nil {
			return
		}
		req.URL.Path = "/v1/tables/" + lop
		q := req.URL.Query()
		q.Set("since", since)
		q.Set("wait", wait)
		req.URL.RawQuery = q.Encode()
		_, d, perr := api.ParseWatch(since, wait)
		if perr == nil && d > 10*time.Millisecond {
			return // a long poll; not what this fuzzes
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("GET %s = %d %s", req.URL, rec.Code, rec.Body)
		}
	})
}
