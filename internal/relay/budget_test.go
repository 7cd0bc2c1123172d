package relay

import (
	"crypto/rand"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestHopFloodKeepsEntryBudget (issue 13 item 4): one address holding
// header-less connections on the hop port neither fills the budget the
// entries use (each listener kind has its own) nor holds more than the
// default per-source cap of a non-member.
func TestHopFloodKeepsEntryBudget(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, func(c *net.TCPConn) { io.Copy(c, c) })
	cfg := baseConfig("a")
	cfg.Limits = LimitConfig{MaxConns: 8, MaxConnsPerSource: 100}
	cfg.Timeouts.Header = Duration(time.Minute) // the flood is held, not timed out
	cfg.Services = []ServiceConfig{{Listen: "127.0.0.1:0", Origin: o.Addr()}}
	a := start(t, cfg)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 30 {
		c, err := net.Dial("tcp", a.HopAddr().String())
		if err != nil {
			if isReset(err) {
				continue
			}
			t.Fatal(err)
		}
		held = append(held, c)
	}
	testenv.WaitFor(t, 10*time.Second, "the hop budget full", func() bool { return refusals(a.Server, refuseLimitGlobal) >= 22 })
	c, err := net.Dial("tcp", a.ServiceAddr(0).String())
	if err != nil {
		t.Fatalf("entry during a hop-port flood: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("z"))
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'z' {
		t.Fatalf("entry during a hop-port flood: %q, %v; want the echo", b, err)
	}
}

// TestHopPerSourceDefault (issue 13 item 4): a non-member address holds at
// most DefaultHopMaxConnsPerSource hop connections by default.
func TestHopPerSourceDefault(t *testing.T) {
	testenv.CheckLeaks(t)
	cfg := baseConfig("a")
	cfg.Timeouts.Header = Duration(time.Minute)
	a := start(t, cfg)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	n := DefaultHopMaxConnsPerSource + 20
	for range n {
		c, err := net.Dial("tcp", a.HopAddr().String())
		if err != nil {
			if isReset(err) {
				continue
			}
			t.Fatal(err)
		}
		held = append(held, c)
	}
	testenv.WaitFor(t, 10*time.Second, "20 refusals", func() bool { return refusals(a.Server, refuseLimitSource) == 20 })
	if got := a.accept.limits.total(); got != DefaultHopMaxConnsPerSource {
		t.Errorf("hop connections admitted from one non-member address = %d; want %d", got, DefaultHopMaxConnsPerSource)
	}
}

func TestConnLimiterSources(t *testing.T) {
	member := netip.MustParseAddr("192.0.2.7")
	l := newConnLimiter(100, 100, 2, 2, func(ip netip.Addr) bool { return ip == member })
	// IPv6: one /64 is one source.
	for i, want := range []string{"", "", refuseLimitSource} {
		ip := netip.MustParseAddr("2001:db8:1:2::" + string(rune('a'+i)))
		if got := l.acquire(ip, false); got != want {
			t.Errorf("entry %d from 2001:db8:1:2::/64 = %q; want %q", i, got, want)
		}
	}
	if got := l.acquire(netip.MustParseAddr("2001:db8:1:3::1"), false); got != "" {
		t.Errorf("another /64 = %q; want admitted", got)
	}
	// Members are not capped on the hop listener; strangers are.
	for i := range 5 {
		if got := l.acquire(member, true); got != "" {
			t.Fatalf("member hop connection %d = %q; want admitted", i, got)
		}
	}
	stranger := netip.MustParseAddr("198.51.100.9")
	for i, want := range []string{"", "", refuseLimitSource} {
		if got := l.acquire(stranger, true); got != want {
			t.Errorf("stranger hop connection %d = %q; want %q", i, got, want)
		}
	}
	// Separate budgets: a full hop budget leaves the entries theirs.
	l2 := newConnLimiter(1, 1, 10, 10, nil)
	if l2.acquire(stranger, true) != "" || l2.acquire(stranger, true) != refuseLimitGlobal {
		t.Fatal("hop budget of 1")
	}
	if got := l2.acquire(stranger, false); got != "" {
		t.Errorf("entry with a full hop budget = %q; want admitted", got)
	}
	l2.release(stranger, true)
	if got := l2.acquire(stranger, true); got != "" {
		t.Errorf("hop after a release = %q", got)
	}
}

// TestReplayCacheConfigured (issue 13 item 8): hop.replay_entries sizes the
// replay cache and its evictions and size are exported.
func TestReplayCacheConfigured(t *testing.T) {
	testenv.CheckLeaks(t)
	cfg := baseConfig("a")
	cfg.Hop.ReplayEntries = 3
	a := start(t, cfg)
	for range 5 {
		h := &hop.Header{Route: []string{"x", "a"}, Hop: 1, Target: "127.0.0.1:9", Time: time.Now()}
		rand.Read(h.FlowID[:])
		if a.overlay.replay.Seen(h) {
			t.Fatal("a fresh header seen")
		}
	}
	got := map[string]float64{}
	for _, mf := range a.Registry().Gather() {
		if m := mf.Series; len(m) == 1 {
			got[mf.Name] = m[0].Value
		}
	}
	if got["mosto_relay_replay_capacity"] != 3 || got["mosto_relay_replay_entries"] != 3 || got["mosto_relay_replay_evictions_total"] != 2 {
		t.Errorf("replay metrics capacity %v, entries %v, evictions %v; want 3, 3, 2", got["mosto_relay_replay_capacity"],
			got["mosto_relay_replay_entries"], got["mosto_relay_replay_evictions_total"])
	}
}
