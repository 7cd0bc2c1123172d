package getbench

import (
	"context"
	"fmt"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/origin"
)

// The failure scenario's world decides what a silence can cost. In Spec
// each source's own link to the client is its bottleneck and the three
// links are saturated in normal mode: while Paris is silent the others
// cannot rise, and the download loses 7 s x Paris' share of the capacity
// whatever the client does (see FailureBound). In seed 003's run the
// other sources' rates rose by 76.5% and ~30% while the fastest was
// silent: their paths had headroom, the subscriber's side being the shared
// limit. AccessSpec is that world: the client reaches every source
// through one access link (the shared bottleneck), and each source's path
// beyond it has a capacity of its own, Paris' the largest (the best alone,
// as the seed's France).

// accessMbit is the client's access link; accessSources the capacity of
// each source's path beyond it (Mbit/s).
const accessMbit = 36.0

var accessSources = map[string]float64{"budapest": 20, "paris": 24, "frankfurt": 14}

// AccessSpec returns the world of the failure-access scenario: client and
// gateway "gw" in Athens (a 0.25 ms link of accessMbit), the sources'
// pairs with the client routed through gw, gw's link to each source at the
// WonderProxy RTT and the source's path capacity. CUBIC everywhere (the
// seed's sub-flows are loss-based TCP windows; BBR would not share the
// access link by loss).
func AccessSpec() *emu.Spec {
	s := &emu.Spec{Name: "get-access", Dataset: "wonderproxy", TCP: emu.TCP{Congestion: "cubic"}}
	off := false
	s.Offload = &off
	s.Hosts = append(s.Hosts, emu.HostSpec{Name: client, Location: "Athens"}, emu.HostSpec{Name: "gw", Location: "Athens"})
	d, r := 0.25, accessMbit
	s.Links = append(s.Links, emu.LinkSpec{A: client, B: "gw", DelayMS: &d, RateMbit: &r})
	for _, src := range sources {
		s.Hosts = append(s.Hosts, emu.HostSpec{Name: src.host, Location: src.city})
		r := accessSources[src.host]
		s.Links = append(s.Links, emu.LinkSpec{A: "gw", B: src.host, RateMbit: &r})
		s.Routes = append(s.Routes, emu.RouteSpec{From: client, To: src.host, Via: []string{"gw"}})
	}
	return s
}

// failureAccess runs the failure scenario in AccessSpec's world (its own
// world and origins, brought up for it).
func (b *bench) failureAccess(ctx context.Context) error {
	w, err := emu.Up(ctx, AccessSpec(), b.cfg.Log)
	if err != nil {
		return fmt.Errorf("getbench: %w", err)
	}
	defer w.Close()
	ab := &bench{cfg: b.cfg, w: w, origins: map[string]*origin.Server{}}
	octx, cancel := context.WithCancel(context.Background())
	done := make(chan error, len(sources))
	n := 0
	defer func() {
		cancel()
		for range n {
			<-done
		}
	}()
	for _, src := range sources {
		ln, err := w.Listen(ctx, src.host, "tcp", ab.addr(src.host, portHTTP))
		if err != nil {
			return fmt.Errorf("getbench: %w", err)
		}
		o := origin.New(origin.Config{Seed: 3}, b.cfg.Log.With("host", src.host, "world", "access"))
		ab.origins[src.host] = o
		n++
		go func() { done <- o.Serve(octx, ln) }()
	}
	err = ab.failureIn(ctx, "failure-access")
	b.results = append(b.results, ab.results...)
	return err
}

// capacities returns, for scenario sc, the payload capacity (bytes/s) of
// all sources together and of all but Paris: what the world can carry
// normally and while Paris is silent. TCP/IP headers take 52 of every
// 1500 bytes on the emulated links (MSS 1448 with timestamps).
func capacities(sc string) (all, others float64) {
	const payload = 1448.0 / 1500
	for _, src := range sources {
		r := src.mbit
		if sc == "failure-access" {
			r = accessSources[src.host]
		}
		all += r
		if src.host != "paris" {
			others += r
		}
	}
	if sc == "failure-access" {
		all, others = min(all, accessMbit), min(others, accessMbit)
	}
	return all * 1e6 / 8 * payload, others * 1e6 / 8 * payload
}

// FailureBound returns the least extra time a 7 s silence of Paris costs
// in scenario sc's world to a client that, outside the silence, runs at
// the same share of the capacity as without it: the bytes the world could
// not carry while Paris was silent, 7 s x (all - others), at the full
// rate: 7 s x (1 - others/all). It does not depend on that share.
func FailureBound(sc string) float64 {
	all, others := capacities(sc)
	return silence.Seconds() * (1 - others/all)
}
