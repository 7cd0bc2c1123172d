package relay_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// sizeRecorder is a ChainSource that answers the chain a-b-c and records
// the size of every lookup.
type sizeRecorder struct {
	relaytest.ChainTable
	mu    sync.Mutex
	sizes []int64
}

func (r *sizeRecorder) Lookup(from, to string, size int64) (pathcomp.ChainEntry, bool) {
	r.mu.Lock()
	r.sizes = append(r.sizes, size)
	r.mu.Unlock()
	return r.ChainTable.Lookup(from, to, size)
}

func (r *sizeRecorder) last() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sizes) == 0 {
		return -1
	}
	return r.sizes[len(r.sizes)-1]
}

// TestSizeLearningInP runs flows of 300 KB responses through a service
// whose static size hint is 1000 bytes, on the event loops and on the
// goroutine path: the InP looks its chain up with the static hint until
// DefaultSizeMinFlows flows completed, then with the learned 300000; a
// second service (another destination key) to the same origin still
// looks up with its own static hint; with learning off the static hint
// stays. mosto_relay_size_hints_total counts each lookup's source.
func TestSizeLearningInP(t *testing.T) {
	const resp = 300_000
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		io.Copy(io.Discard, c)
		c.Write(make([]byte, resp))
	})
	defer o.Close()
	for _, tc := range []struct {
		name  string
		loops int
		off   bool
		req   string
		src   string // the learned hints' source; "any": path or not
	}{
		{"loops", 0, false, "GET /obj HTTP/1.1\r\n\r\n", "learned"},   // the loops see no request bytes
		{"goroutines", -1, false, "GET /obj HTTP/1.1\r\n\r\n", "any"}, // path key if the request came before the lookup
		{"goroutines no http", -1, false, "\x16\x03\x01", "learned"},
		{"off", 0, true, "GET /obj HTTP/1.1\r\n\r\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &sizeRecorder{ChainTable: relaytest.ChainTable{{"a", "c"}: {"a", "b", "c"}}}
			w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
				c.Loops = tc.loops
				if tc.off {
					c.SizeLearning.MinFlows = -1
				}
				if len(c.Services) > 0 {
					c.Services = append(c.Services, relay.ServiceConfig{Name: "other", Listen: "127.0.0.1:0", Origin: o.Addr(), Size: 2000})
				}
			}}, "a", "b", "c")
			inp := w.Members["a"]
			inp.SetChains(rec)
			done := 0
			flow := func(addr string, want int64) {
				t.Helper()
				got := testenv.RoundTrip(t, addr, []byte(tc.req))
				if len(got) != resp {
					t.Fatalf("flow %d: %d bytes; want %d", done, len(got), resp)
				}
				if l := rec.last(); l != want {
					t.Fatalf("flow %d to %s looked up size %d; want %d", done, addr, l, want)
				}
				done++
				testenv.WaitFor(t, 5*time.Second, "the InP to finish the flow", func() bool {
					return relay.Flows(inp, relay.RoleInP, relay.OutcomeOK) >= float64(done)
				})
			}
			svc, other := inp.ServiceAddr(0).String(), inp.ServiceAddr(1).String()
			for i := range relay.DefaultSizeMinFlows + 2 {
				want := int64(1000)
				if i >= relay.DefaultSizeMinFlows && !tc.off {
					want = resp
				}
				flow(svc, want)
			}
			flow(other, 2000) // another key: still the static hint
			learned := 0.0
			if !tc.off {
				learned = 2
			}
			if got := relay.SizeHints(inp, "static"); got != float64(done)-learned {
				t.Errorf("static hints %v; want %v", got, float64(done)-learned)
			}
			switch tc.src {
			case "any":
				if got := relay.SizeHints(inp, "learned") + relay.SizeHints(inp, "learned_path"); got != learned {
					t.Errorf("learned hints %v; want %v", got, learned)
				}
			case "learned":
				if got, path := relay.SizeHints(inp, "learned"), relay.SizeHints(inp, "learned_path"); got != learned || path != 0 {
					t.Errorf("learned hints %v, by path %v; want %v, 0", got, path, learned)
				}
			}
		})
	}
}
