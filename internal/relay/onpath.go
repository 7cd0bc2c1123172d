package relay

// Entry: transparent interception managed by the controller (docs/tts.md,
// "Which relays intercept"). The controller decides which on-path relays
// intercept which path's flows (SetOnPath) and learns each leg's RTT and
// loss from what the relays saw on the flows they intercepted
// (TakeLegStats, from each leg socket's TCP_INFO at the end of the flow).

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/intercept"
)

// OnPathScope is the controller's decision for this relay on one path.
type OnPathScope struct {
	Path   string
	Active bool
	// The path's flows: client prefixes, server prefixes, server ports.
	Sources, Dests []string
	Ports          string
	// Prev and Next are the nearest active relays towards the client and
	// the server ("" = the path's end).
	Prev, Next string
}

// LegStats are the figures of one leg of a path summed over the flows
// this relay intercepted since the last TakeLegStats.
type LegStats struct {
	Path, From, To string // From/To: relay ids, "" = the path's end
	Flows          int
	SumMinRTT      time.Duration // sum over the flows of the socket's min RTT
	SegsOut        uint64        // data segments sent on the leg
	Retrans        uint64        // of which retransmitted
}

// onPathState is the managed interception of a tproxy entry.
type onPathState struct {
	mu      sync.Mutex
	in      *intercept.Interception // nil until Run installed the rules
	managed bool                    // the controller decided (scopes below), else the static scope
	scopes  []onPathMatch
	legs    map[[3]string]*LegStats
}

// onPathMatch is one active path of this relay, parsed.
type onPathMatch struct {
	OnPathScope
	scope intercept.Scope
}

func (m *onPathMatch) matches(src, dst netip.AddrPort) bool {
	in := func(ps []netip.Prefix, a netip.Addr) bool {
		if len(ps) == 0 {
			return true
		}
		for _, p := range ps {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	if !in(m.scope.Sources, src.Addr().Unmap()) || !in(m.scope.Dests, dst.Addr().Unmap()) {
		return false
	}
	if len(m.scope.Ports) == 0 {
		return true
	}
	for _, r := range m.scope.Ports {
		if dst.Port() >= r.Lo && dst.Port() <= r.Hi {
			return true
		}
	}
	return false
}

// SetOnPath applies the controller's decisions for this relay: the
// transparent entry intercepts the flows of the active paths only (an
// empty list: back to the config's own scope). The rules are replaced in
// one transaction; flows already intercepted go on. Before Run the
// decision is kept and applied when the rules are installed.
func (s *Server) SetOnPath(scopes []OnPathScope) error {
	if s.cfg.TProxy == nil {
		if len(scopes) > 0 {
			return fmt.Errorf("relay: on-path decisions for %s, which has no tproxy entry", s.self)
		}
		return nil
	}
	var ms []onPathMatch
	for _, sc := range scopes {
		m := onPathMatch{OnPathScope: sc}
		var err error
		if m.scope.Sources, err = intercept.ParsePrefixes(sc.Sources); err != nil {
			return fmt.Errorf("relay: path %s: %w", sc.Path, err)
		}
		if m.scope.Dests, err = intercept.ParsePrefixes(sc.Dests); err != nil {
			return fmt.Errorf("relay: path %s: %w", sc.Path, err)
		}
		if sc.Ports != "" {
			if m.scope.Ports, err = intercept.ParsePorts(sc.Ports); err != nil {
				return fmt.Errorf("relay: path %s: %w", sc.Path, err)
			}
		}
		ms = append(ms, m)
	}
	st := &s.onpath
	st.mu.Lock()
	defer st.mu.Unlock()
	managed := len(ms) > 0
	if managed == st.managed && slices.EqualFunc(ms, st.scopes, func(a, b onPathMatch) bool {
		return a.Path == b.Path && a.Active == b.Active && a.Prev == b.Prev && a.Next == b.Next &&
			slices.Equal(a.Sources, b.Sources) && slices.Equal(a.Dests, b.Dests) && a.Ports == b.Ports
	}) {
		return nil
	}
	if st.in != nil {
		if err := st.apply(managed, ms); err != nil {
			return err
		}
	}
	st.managed, st.scopes = managed, ms
	s.log.Info("on-path decision", "paths", len(ms), "active", activePaths(ms))
	return nil
}

func activePaths(ms []onPathMatch) []string {
	var out []string
	for _, m := range ms {
		if m.Active {
			out = append(out, m.Path)
		}
	}
	return out
}

// apply installs the scopes (st.mu held, st.in set).
func (st *onPathState) apply(managed bool, ms []onPathMatch) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !managed {
		c := st.in.Config()
		return st.in.SetScopes(ctx, []intercept.Scope{{Sources: c.Sources, Dests: c.Dests, Ports: c.Ports}})
	}
	var scs []intercept.Scope
	for _, m := range ms {
		if m.Active {
			scs = append(scs, m.scope)
		}
	}
	return st.in.SetScopes(ctx, scs)
}

// installed records the installed rules and applies a decision that came
// before them.
func (s *Server) onPathInstalled(in *intercept.Interception) error {
	st := &s.onpath
	st.mu.Lock()
	defer st.mu.Unlock()
	st.in = in
	if st.managed {
		return st.apply(true, st.scopes)
	}
	return nil
}

// onPathFlow returns the active path an intercepted flow belongs to, or
// nil.
func (s *Server) onPathFlow(client, dst netip.AddrPort) *onPathMatch {
	st := &s.onpath
	st.mu.Lock()
	defer st.mu.Unlock()
	for i := range st.scopes {
		if m := &st.scopes[i]; m.Active && m.matches(client, dst) {
			c := *m
			return &c
		}
	}
	return nil
}

// legInfo reads a leg socket's TCP_INFO.
func legInfo(c *net.TCPConn) (*unix.TCPInfo, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	var ti *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) { ti, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || ierr != nil {
		return nil, false
	}
	return ti, true
}

// noteLegs adds an intercepted flow's two legs to the path's figures
// (called after the copy, before the connections close).
func (s *Server) noteLegs(m *onPathMatch, down, up *net.TCPConn) {
	add := func(from, to string, c *net.TCPConn) {
		ti, ok := legInfo(c)
		if !ok || ti.Min_rtt == 0 {
			return
		}
		st := &s.onpath
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.legs == nil {
			st.legs = map[[3]string]*LegStats{}
		}
		k := [3]string{m.Path, from, to}
		l := st.legs[k]
		if l == nil {
			l = &LegStats{Path: m.Path, From: from, To: to}
			st.legs[k] = l
		}
		l.Flows++
		l.SumMinRTT += time.Duration(ti.Min_rtt) * time.Microsecond
		l.SegsOut += uint64(ti.Data_segs_out)
		l.Retrans += uint64(min(ti.Total_retrans, ti.Data_segs_out))
	}
	add(m.Prev, s.self, down)
	add(s.self, m.Next, up)
}

// TakeLegStats returns the legs' figures gathered since the last call
// and starts again from zero.
func (s *Server) TakeLegStats() []LegStats {
	st := &s.onpath
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]LegStats, 0, len(st.legs))
	for _, l := range st.legs {
		out = append(out, *l)
	}
	st.legs = nil
	slices.SortFunc(out, func(a, b LegStats) int {
		if a.Path != b.Path {
			return cmpStr(a.Path, b.Path)
		}
		if a.From != b.From {
			return cmpStr(a.From, b.From)
		}
		return cmpStr(a.To, b.To)
	})
	return out
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
