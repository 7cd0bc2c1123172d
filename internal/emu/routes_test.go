package emu

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseRoutesErrors(t *testing.T) {
	const hosts = "hosts: [{name: c}, {name: r}, {name: s}]\n"
	const links = "links: [{a: c, b: r, delay_ms: 1}, {a: r, b: s, delay_ms: 1}]\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"no via", hosts + links + "routes: [{from: c, to: s}]", "via is empty"},
		{"unknown via", hosts + links + "routes: [{from: c, to: s, via: [x]}]", `unknown host "x"`},
		{"unknown end", hosts + links + "routes: [{from: c, to: zz, via: [r]}]", `unknown host "zz"`},
		{"loop", hosts + links + "routes: [{from: c, to: s, via: [r, c]}]", "appears twice"},
		{"twice", hosts + links + "routes: [{from: c, to: s, via: [r]}, {from: s, to: c, via: [r]}]", "routed twice"},
		{"hop without delay", hosts + "links: [{a: c, b: r, delay_ms: 1}, {a: c, b: s, delay_ms: 1}]\nroutes: [{from: c, to: s, via: [r]}]", "no delay for hop r-s"},
		{"routed hop", "hosts: [{name: a}, {name: b}, {name: c}, {name: d}]\n" +
			"links: [{a: a, b: b, delay_ms: 1}, {a: b, b: c, delay_ms: 1}, {a: c, b: d, delay_ms: 1}, {a: b, b: d, delay_ms: 1}]\n" +
			"routes: [{from: a, to: c, via: [b]}, {from: a, to: d, via: [c]}]", "itself routed"},
		{"unknown field", hosts + links + "routes: [{from: c, to: s, via: [r], bogus: 1}]", "bogus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("ParseSpec = nil error; want one containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseSpec error = %q; want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestParseRoutes(t *testing.T) {
	s := mustSpec(t, `
hosts: [{name: c}, {name: r1}, {name: r2}, {name: s}]
links: [{a: c, b: r1, delay_ms: 1}, {a: r1, b: r2, delay_ms: 2}, {a: r2, b: s, delay_ms: 3}]
routes:
  - {from: c, to: s, via: [r1, r2]}
  - {from: c, to: r2, via: [r1]}
  - {from: r1, to: s, via: [r2]}
`)
	p, err := s.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.paths[[2]int{0, 3}], []int{0, 1, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("path c->s = %v; want %v", got, want)
	}
	if got, want := p.paths[[2]int{3, 0}], []int{3, 2, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("path s->c = %v; want %v", got, want)
	}
	if got, want := p.forward, []bool{false, true, true, false}; !slices.Equal(got, want) {
		t.Errorf("forwarding hosts = %v; want %v", got, want)
	}
}

// TestRoutesThroughHosts sends a pair's traffic through two on-path
// forwarding hosts: the RTT is the sum of the hops', loss set on one hop
// drops only there, and the pair's own (unused) link carries nothing.
func TestRoutesThroughHosts(t *testing.T) {
	w := Start(t, mustSpec(t, `
hosts: [{name: c}, {name: r1}, {name: r2}, {name: s}]
links:
  - {a: c, b: r1, delay_ms: 2}
  - {a: r1, b: r2, delay_ms: 5}
  - {a: r2, b: s, delay_ms: 10, loss_pct: 10}
routes:
  - {from: c, to: s, via: [r1, r2]}
  - {from: c, to: r2, via: [r1]}
  - {from: r1, to: s, via: [r2]}
`))
	ctx := context.Background()
	if got, want := w.Path("s", "c"), []string{"s", "r2", "r1", "c"}; !slices.Equal(got, want) {
		t.Errorf("Path(s, c) = %v; want %v", got, want)
	}
	if got, want := w.RTT("c", "s"), 34*time.Millisecond; got != want {
		t.Errorf("RTT(c, s) = %v; want %v", got, want)
	}
	// Loss-free hops for the RTT check.
	if err := w.SetLink("r2", "s", Link{DelayMS: 10}); err != nil {
		t.Fatal(err)
	}
	checkRTT(t, "ping c->s via r1, r2", 34*time.Millisecond, func() (Samples, error) {
		return w.Ping(ctx, "c", "s", 10, 5*time.Millisecond)
	})
	checkRTT(t, "connect c->s via r1, r2", 34*time.Millisecond, func() (Samples, error) {
		return w.ConnectRTT(ctx, "c", "s", 5)
	})
	checkRTT(t, "ping c->r2 via r1", 14*time.Millisecond, func() (Samples, error) {
		return w.Ping(ctx, "c", "r2", 5, 5*time.Millisecond)
	})
	for _, hop := range [][2]string{{"c", "r1"}, {"r1", "r2"}, {"r2", "s"}, {"s", "r2"}, {"r2", "r1"}, {"r1", "c"}} {
		if st := w.Stats(hop[0], hop[1]); st.Packets == 0 {
			t.Errorf("hop %s->%s carried no packets; want the routed traffic", hop[0], hop[1])
		}
	}
	for _, pair := range [][2]string{{"c", "s"}, {"s", "c"}, {"c", "r2"}} {
		if st := w.Stats(pair[0], pair[1]); st.Packets != 0 {
			t.Errorf("direct %s->%s carried %d packets; want 0 (routed)", pair[0], pair[1], st.Packets)
		}
	}
	// 10% loss on r2->s only.
	if err := w.SetLinkDir("r2", "s", Link{DelayMS: 10, LossPct: 10}); err != nil {
		t.Fatal(err)
	}
	before := w.Stats("r2", "s")
	const n = 3000
	got, _, err := w.UDPLoss(ctx, "c", "s", n, 200, 100*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	after := w.Stats("r2", "s")
	if lost := n - got; lost < 210 || lost > 390 {
		t.Errorf("10%% loss on r2->s dropped %d of %d datagrams c->s; want 210..390", lost, n)
	}
	if d := after.LossDrops - before.LossDrops; d < 210 {
		t.Errorf("r2->s counted %d loss drops; want the datagrams lost there", d)
	}
	for _, hop := range [][2]string{{"c", "r1"}, {"r1", "r2"}} {
		if st := w.Stats(hop[0], hop[1]); st.LossDrops != 0 {
			t.Errorf("hop %s->%s dropped %d packets; want 0 (no loss set)", hop[0], hop[1], st.LossDrops)
		}
	}
	// TCP over the route: GSO super-packets forwarded as they are on
	// clean hops, segmented (and forwarded as partial-checksum segments) on
	// a lossy one.
	for _, loss := range []float64{0, 1} {
		if err := w.SetLink("r2", "s", Link{DelayMS: 10, LossPct: loss}); err != nil {
			t.Fatal(err)
		}
		before := w.Stats("s", "r2")
		res, err := w.Fetch(ctx, "c", "s", 4<<20)
		if err != nil {
			t.Fatalf("fetch 4 MiB c<-s over the route with %v%% loss: %v", loss, err)
		}
		after := w.Stats("s", "r2")
		if loss > 0 && after.LossDrops == before.LossDrops {
			t.Errorf("fetch with 1%% loss on s->r2: no loss drops counted there")
		}
		t.Logf("fetch 4 MiB over c-r1-r2-s, %v%% loss on r2-s: %v", loss, res.Time)
	}
	if w.Unrouted() != 0 {
		t.Errorf("Unrouted = %d; want 0", w.Unrouted())
	}
}

// TestJitterGSOForwarded: on jitter_gso links a GSO super-packet travels
// whole, also across the forwarding host (one jitter draw per packet the
// sender's kernel handed over, as netem per skb on veth); without it the
// rate-limited, jittered hops carry single segments.
func TestJitterGSOForwarded(t *testing.T) {
	w := Start(t, mustSpec(t, `
hosts: [{name: c}, {name: r}, {name: s}]
links:
  - {a: c, b: r, delay_ms: 5, jitter_ms: 1, reorder: true, rate_mbit: 100, loss_pct: 0.000001, jitter_gso: true}
  - {a: r, b: s, delay_ms: 5, jitter_ms: 1, reorder: true, rate_mbit: 100, loss_pct: 0.000001, jitter_gso: true}
routes:
  - {from: c, to: s, via: [r]}
`))
	ctx := context.Background()
	perPacket := func(a, b string, before LinkStats) float64 {
		st := w.Stats(a, b)
		return float64(st.Bytes-before.Bytes) / float64(max(st.Packets-before.Packets, 1))
	}
	for _, gso := range []bool{true, false} {
		for _, hop := range [][2]string{{"c", "r"}, {"r", "s"}} {
			l := Link{DelayMS: 5, JitterMS: 1, Reorder: true, RateMbit: 100, LossPct: 1e-6, JitterGSO: gso}
			if err := w.SetLink(hop[0], hop[1], l); err != nil {
				t.Fatal(err)
			}
		}
		sr, rc := w.Stats("s", "r"), w.Stats("r", "c")
		if _, err := w.Fetch(ctx, "c", "s", 8<<20); err != nil {
			t.Fatalf("fetch 8 MiB c<-s via r (jitter_gso %v): %v", gso, err)
		}
		sender, forwarded := perPacket("s", "r", sr), perPacket("r", "c", rc)
		t.Logf("jitter_gso %v: %.0f bytes per delivered packet s->r, %.0f r->c", gso, sender, forwarded)
		if gso && (sender < 3000 || forwarded < 3000) {
			t.Errorf("jitter_gso: %.0f / %.0f bytes per delivered packet on s->r / r->c; want GSO packets kept whole (> 3000)", sender, forwarded)
		}
		if !gso && (sender > 1500 || forwarded > 1500) {
			t.Errorf("per-segment jitter: %.0f / %.0f bytes per delivered packet on s->r / r->c; want single segments (<= 1500)", sender, forwarded)
		}
	}
}
