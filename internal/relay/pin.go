package relay

// Stage: InP entries, chain pinning. A client of the HTTP CONNECT entry
// may name the chain of its flow in a Mosto-Route header (the FEP ids of a
// chain from the controller's GET /v1/paths, this FEP first), so that a
// multi-path download (`mosto get --paths`) puts each sub-flow on its own
// chain. The pin adds no new trust: the entry authenticates the client and
// checks the target as for any flow; the route may only name members of
// the overlay, starts here and has no loop; the hops carry the same signed
// header as any chain, and the last member (the EgP) checks its
// destination policy before it connects to the target.

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
)

// RouteHeader is the CONNECT request header that pins a flow's chain:
// comma-separated FEP ids, this FEP first, the EgP last.
const RouteHeader = "Mosto-Route"

// errRoute marks a pinned route this FEP refuses.
var errRoute = errors.New("bad pinned route")

// openPinned connects the upstream side of a flow over its pinned route
// (checked by pinnedRoute): to the route's second member, or straight to
// the target when the route is this FEP alone. Unlike a looked-up chain, a
// pinned route whose first hop is down fails: the client chose the path.
func (s *Server) openPinned(in Intent, early []byte) (*net.TCPConn, error) {
	if len(in.Route) == 1 {
		s.m.directFor("pinned").Inc()
		return s.dialOriginEarly(in, early)
	}
	next := in.Route[1]
	addr, ok := s.member(next)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a member", errRoute, next)
	}
	h := &hop.Header{
		Source: in.Client,
		Dest:   in.Local,
		Route:  in.Route,
		Hop:    1,
		Target: in.Target.String(),
		Size:   in.Size,
		Time:   time.Now(),
		// The CONNECT entry replies with the EgP's verdict.
		Verdict: in.verdict,
	}
	rand.Read(h.FlowID[:])
	up, err := s.dialHop(next, addr, h, early)
	if err != nil {
		return nil, err
	}
	if err := s.awaitVerdict(up, in); err != nil {
		return nil, err
	}
	return up, nil
}

// pinnedRoute parses and checks a RouteHeader value.
func (s *Server) pinnedRoute(v string) ([]string, error) {
	var route []string
	seen := map[string]bool{}
	for _, id := range strings.Split(v, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			return nil, fmt.Errorf("%w: an empty FEP id", errRoute)
		}
		if seen[id] {
			return nil, fmt.Errorf("%w: %s appears twice", errRoute, id)
		}
		seen[id] = true
		route = append(route, id)
	}
	switch {
	case len(route) > hop.MaxRoute:
		return nil, fmt.Errorf("%w: %d FEPs, at most %d", errRoute, len(route), hop.MaxRoute)
	case route[0] != s.self:
		return nil, fmt.Errorf("%w: starts at %s, not at this FEP (%s)", errRoute, route[0], s.self)
	}
	for _, id := range route[1:] {
		if _, ok := s.member(id); !ok {
			return nil, fmt.Errorf("%w: %s is not a member", errRoute, id)
		}
	}
	if len(route) > 1 && s.keyring() == nil {
		return nil, fmt.Errorf("%w: no overlay key yet", errRoute)
	}
	return route, nil
}
