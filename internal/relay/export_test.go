package relay

import (
	"github.com/mosto-net/mosto/internal/evloop"
)

// This file exports internals to relay's overlay tests, which live in
// package relay_test so that they can build their overlay with relaytest
// (relaytest imports relay: package relay's own tests cannot import it).
// It is compiled only into relay's tests.

// Labels of the flow, refusal and pool counters.
const (
	MaxIdleWorkers      = maxIdleWorkers
	OutcomeAborted      = outcomeAborted
	OutcomeIdle         = outcomeIdle
	OutcomeDialError    = outcomeDialError
	OutcomeOK           = outcomeOK
	OutcomeReset        = outcomeReset
	PoolHit             = poolHit
	PoolMiss            = poolMiss
	PoolStale           = poolStale
	PoolUnsupported     = poolUnsupported
	RefuseAuth          = refuseAuth
	RefuseEntryAllow    = refuseEntryAllow
	RefuseEntryAuth     = refuseEntryAuth
	RefuseEntryProto    = refuseEntryProto
	RefuseExpired       = refuseExpired
	RefuseHeaderTimeout = refuseHeaderTimeout
	RefuseLimitGlobal   = refuseLimitGlobal
	RefuseLimitSource   = refuseLimitSource
	RefuseMalformed     = refuseMalformed
	RefuseNotMember     = refuseNotMember
	RefuseNotSelf       = refuseNotSelf
	RefusePolicy        = refusePolicy
	RefuseReplay        = refuseReplay
	RefuseTooLarge      = refuseTooLarge
	RoleEgP             = roleEgP
	RoleInP             = roleInP
	RoleTrP             = roleTrP
	SmallCopy           = smallCopy
)

type (
	FakeResolver = fakeResolver
	Role         = role
)

// Test helpers shared with package relay_test.
var (
	BulkEcho       = bulkEcho
	CounterValue   = counterValue
	DialPing       = dialPing
	Flows          = flows
	FreePorts      = freePorts
	HashTrip       = hashTrip
	IsReset        = isReset
	IsTimeout      = isTimeout
	PoolCount      = poolCount
	Refusals       = refusals
	SizeHints      = sizeHints
	WritePoolHello = writePoolHello
	MetricSum      = testutilSum
	DirectCount    = testutilDirect
)

// ID is the daemon's FEP id.
func (s *Server) ID() string { return s.self }

// Loops are the daemon's event loops (nil until they run, or without).
func (s *Server) Loops() *evloop.Loops { return s.loops.Load() }

// ActiveConns is the number of connections the entry limits hold.
func (s *Server) ActiveConns() int { return s.accept.limits.total() }

// IdleWorkers is the number of idle handshake workers.
func (s *Server) IdleWorkers() int32 { return s.workers.idle.Load() }

// ActiveFlows is the active-flows gauge of role r.
func (s *Server) ActiveFlows(r Role) float64 {
	return s.m.roles[r].active.Value()
}

// Upstream is the number of flows sent to peer on a connection that came
// from how ("pool" or "dial").
func (s *Server) Upstream(peer, how string) float64 {
	return counterValue(s.m.upstream.WithLabelValues(peer, how))
}

// HopPoolIdle and OriginPoolIdle are the idle pooled connections to addr.
func (s *Server) HopPoolIdle(addr string) int    { return s.out.hopPool.idleCount(addr) }
func (s *Server) OriginPoolIdle(addr string) int { return s.out.originPool.idleCount(addr) }

// HopPoolTargets are the members pooled up front.
func (s *Server) HopPoolTargets() []string { return s.hopPoolTargets() }

// SetResolver replaces the resolver of host-name targets (before Run).
func (s *Server) SetResolver(r resolver) { s.origin.res = r }
