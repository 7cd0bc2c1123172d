package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestHopPoolChain: with pools, flows ride pooled connections (hits on the
// InP and the TrP), bytes arrive intact, and pooled connections idle longer
// than the peer's header timeout are not killed by it (member_idle).
func TestHopPoolChain(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
		c.Timeouts.Header = relay.Duration(300 * time.Millisecond)
		c.Hop.MemberIdle = relay.Duration(20 * time.Second)
		c.Pool.Hop = 2
		c.Pool.Origin = 1
	}}, "a", "b", "c")
	bAddr, cAddr := w.Members["b"].HopAddr().String(), w.Members["c"].HopAddr().String()
	testenv.WaitFor(t, 5*time.Second, "pools filled", func() bool {
		return w.Members["a"].HopPoolIdle(bAddr) == 2 && w.Members["b"].HopPoolIdle(cAddr) == 2
	})
	// Idle for more than twice the header timeout: the pooled connections
	// must survive on the receiving side.
	time.Sleep(800 * time.Millisecond)
	for i := range 3 {
		relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 64<<10+i)
	}
	for _, c := range []struct {
		s    *relay.Server
		name string
	}{{w.Members["a"], "a"}, {w.Members["b"], "b"}} {
		if h := relay.PoolCount(c.s, "hop", relay.PoolHit); h < 3 {
			t.Errorf("%s: %v hop pool hits; want >= 3 (misses %v, stale %v)", c.name, h, relay.PoolCount(c.s, "hop", relay.PoolMiss), relay.PoolCount(c.s, "hop", relay.PoolStale))
		}
	}
	for _, s := range w.Members {
		if n := relay.Refusals(s, relay.RefuseHeaderTimeout); n != 0 {
			t.Errorf("%s: %v header timeouts; pooled connections must wait", s.ID(), n)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "3 ok flows at the EgP", func() bool { return relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK) == 3 })
	// The EgP learned the origin: later flows use its origin pool.
	testenv.WaitFor(t, 5*time.Second, "origin pool filled", func() bool { return w.Members["c"].OriginPoolIdle(o.Addr()) == 1 })
	relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 1000)
	if h := relay.PoolCount(w.Members["c"], "origin", relay.PoolHit); h < 1 {
		t.Errorf("origin pool hits = %v; want >= 1", h)
	}
	// Every flow is counted per next hop whether its connection came from
	// a pool or a dial (the demo reads chains from this counter).
	for _, c := range []struct {
		s    *relay.Server
		peer string
	}{{w.Members["a"], "b"}, {w.Members["b"], "c"}, {w.Members["c"], "origin"}} {
		up := c.s.Upstream(c.peer, "pool") + c.s.Upstream(c.peer, "dial")
		if up != 4 {
			t.Errorf("%s: upstream flows to %s = %v; want 4", c.s.ID(), c.peer, up)
		}
	}
	if p := w.Members["a"].Upstream("b", "pool"); p < 3 {
		t.Errorf("a: pooled upstream flows to b = %v; want >= 3", p)
	}
}

// TestHopPoolLearnedInLargeOverlay: in an overlay of more than
// MaxPooledMembers others, a proxy keeps no pools up front and pools the
// next hops its flows use.
func TestHopPoolLearnedInLargeOverlay(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
		c.Timeouts.Header = relay.Duration(300 * time.Millisecond)
		c.Hop.MemberIdle = relay.Duration(20 * time.Second)
		c.Pool.Hop = 2
	}}, "a", "b", "c")
	if n := len(w.Members["a"].HopPoolTargets()); n != 2 {
		t.Fatalf("3-member overlay: %d pooled-up-front members; want 2", n)
	}
	members := map[string]string{
		"a": w.Members["a"].HopAddr().String(), "b": w.Members["b"].HopAddr().String(), "c": w.Members["c"].HopAddr().String(),
	}
	const far = "127.0.0.1:9" // never dialed: not pooled up front, never a next hop
	for i := range relay.MaxPooledMembers {
		members[fmt.Sprintf("m%02d", i)] = far
	}
	for _, s := range w.Members {
		s.SetMembers(members)
	}
	if got := w.Members["a"].HopPoolTargets(); got != nil {
		t.Fatalf("%d-member overlay: pooled up front %v; want none", len(members), got)
	}
	bAddr, cAddr := w.Members["b"].HopAddr().String(), w.Members["c"].HopAddr().String()
	// Pools filled while the overlay was small drain only as they are used
	// or expire; what matters is that no new up-front target appears.
	relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 1000)
	testenv.WaitFor(t, 5*time.Second, "next hops pooled", func() bool {
		return w.Members["a"].HopPoolIdle(bAddr) == 2 && w.Members["b"].HopPoolIdle(cAddr) == 2
	})
	if n := w.Members["a"].HopPoolIdle(far); n != 0 {
		t.Errorf("%d pooled connections to a member no flow used", n)
	}
	hits := relay.PoolCount(w.Members["a"], "hop", relay.PoolHit)
	for i := range 2 {
		relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 2000+i)
	}
	if h := relay.PoolCount(w.Members["a"], "hop", relay.PoolHit) - hits; h < 2 {
		t.Errorf("a: %v hop pool hits after learning b; want 2", h)
	}
}

// TestPoolWithoutMemberIdle: members at the default hop.member_idle (0)
// keep pooled connections idle past their header timeout, because the pool
// hello asks for it; no header timeout is counted and flows use the pools.
func TestPoolWithoutMemberIdle(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
		c.Timeouts.Header = relay.Duration(300 * time.Millisecond)
		c.Pool.Hop = 1
	}}, "a", "b", "c")
	bAddr, cAddr := w.Members["b"].HopAddr().String(), w.Members["c"].HopAddr().String()
	testenv.WaitFor(t, 5*time.Second, "pools filled", func() bool {
		return w.Members["a"].HopPoolIdle(bAddr) == 1 && w.Members["b"].HopPoolIdle(cAddr) == 1
	})
	time.Sleep(800 * time.Millisecond) // > 2 header timeouts
	for i := range 2 {
		relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 10000+i)
	}
	for _, s := range []*relay.Server{w.Members["a"], w.Members["b"]} {
		if h := relay.PoolCount(s, "hop", relay.PoolHit); h < 1 {
			t.Errorf("%s: %v hop pool hits; want >= 1", s.ID(), h)
		}
	}
	for _, s := range w.Members {
		if n := relay.Refusals(s, relay.RefuseHeaderTimeout); n != 0 {
			t.Errorf("%s: %v header timeouts; pooled connections must wait", s.ID(), n)
		}
		if n := relay.PoolCount(s, "hop", relay.PoolUnsupported); n != 0 {
			t.Errorf("%s: %v members without pool support; want 0", s.ID(), n)
		}
	}
}
