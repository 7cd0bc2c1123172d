package relay_test

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/evloop"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestLoopsServeHopFlows checks who carries a chained flow at the TrP and
// the EgP: with loops on, each hop's flow sits in that proxy's loops
// (Flows() counts it) and a bulk one is handed to the goroutine path with
// every byte intact; with loops: -1 none exists. Roles, outcomes and bytes
// are counted the same either way, with and without hop pools.
func TestLoopsServeHopFlows(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loops int
		pool  int
	}{{"loops", 0, 0}, {"loops+pool", 0, 2}, {"goroutines", -1, 0}, {"goroutines+pool", -1, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckLeaks(t)
			w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
				c.Loops, c.Pool.Hop = tc.loops, tc.pool
				c.Timeouts.Drain = relay.Duration(200 * time.Millisecond) // pooled connections wait on the drain
			}}, "a", "b", "c")
			loopsOf := func(r *relay.Server) *evloop.Loops {
				var ls *evloop.Loops
				testenv.WaitFor(t, 5*time.Second, "loops", func() bool {
					ls = r.Loops()
					return ls != nil || tc.loops < 0
				})
				return ls
			}
			lb, lc := loopsOf(w.Members["b"]), loopsOf(w.Members["c"])
			if tc.pool > 0 {
				// Both pools of the chain: a's to b and b's to c (a loaded
				// CI run sent the flow before b's was, and b dialed c).
				testenv.WaitFor(t, 20*time.Second, "pools filled", func() bool {
					return w.Members["a"].HopPoolIdle(w.Members["b"].HopAddr().String()) == tc.pool &&
						w.Members["b"].HopPoolIdle(w.Members["c"].HopAddr().String()) == tc.pool
				})
			}
			c := relay.DialPing(t, w.Members["a"].ServiceAddr(0).String())
			for _, x := range []struct {
				name string
				ls   *evloop.Loops
				r    *relay.Server
				role relay.Role
			}{{"b", lb, w.Members["b"], relay.RoleTrP}, {"c", lc, w.Members["c"], relay.RoleEgP}} {
				if (x.ls != nil) != (tc.loops >= 0) {
					t.Fatalf("%s: loops running = %v with loops: %d", x.name, x.ls != nil, tc.loops)
				}
				// Pooled connections waiting for a flow sit in the loops
				// too: count only the flows that have an upstream.
				if got := x.r.ActiveFlows(x.role); got != 1 {
					t.Errorf("%s: active %s flows = %v; want 1", x.name, x.role, got)
				}
				if x.ls == nil {
					continue
				}
				if n := x.ls.Flows(); n < 1 {
					t.Errorf("%s: flows in loops during a short exchange = %d; want >= 1", x.name, n)
				}
			}
			if tc.loops >= 0 && tc.pool == 0 {
				if n := lb.Flows(); n != 1 {
					t.Errorf("b: flows in loops = %d; want 1", n)
				}
			}
			relay.BulkEcho(t, c, 4<<20)
			c.(*net.TCPConn).CloseWrite()
			if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
				t.Fatalf("after half-close: %d bytes, %v; want EOF", len(rest), err)
			}
			want := float64(2 * (4 + 4<<20))
			for _, x := range []struct {
				r    *relay.Server
				role relay.Role
			}{{w.Members["a"], relay.RoleInP}, {w.Members["b"], relay.RoleTrP}, {w.Members["c"], relay.RoleEgP}} {
				testenv.WaitFor(t, 5*time.Second, x.r.ID()+" flow accounting", func() bool {
					return relay.Flows(x.r, x.role, relay.OutcomeOK) == 1 && relay.MetricSum(x.r, "mosto_relay_bytes_total") == want &&
						x.r.ActiveFlows(x.role) == 0
				})
			}
			if tc.pool > 0 {
				if p := w.Members["b"].Upstream("c", "pool"); p != 1 {
					t.Errorf("b: pooled upstream flows to c = %v; want 1", p)
				}
			}
		})
	}
}

// TestHopFlowTakenByGoroutines checks the flows a loop gives back to the
// goroutine path after reading their header: an EgP target that is a host
// name (resolved on the goroutine path) with the request sent together with
// the header. The bytes after the header reach the origin intact.
func TestHopFlowTakenByGoroutines(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	_, port, _ := net.SplitHostPort(o.Addr())
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: "origin.test:" + port, Setup: func(s *relay.Server) {
		s.SetResolver(relay.FakeResolver{"origin.test": {netip.MustParseAddr("127.0.0.1")}})
	}}, "a", "b", "c")
	testenv.WaitFor(t, 5*time.Second, "loops", func() bool { return w.Members["c"].Loops() != nil })
	msg := make([]byte, 100<<10)
	rand.Read(msg)
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), msg); sha256.Sum256(got) != sha256.Sum256(msg) {
		t.Fatalf("echo through a host-name target: %d bytes; want %d identical", len(got), len(msg))
	}
	testenv.WaitFor(t, 5*time.Second, "flow accounting", func() bool {
		return relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK) == 1 && relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeOK) == 1
	})
}

// BenchmarkIdleChainFlowMemory opens idle flows through a chain of three
// proxies in this process (a -> b -> c -> origin) and reports stack and
// heap bytes per chained flow (the three proxies together), with the hop
// listeners on the loops and on goroutines:
// go test -run '^$' -bench IdleChainFlowMemory ./internal/relay/
func BenchmarkIdleChainFlowMemory(b *testing.B) {
	for _, loops := range []int{0, -1} {
		b.Run(fmt.Sprintf("loops=%d", loops), func(b *testing.B) {
			const n = 1000
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			w := relaytest.OverlayWith(b, relaytest.Options{OriginAddr: ln.Addr().String(), Tweak: func(c *relay.Config) {
				c.Loops = loops
				c.Limits.HopMaxConnsPerSource = 0
			}}, "a", "b", "c")
			c := w.Members["c"]
			idleFlowMemory(b, ln, w.Members["a"].ServiceAddr(0).String(), n, c.ActiveConns, func() int {
				return w.Members["a"].ActiveConns() + w.Members["b"].ActiveConns() + c.ActiveConns()
			})
		})
	}
}

// TestMemberPreambleBothPaths checks the member preamble the same way on
// the loops and on goroutines: a pooled connection its owner closes after
// the grant (past the header timeout) is not a refusal; one that sends half
// a header and closes is (malformed); and a pooled connection carries a
// whole flow, header and request in one write, after waiting past the
// header timeout.
func TestMemberPreambleBothPaths(t *testing.T) {
	kr := relaytest.Keyring(t)
	for _, loops := range []int{0, -1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			testenv.CheckLeaks(t)
			o := testenv.NewServer(t, testenv.Echo)
			cfg := relaytest.Config("c", "a", "b")
			cfg.Loops = loops
			cfg.Timeouts.Header = relay.Duration(300 * time.Millisecond)
			cfg.Members["a"] = "127.0.0.1:9" // connections from 127.0.0.1 are a member's
			c := relaytest.Run(t, cfg)
			total := func() float64 {
				var n float64
				for _, r := range []string{relay.RefuseMalformed, relay.RefuseHeaderTimeout, relay.RefuseAuth} {
					n += relay.Refusals(c.Server, r)
				}
				return n
			}
			hello := func(t *testing.T) *net.TCPConn {
				t.Helper()
				conn := dialHop(t, c.Server).(*net.TCPConn)
				if g, err := relay.WritePoolHello(conn, 2*time.Second); err != nil || g != relay.DefaultPoolGrant {
					t.Fatalf("pool hello: grant %v, %v", g, err)
				}
				return conn
			}
			// Retired by its owner after the grant: quiet.
			conn := hello(t)
			time.Sleep(500 * time.Millisecond) // past the header timeout: the grant applies
			conn.Close()
			time.Sleep(200 * time.Millisecond)
			if n := total(); n != 0 {
				t.Errorf("refusals after a pooled connection closed unused = %v; want 0", n)
			}
			// Half a header, then closed: malformed.
			conn = hello(t)
			valid := signed(t, kr, []string{"a", "c"}, 1, o.Addr(), time.Now())
			conn.Write(valid[:30])
			conn.CloseWrite()
			testenv.WaitFor(t, 2*time.Second, "malformed", func() bool { return relay.Refusals(c.Server, relay.RefuseMalformed) == 1 })
			conn.Close()
			// A whole flow over a pooled connection, header and request together.
			conn = hello(t)
			time.Sleep(400 * time.Millisecond)
			conn.Write(append(signed(t, kr, []string{"a", "c"}, 1, o.Addr(), time.Now()), "pooled flow"...))
			conn.CloseWrite()
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if got, err := io.ReadAll(conn); err != nil || string(got) != "pooled flow" {
				t.Errorf("flow over a pooled connection: %q, %v", got, err)
			}
			conn.Close()
			if n := total(); n != 1 {
				t.Errorf("refusals = %v; want 1 (the half header)", n)
			}
			testenv.WaitFor(t, 2*time.Second, "egp flow", func() bool { return relay.Flows(c.Server, relay.RoleEgP, relay.OutcomeOK) == 1 })
		})
	}
}
