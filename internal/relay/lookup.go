package relay

// Stage: remote chain lookups (InP with `lop:`, and the LoP that
// completes the route); see the comment below.

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/metrics"
)

// Remote lookup proxy (seed Sec. III-C: "the InP just forwards the flow to
// the (statically selected) closest LoP, which finally looks up the
// chain"). An InP configured with `lop: ID` holds no table: it sends every
// flow to its LoP with a signed hop header whose route is [InP, LoP] and
// whose LOOKUP TLV names the EgP (the size class rides in SIZE as usual).
// The LoP completes the route from its table, re-signs the header and
// forwards the flow as its first TrP. See docs/proxy.md, "Remote lookup
// proxy".

// Results of mosto_relay_lookup_total.
const (
	lookupAsked       = "asked"           // InP: flow sent to its LoP with a lookup
	lookupUnreachable = "lop_unreachable" // InP: LoP not a member or not reachable; fell back
	lookupFallbackEgP = "fallback_egp"    // InP: fallback flow sent straight to its EgP
	lookupCompleted   = "completed"       // LoP: route completed from its table
	lookupNoChain     = "no_chain"        // LoP: no usable chain, sent straight to the EgP
	lookupSelfEgress  = "self_egress"     // LoP: it is the EgP asked for
)

// Refusal reasons of route completion requests.
const (
	refuseLookupInvalid   = "lookup_invalid"    // a lookup not asked by an InP of its first hop
	refuseLookupNotMember = "lookup_not_member" // the asking InP is not a member
)

// lookupMetrics counts remote lookups (mosto_relay_lookup_total{result}).
type lookupMetrics struct{ c *metrics.CounterVec }

func newLookupMetrics(reg *metrics.Registry) lookupMetrics {
	return lookupMetrics{reg.CounterVec(metrics.Opts{
		Name: "mosto_relay_lookup_total",
		Help: "Remote chain lookups: at an InP (asked, lop_unreachable, fallback_egp) and at its LoP (completed, no_chain, self_egress).",
	}, "result")}
}

func (m lookupMetrics) inc(result string) { m.c.WithLabelValues(result).Inc() }

// openViaLoP is the InP's path when a remote LoP is configured: the flow
// goes to the LoP, which completes the route to egp. When the LoP cannot be
// reached the flow goes straight to the EgP over one hop and, if that fails
// too, to the origin.
func (s *Server) openViaLoP(in Intent, egp string, early []byte) (*net.TCPConn, error) {
	lop := s.cfg.LoP
	h := &hop.Header{
		Source: in.Client,
		Dest:   in.Local,
		Route:  []string{s.self, lop},
		Hop:    1,
		Target: in.Target.String(),
		Size:   in.Size,
		Time:   time.Now(),
		// The EgP (or the LoP as EgP) answers its verdict first.
		Verdict: in.verdict,
	}
	if egp != lop {
		h.Lookup = egp
	}
	rand.Read(h.FlowID[:])
	log := s.log.With("flow", flowString(h.FlowID))
	addr, ok := s.member(lop)
	if ok && s.keyring() != nil {
		up, err := s.dialHop(lop, addr, h, early)
		if err == nil {
			if err := s.awaitVerdict(up, in); err != nil {
				return nil, err
			}
			s.lookups.inc(lookupAsked)
			log.Debug("flow via LoP", "role", roleInP, "lop", lop, "egp", egp, "target", in.Target.String())
			return up, nil
		}
		log.Debug("LoP unreachable", "lop", lop, "err", err)
	}
	s.lookups.inc(lookupUnreachable)
	if addr, ok := s.member(egp); ok && egp != lop && s.keyring() != nil {
		h.Route, h.Lookup, h.Time = []string{s.self, egp}, "", time.Now()
		up, err := s.dialHop(egp, addr, h, early)
		if err == nil {
			if err := s.awaitVerdict(up, in); err != nil {
				return nil, err
			}
			s.lookups.inc(lookupFallbackEgP)
			return up, nil
		}
		log.Debug("EgP unreachable", "egp", egp, "err", err)
	}
	s.m.direct.WithLabelValues("hop_unreachable").Inc()
	return s.dialOriginEarly(in, early)
}

// completeRoute serves a route completion request h (h.Lookup set, checked
// to be addressed to this FEP): the LoP looks the chain up, re-signs the
// header with the whole route and forwards the flow as its first TrP. The
// completed header carries no lookup, so no later hop asks again: a flow
// meets at most one LoP.
func (s *Server) completeRoute(c *net.TCPConn, src netip.AddrPort, h *hop.Header, log *slog.Logger, early []byte) (role, *net.TCPConn) {
	if len(h.Route) != 2 || h.Hop != 1 {
		s.refuse(refuseLookupInvalid, c, src, fmt.Errorf("lookup with route %v hop %d: only an InP asks its first hop", h.Route, h.Hop))
		return "", nil
	}
	inp, egp := h.Route[0], h.Lookup
	if _, ok := s.member(inp); !ok || inp == s.self {
		s.refuse(refuseLookupNotMember, c, src, fmt.Errorf("lookup from %q", inp))
		return "", nil
	}
	if egp == s.self {
		s.lookups.inc(lookupSelfEgress)
		t, err := ParseTarget(h.Target)
		if err != nil {
			s.refuse(refusePolicy, c, src, err)
			return "", nil
		}
		return roleEgP, s.exit(c, roleEgP, t, h, log, early)
	}
	if _, ok := s.member(egp); !ok {
		s.refuse(refuseNotMember, c, src, fmt.Errorf("lookup of EgP %q", egp))
		return "", nil
	}
	route, result := s.completion(inp, egp, h.Size)
	s.lookups.inc(result)
	next := route[2]
	addr, _ := s.member(next)
	fwd := *h
	fwd.Route, fwd.Hop, fwd.Lookup, fwd.Time = route, 2, "", time.Now()
	log.Debug("route completed", "inp", inp, "egp", egp, "route", route, "result", result)
	return roleTrP, s.forward(c, roleTrP, next, addr, &fwd, log, early)
}

// completion returns the route [inp, self, ..., egp] for a flow of size
// bytes: from the table's chain inp -> egp (the controller's per-LoP tables
// hold the chains of the InPs a LoP serves), else from the chain self ->
// egp (a table made for this FEP), else [inp, self, egp]. A chain is used
// only if the completed route has no repeated id, at most hop.MaxRoute ids
// and a member as the hop after this FEP.
func (s *Server) completion(inp, egp string, size int64) ([]string, string) {
	if cb := s.overlay.chains.Load(); cb != nil {
		if e, ok := cb.src.Lookup(inp, egp, size); ok && len(e.Path) >= 2 && e.Path[0] == inp && e.Path[len(e.Path)-1] == egp {
			var r []string
			if k := slices.Index(e.Path, s.self); k > 0 {
				// The static InP -> LoP segment replaces the chain's first part.
				r = append([]string{inp}, e.Path[k:]...)
			} else {
				r = append([]string{inp, s.self}, e.Path[1:]...)
			}
			if s.usableCompletion(r) {
				return r, lookupCompleted
			}
		}
		if e, ok := cb.src.Lookup(s.self, egp, size); ok && len(e.Path) >= 2 && e.Path[0] == s.self && e.Path[len(e.Path)-1] == egp {
			if r := append([]string{inp}, e.Path...); s.usableCompletion(r) {
				return r, lookupCompleted
			}
		}
	}
	return []string{inp, s.self, egp}, lookupNoChain
}

// usableCompletion reports whether r = [inp, self, next, ..., egp] is a
// loop-free route this FEP can forward.
func (s *Server) usableCompletion(r []string) bool {
	if len(r) < 3 || len(r) > hop.MaxRoute || r[1] != s.self {
		return false
	}
	seen := make(map[string]bool, len(r))
	for _, id := range r {
		if seen[id] {
			return false
		}
		seen[id] = true
	}
	_, ok := s.member(r[2])
	return ok
}
