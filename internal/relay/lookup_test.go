package relay

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/testenv"
)

// lopWorld is an InP "a" without a table whose LoP is "l", the LoP "l"
// holding the table, a TrP "t" and an EgP "e", all on loopback. A service
// on a leads to origin.
type lopWorld struct {
	a, l, t, e *running
	members    map[string]string
}

func newLoPWorld(t *testing.T, origin string, table chainTable) *lopWorld {
	t.Helper()
	return newLoPWorldEgress(t, origin, table, "e")
}

// newLoPWorldEgress is newLoPWorld with egp as the InP's EgP.
func newLoPWorldEgress(t *testing.T, origin string, table chainTable, egp string) *lopWorld {
	t.Helper()
	ca := baseConfig("a", "l", "t", "e")
	ca.LoP = "l"
	ca.Egress.Default = egp
	ca.Services = []ServiceConfig{{Name: "svc", Listen: "127.0.0.1:0", Origin: origin, Size: 1000}}
	w := &lopWorld{
		a: start(t, ca),
		l: start(t, baseConfig("l", "a", "t", "e")),
		t: start(t, baseConfig("t", "a", "l", "e")),
		e: start(t, baseConfig("e", "a", "l", "t")),
	}
	w.members = map[string]string{
		"a": w.a.HopAddr().String(), "l": w.l.HopAddr().String(),
		"t": w.t.HopAddr().String(), "e": w.e.HopAddr().String(),
	}
	for _, s := range w.all() {
		s.SetMembers(w.members)
	}
	w.l.SetChains(table) // only the LoP holds a table
	return w
}

func (w *lopWorld) all() []*running { return []*running{w.a, w.l, w.t, w.e} }

func lookups(s *running, result string) float64 {
	return counterValue(s.lookups.c.WithLabelValues(result))
}

func upstream(s *running, peer string) float64 {
	return counterValue(s.m.upstream.WithLabelValues(peer, "dial")) + counterValue(s.m.upstream.WithLabelValues(peer, "pool"))
}

// TestRemoteLoP sends a flow from an InP without a table through its LoP
// and checks, on every proxy's counters, which chain the flow took.
func TestRemoteLoP(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	viaT := map[string]map[string]float64{ // proxy -> next hop -> flows
		"a": {"l": 1}, "l": {"t": 1, "e": 0}, "t": {"e": 1}, "e": {"origin": 1},
	}
	direct := map[string]map[string]float64{
		"a": {"l": 1}, "l": {"t": 0, "e": 1}, "t": {"e": 0}, "e": {"origin": 1},
	}
	for _, tc := range []struct {
		name   string
		table  chainTable
		result string // at the LoP
		next   map[string]map[string]float64
	}{
		{"chain of the InP through the LoP", chainTable{{"a", "e"}: {"a", "l", "t", "e"}}, lookupCompleted, viaT},
		{"chain of the InP around the LoP", chainTable{{"a", "e"}: {"a", "t", "e"}}, lookupCompleted, viaT},
		{"chain of the LoP", chainTable{{"l", "e"}: {"l", "t", "e"}}, lookupCompleted, viaT},
		{"no chain", chainTable{}, lookupNoChain, direct},
		{"chain back through the InP is not used", chainTable{{"l", "e"}: {"l", "a", "e"}}, lookupNoChain, direct},
		{"chain of the InP with a loop is not used", chainTable{{"a", "e"}: {"a", "l", "t", "l", "e"}}, lookupNoChain, direct},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newLoPWorld(t, o.Addr(), tc.table)
			msg := make([]byte, 100<<10)
			rand.Read(msg)
			if got := testenv.RoundTrip(t, w.a.ServiceAddr(0).String(), msg); !bytes.Equal(got, msg) {
				t.Fatalf("echo through the LoP: got %d bytes, want %d identical", len(got), len(msg))
			}
			testenv.WaitFor(t, 5*time.Second, "flow accounting", func() bool {
				return flows(w.a.Server, roleInP, outcomeOK) == 1 && flows(w.e.Server, roleEgP, outcomeOK) == 1 &&
					flows(w.l.Server, roleTrP, outcomeOK) == 1 && flows(w.t.Server, roleTrP, outcomeOK) == tc.next["t"]["e"]
			})
			if n := lookups(w.a, lookupAsked); n != 1 {
				t.Errorf("a: lookup{asked} = %v; want 1", n)
			}
			if n := lookups(w.l, tc.result); n != 1 {
				t.Errorf("l: lookup{%s} = %v; want 1", tc.result, n)
			}
			byID := map[string]*running{"a": w.a, "l": w.l, "t": w.t, "e": w.e}
			for id, nexts := range tc.next {
				for next, want := range nexts {
					if n := upstream(byID[id], next); n != want {
						t.Errorf("%s -> %s: %v flows; want %v", id, next, n, want)
					}
				}
			}
			if n := flows(w.t.Server, roleTrP, outcomeOK); n != tc.next["t"]["e"] {
				t.Errorf("t carried %v flows; want %v", n, tc.next["t"]["e"])
			}
			if n := testutilDirect(w.a.Server, "no_chain") + testutilDirect(w.a.Server, "hop_unreachable"); n != 0 {
				t.Errorf("a went direct %v times; want 0", n)
			}
		})
	}
}

// TestRemoteLoPIsEgP: when the EgP is the LoP itself the InP asks no
// lookup and the LoP exits to the origin.
func TestRemoteLoPIsEgP(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := newLoPWorldEgress(t, o.Addr(), chainTable{{"a", "e"}: {"a", "l", "t", "e"}}, "l")
	if got := testenv.RoundTrip(t, w.a.ServiceAddr(0).String(), []byte("to l")); string(got) != "to l" {
		t.Fatalf("echo = %q", got)
	}
	testenv.WaitFor(t, 5*time.Second, "flow at the LoP as EgP", func() bool { return flows(w.l.Server, roleEgP, outcomeOK) == 1 })
	if n := lookups(w.l, lookupCompleted) + lookups(w.l, lookupNoChain) + lookups(w.l, lookupSelfEgress); n != 0 {
		t.Errorf("l answered %v lookups; want none (no lookup asked)", n)
	}
	if n := upstream(w.l, "origin"); n != 1 {
		t.Errorf("l -> origin: %v flows; want 1", n)
	}
}

// TestRemoteLoPUnreachable checks the fallbacks of an InP whose LoP is
// down: one hop straight to the EgP, and to the origin when the EgP is down
// too.
func TestRemoteLoPUnreachable(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := newLoPWorld(t, o.Addr(), chainTable{{"a", "e"}: {"a", "l", "t", "e"}})
	dead := closedAddr(t)
	m := copyMap(w.members)
	m["l"] = dead
	w.a.SetMembers(m)
	if got := testenv.RoundTrip(t, w.a.ServiceAddr(0).String(), []byte("fallback")); string(got) != "fallback" {
		t.Fatalf("echo = %q", got)
	}
	testenv.WaitFor(t, 5*time.Second, "flow at the EgP", func() bool { return flows(w.e.Server, roleEgP, outcomeOK) == 1 })
	if a, f := lookups(w.a, lookupUnreachable), lookups(w.a, lookupFallbackEgP); a != 1 || f != 1 {
		t.Errorf("a: lookup{lop_unreachable} = %v, {fallback_egp} = %v; want 1, 1", a, f)
	}
	if n := upstream(w.a, "e"); n != 1 {
		t.Errorf("a -> e: %v flows; want 1", n)
	}
	if n := flows(w.l.Server, roleTrP, outcomeOK) + flows(w.t.Server, roleTrP, outcomeOK); n != 0 {
		t.Errorf("l and t carried %v flows; want 0", n)
	}

	m["e"] = dead
	w.a.SetMembers(m)
	if got := testenv.RoundTrip(t, w.a.ServiceAddr(0).String(), []byte("direct")); string(got) != "direct" {
		t.Fatalf("echo = %q", got)
	}
	if n := testutilDirect(w.a.Server, "hop_unreachable"); n != 1 {
		t.Errorf("a: direct{hop_unreachable} = %v; want 1", n)
	}
	if n := lookups(w.a, lookupUnreachable); n != 2 {
		t.Errorf("a: lookup{lop_unreachable} = %v; want 2", n)
	}
}

// TestLookupRefusals sends forged or misplaced route completion requests
// straight to the LoP: each is refused with its counter and the connection
// closed, and the LoP keeps serving real flows.
func TestLookupRefusals(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := newLoPWorld(t, o.Addr(), chainTable{{"a", "e"}: {"a", "l", "t", "e"}})
	kr := testKeyring(t)
	other, err := hop.NewKeyring(hop.Key{ID: 1, Secret: []byte("not the overlay key, 32 bytes...")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		kr     *hop.Keyring
		route  []string
		hop    int
		lookup string
		reason string
	}{
		{"unauthenticated", other, []string{"a", "l"}, 1, "e", refuseAuth},
		{"asked by a TrP", kr, []string{"a", "t", "l"}, 2, "e", refuseLookupInvalid},
		{"asked by a non-member", kr, []string{"x", "l"}, 1, "e", refuseLookupNotMember},
		{"asked by itself", kr, []string{"l", "l"}, 1, "e", refuseLookupNotMember},
		{"EgP not a member", kr, []string{"a", "l"}, 1, "zz", refuseNotMember},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := refusals(w.l.Server, tc.reason)
			h := &hop.Header{Route: tc.route, Hop: tc.hop, Lookup: tc.lookup, Target: o.Addr(), Size: 1, Time: time.Now()}
			rand.Read(h.FlowID[:])
			b, err := h.Marshal(tc.kr)
			if err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp", w.l.HopAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(append(b, "payload"...))
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := io.Copy(io.Discard, c); n != 0 || isTimeout(err) {
				t.Errorf("refused connection: read %d bytes, %v; want a prompt close", n, err)
			}
			testenv.WaitFor(t, 2*time.Second, "refusal counter", func() bool { return refusals(w.l.Server, tc.reason) == before+1 })
		})
	}
	if n := lookups(w.l, lookupCompleted) + lookups(w.l, lookupNoChain); n != 0 {
		t.Errorf("l completed %v refused requests", n)
	}
	if got := testenv.RoundTrip(t, w.a.ServiceAddr(0).String(), []byte("still serving")); string(got) != "still serving" {
		t.Fatalf("echo after refusals = %q", got)
	}
	if n := lookups(w.l, lookupCompleted); n != 1 {
		t.Errorf("l: lookup{completed} = %v; want 1", n)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
