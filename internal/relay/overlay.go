package relay

// Stage: overlay state. The members, keys and chains a daemon routes by,
// which the controller agent replaces at run time.

import (
	"net/netip"
	"sync/atomic"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
)

// ChainSource answers chain lookups; *pathcomp.Index satisfies it. The
// controller replaces it at run time with SetChains.
type ChainSource interface {
	Lookup(from, to string, size int64) (pathcomp.ChainEntry, bool)
}

// MemberSource answers the current member list (FEP id -> hop address);
// the controller agent satisfies it. The map must not be modified.
type MemberSource interface {
	Members() map[string]string
}

// MemberPolicySource is a MemberSource that also answers the overlay's
// member policy (the controller's, in its table; destinations.allow
// syntax): member dials must match it unless hop.member_allow is set. The
// controller agent satisfies it. The slice must not be modified.
type MemberPolicySource interface {
	MemberPolicy() []string
}

// KeySource answers the current overlay keyring (nil: keep the configured
// one); the controller agent satisfies it.
type KeySource interface {
	Keys() *hop.Keyring
}

// overlayState is what the overlay looks like from here; the controller
// agent replaces its sources at run time.
type overlayState struct {
	kr      *hop.Keyring // configured keys; nil: no overlay (direct only)
	replay  *hop.ReplayCache
	members atomic.Pointer[memberBox]
	chains  atomic.Pointer[chainBox]
	keys    atomic.Pointer[keyBox]
	// memberPol is the parsed member policy of the member source (the
	// last one seen).
	memberPol atomic.Pointer[parsedPolicy]
}

// parsedPolicy is a member policy as received and parsed.
type parsedPolicy struct {
	list []string
	p    *policy
	err  error
}

type chainBox struct{ src ChainSource }

type memberBox struct{ src MemberSource }

type keyBox struct{ src KeySource }

// staticMembers is a fixed member list.
type staticMembers map[string]string

func (m staticMembers) Members() map[string]string { return m }

// SetMembers replaces the member list (FEP id -> hop address) atomically
// with a copy of members.
func (s *Server) SetMembers(members map[string]string) {
	m := make(staticMembers, len(members))
	for k, v := range members {
		m[k] = v
	}
	s.overlay.members.Store(&memberBox{m})
	if s.out.hopPool != nil {
		s.out.hopPool.refill()
	}
}

// SetMemberSource makes ms the member list, asked on every hop decision.
func (s *Server) SetMemberSource(ms MemberSource) {
	if ms == nil {
		ms = staticMembers{}
	}
	s.overlay.members.Store(&memberBox{ms})
	if s.out.hopPool != nil {
		s.out.hopPool.refill()
	}
}

// SetKeySource makes ks supply the overlay keyring; while it returns nil
// (or with no source) the configured keys are used.
func (s *Server) SetKeySource(ks KeySource) {
	if ks == nil {
		s.overlay.keys.Store(nil)
		return
	}
	s.overlay.keys.Store(&keyBox{ks})
}

// keyring returns the keyring in force, or nil when there is none.
func (s *Server) keyring() *hop.Keyring {
	if kb := s.overlay.keys.Load(); kb != nil {
		if kr := kb.src.Keys(); kr != nil {
			return kr
		}
	}
	return s.overlay.kr
}

// SetChains replaces the chain source atomically; nil means no chains.
func (s *Server) SetChains(cs ChainSource) {
	if cs == nil {
		s.overlay.chains.Store(nil)
		return
	}
	s.overlay.chains.Store(&chainBox{cs})
}

// memberAddrs returns the hop addresses of the other members (the hop
// pool's targets).
func (s *Server) memberAddrs() []string {
	ms := s.overlay.members.Load().src.Members()
	out := make([]string, 0, len(ms))
	for id, a := range ms {
		if id != s.self {
			out = append(out, a)
		}
	}
	return out
}

// isMemberIP reports whether ip is the host of a member's hop address
// (given as an IP literal; host names never match).
func (s *Server) isMemberIP(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, a := range s.overlay.members.Load().src.Members() {
		ap, err := netip.ParseAddrPort(a)
		if err == nil && ap.Addr().Unmap() == ip {
			return true
		}
	}
	return false
}

func (s *Server) member(id string) (string, bool) {
	a, ok := s.overlay.members.Load().src.Members()[id]
	return a, ok
}
