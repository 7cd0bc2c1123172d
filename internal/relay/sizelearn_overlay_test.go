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
// DefaultSizeMinFlows flows completed, then with the learned 300000; with
// learning off it keeps the static hint.
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
	}{{"loops", 0, false}, {"goroutines", -1, false}, {"off", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &sizeRecorder{ChainTable: relaytest.ChainTable{{"a", "c"}: {"a", "b", "c"}}}
			w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
				c.Loops = tc.loops
				if tc.off {
					c.SizeLearning.MinFlows = -1
				}
			}}, "a", "b", "c")
			w.Members["a"].SetChains(rec)
			addr := w.Members["a"].ServiceAddr(0).String()
			for i := range relay.DefaultSizeMinFlows + 2 {
				got := testenv.RoundTrip(t, addr, []byte("GET /obj HTTP/1.1\r\n\r\n"))
				if len(got) != resp {
					t.Fatalf("flow %d: %d bytes; want %d", i, len(got), resp)
				}
				want := int64(1000)
				if i >= relay.DefaultSizeMinFlows && !tc.off {
					want = resp
				}
				if l := rec.last(); l != want {
					t.Fatalf("flow %d looked up size %d; want %d", i, l, want)
				}
				testenv.WaitFor(t, 5*time.Second, "the InP to finish the flow", func() bool {
					return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeOK) >= float64(i+1)
				})
			}
		})
	}
}
