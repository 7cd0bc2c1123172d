package relay

import (
	"net/http"
	"sync"

	"github.com/mosto-net/mosto/internal/metrics"
)

// role is the part a daemon plays for a flow; its value is the metrics
// label.
type role string

// Roles a daemon plays for a flow.
const (
	roleInP role = "inp"
	roleTrP role = "trp"
	roleEgP role = "egp"
)

// outcome is how a flow ended; its value is the metrics label.
type outcome string

// Flow outcomes.
const (
	outcomeOK        outcome = "ok"         // both directions ended with EOF
	outcomeReset     outcome = "reset"      // an error or reset on either side
	outcomeIdle      outcome = "idle"       // idle timeout
	outcomeOffloaded outcome = "offloaded"  // joined in the kernel (offload.go)
	outcomeAborted   outcome = "aborted"    // closed by shutdown after the drain timeout
	outcomeDialError outcome = "dial_error" // next hop or origin unreachable
	outcomeEntry     outcome = "entry_error"
)

// Refusal reasons.
const (
	refuseAuth          = "auth"
	refuseReplay        = "replay"
	refuseMalformed     = "malformed"
	refuseTooLarge      = "too_large"
	refuseExpired       = "expired"
	refuseHeaderTimeout = "header_timeout"
	refuseNotSelf       = "not_self"
	refuseNotMember     = "not_member"
	refusePolicy        = "policy"
	refuseLimitGlobal   = "limit_global"
	refuseLimitSource   = "limit_source"
	refuseEntryAuth     = "entry_auth"
	refuseEntryAllow    = "entry_allowlist"
	refuseEntryProto    = "entry_protocol"
	refuseDraining      = "draining"
)

// relayMetrics is the daemon's private Prometheus registry and its metrics.
type relayMetrics struct {
	reg      *metrics.Registry
	flows    *metrics.CounterVec
	bytes    *metrics.CounterVec
	active   *metrics.GaugeVec
	refusals *metrics.CounterVec
	direct   *metrics.CounterVec
	connect  *metrics.HistogramVec
	pool     *metrics.CounterVec
	upstream *metrics.CounterVec
	// sizeHints counts the InP's chain lookups by where the size hint
	// came from (sizelearn.go), children resolved once.
	sizeHints map[hintSource]*metrics.Counter

	// Children of the per-role vectors, resolved once so the flow path
	// neither hashes labels nor grows its goroutine stacks doing so.
	roles map[role]*roleMetrics
	// Children resolved on first use, by peer and by direct reason.
	peers   sync.Map // string -> *peerMetrics
	directs sync.Map // string -> *metrics.Counter
}

type roleMetrics struct {
	active   *metrics.Gauge
	up, down *metrics.Counter
	flows    *metrics.CounterVec
	role     role
	outcomes sync.Map // outcome -> *metrics.Counter
}

// flow returns the flows counter of this role for outcome.
func (r *roleMetrics) flow(o outcome) *metrics.Counter {
	if c, ok := r.outcomes.Load(o); ok {
		return c.(*metrics.Counter)
	}
	c, _ := r.outcomes.LoadOrStore(o, r.flows.WithLabelValues(string(r.role), string(o)))
	return c.(*metrics.Counter)
}

// peerMetrics are the per-next-hop children of a peer (a FEP id, or origin).
type peerMetrics struct {
	connect *metrics.Histogram
	dial    *metrics.Counter
}

func (m *relayMetrics) peer(p string) *peerMetrics {
	if pm, ok := m.peers.Load(p); ok {
		return pm.(*peerMetrics)
	}
	pm, _ := m.peers.LoadOrStore(p, &peerMetrics{
		connect: m.connect.WithLabelValues(p),
		dial:    m.upstream.WithLabelValues(p, "dial"),
	})
	return pm.(*peerMetrics)
}

// directFor returns the direct-flows counter for reason.
func (m *relayMetrics) directFor(reason string) *metrics.Counter {
	if c, ok := m.directs.Load(reason); ok {
		return c.(*metrics.Counter)
	}
	c, _ := m.directs.LoadOrStore(reason, m.direct.WithLabelValues(reason))
	return c.(*metrics.Counter)
}

func newMetrics() *relayMetrics {
	reg := metrics.NewRegistry()
	m := &relayMetrics{
		reg: reg,
		flows: reg.CounterVec(metrics.Opts{
			Name: "mosto_relay_flows_total",
			Help: "Flows ended, by role of this proxy (inp, trp, egp) and outcome.",
		}, "role", "outcome"),
		bytes: reg.CounterVec(metrics.Opts{
			Name: "mosto_relay_bytes_total",
			Help: "Bytes relayed, by role and direction (up: client to origin, down: origin to client).",
		}, "role", "direction"),
		active: reg.GaugeVec(metrics.Opts{
			Name: "mosto_relay_active_flows",
			Help: "Flows in progress, by role.",
		}, "role"),
		refusals: reg.CounterVec(metrics.Opts{
			Name: "mosto_relay_refusals_total",
			Help: "Connections refused, by reason.",
		}, "reason"),
		direct: reg.CounterVec(metrics.Opts{
			Name: "mosto_relay_direct_total",
			Help: "Flows the InP sent straight to the origin, by reason (self_egress, no_chain, bad_chain).",
		}, "reason"),
		connect: reg.HistogramVec(metrics.Opts{
			Name: "mosto_relay_connect_seconds",
			Help: "Time to connect to the next hop, by peer (a FEP id, or origin).",
		}, metrics.ExponentialBuckets(0.0001, 2.5, 14), "peer"),
		pool: reg.CounterVec(metrics.Opts{
			Name: "mosto_relay_pool_total",
			Help: "Pooled connections asked for, by pool (hop, origin) and result (hit, miss, stale).",
		}, "pool", "result"),
		upstream: reg.CounterVec(metrics.Opts{
			Name: "mosto_relay_upstream_total",
			Help: "Flows sent on to the next hop, by peer (a FEP id, or origin) and how the connection was had (dial, pool).",
		}, "peer", "via"),
	}
	hints := reg.CounterVec(metrics.Opts{
		Name: "mosto_relay_size_hints_total",
		Help: "Flows the InP opened, by where their size hint came from (learned_path: the destination's HTTP path prefix, learned: the service or destination, static: the listener's size).",
	}, "hint")
	m.sizeHints = make(map[hintSource]*metrics.Counter, 3)
	for _, h := range []hintSource{hintPath, hintLearned, hintStatic} {
		m.sizeHints[h] = hints.WithLabelValues(string(h))
	}
	reg.RegisterRuntime()
	m.roles = make(map[role]*roleMetrics, 3)
	for _, r := range []role{roleInP, roleTrP, roleEgP} {
		m.roles[r] = &roleMetrics{
			active: m.active.WithLabelValues(string(r)),
			up:     m.bytes.WithLabelValues(string(r), "up"),
			down:   m.bytes.WithLabelValues(string(r), "down"),
			flows:  m.flows,
			role:   r,
		}
	}
	return m
}

func (m *relayMetrics) handler() http.Handler {
	return metrics.Handler(m.reg)
}

// Registry returns the daemon's private metrics registry.
func (s *Server) Registry() *metrics.Registry { return s.m.reg }
