package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/probe"
)

// TestReporterUnreachable checks the report an unreachable peer becomes, and
// that against a controller that does not know the field (strict decoding
// refuses it) the RTTs still get through.
func TestReporterUnreachable(t *testing.T) {
	now := time.Now()
	samples := []probe.Sample{
		{Peer: "ams", RTT: 8 * time.Millisecond, At: now},
		{Peer: "par", At: now, Unreachable: true},
	}
	for _, old := range []bool{false, true} {
		var mu sync.Mutex
		var bodies []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			bodies = append(bodies, string(b))
			mu.Unlock()
			if old && strings.Contains(string(b), `"unreachable"`) {
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"error":"decode: json: unknown field \"unreachable\""}`)
				return
			}
			io.WriteString(w, `{"accepted":1,"changed":1}`)
		}))
		a := &Agent{cfg: Config{FEP: api.FEP{ID: "fra"}}, log: slog.New(slog.DiscardHandler), reregister: make(chan struct{}, 1)}
		err := a.reporter(&api.Client{BaseURL: srv.URL, HTTP: srv.Client()}, false)(context.Background(), samples)
		srv.Close()
		if err != nil {
			t.Errorf("old controller %v: report: %v", old, err)
		}
		want := []string{`"peer":"ams","rtt_ms":8`, `"peer":"par"`, `"unreachable":true`}
		if len(bodies) != 1+btoi(old) {
			t.Fatalf("old controller %v: %d requests; want %d", old, len(bodies), 1+btoi(old))
		}
		for _, w := range want {
			if !strings.Contains(bodies[0], w) {
				t.Errorf("old controller %v: report %s; want %s in it", old, bodies[0], w)
			}
		}
		if strings.Contains(bodies[0], `"par","rtt_ms"`) {
			t.Errorf("unreachable sample carries an rtt_ms: %s", bodies[0])
		}
		if old && (strings.Contains(bodies[1], "par") || !strings.Contains(bodies[1], "ams")) {
			t.Errorf("retry to an old controller %s; want ams only", bodies[1])
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
