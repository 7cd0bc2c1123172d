package relay

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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

// metrics is the daemon's private Prometheus registry and its collectors.
type metrics struct {
	reg      *prometheus.Registry
	flows    *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	active   *prometheus.GaugeVec
	refusals *prometheus.CounterVec
	direct   *prometheus.CounterVec
	connect  *prometheus.HistogramVec
	pool     *prometheus.CounterVec
	upstream *prometheus.CounterVec

	// Children of the per-role vectors, resolved once so the flow path
	// neither hashes labels nor grows its goroutine stacks doing so.
	roles map[role]*roleMetrics
	// Children resolved on first use, by peer and by direct reason.
	peers   sync.Map // string -> *peerMetrics
	directs sync.Map // string -> prometheus.Counter
}

type roleMetrics struct {
	active   prometheus.Gauge
	up, down prometheus.Counter
	flows    *prometheus.CounterVec
	role     role
	outcomes sync.Map // outcome -> prometheus.Counter
}

// flow returns the flows counter of this role for outcome.
func (r *roleMetrics) flow(o outcome) prometheus.Counter {
	if c, ok := r.outcomes.Load(o); ok {
		return c.(prometheus.Counter)
	}
	c, _ := r.outcomes.LoadOrStore(o, r.flows.WithLabelValues(string(r.role), string(o)))
	return c.(prometheus.Counter)
}

// peerMetrics are the per-next-hop children of a peer (a FEP id, or origin).
type peerMetrics struct {
	connect prometheus.Observer
	dial    prometheus.Counter
}

func (m *metrics) peer(p string) *peerMetrics {
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
func (m *metrics) directFor(reason string) prometheus.Counter {
	if c, ok := m.directs.Load(reason); ok {
		return c.(prometheus.Counter)
	}
	c, _ := m.directs.LoadOrStore(reason, m.direct.WithLabelValues(reason))
	return c.(prometheus.Counter)
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		flows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mosto_relay_flows_total",
			Help: "Flows ended, by role of this proxy (inp, trp, egp) and outcome.",
		}, []string{"role", "outcome"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mosto_relay_bytes_total",
			Help: "Bytes relayed, by role and direction (up: client to origin, down: origin to client).",
		}, []string{"role", "direction"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mosto_relay_active_flows",
			Help: "Flows in progress, by role.",
		}, []string{"role"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mosto_relay_refusals_total",
			Help: "Connections refused, by reason.",
		}, []string{"reason"}),
		direct: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mosto_relay_direct_total",
			Help: "Flows the InP sent straight to the origin, by reason (self_egress, no_chain, bad_chain).",
		}, []string{"reason"}),
		connect: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mosto_relay_connect_seconds",
			Help:    "Time to connect to the next hop, by peer (a FEP id, or origin).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}, []string{"peer"}),
		pool: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mosto_relay_pool_total",
			Help: "Pooled connections asked for, by pool (hop, origin) and result (hit, miss, stale).",
		}, []string{"pool", "result"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mosto_relay_upstream_total",
			Help: "Flows sent on to the next hop, by peer (a FEP id, or origin) and how the connection was had (dial, pool).",
		}, []string{"peer", "via"}),
	}
	m.reg.MustRegister(m.flows, m.bytes, m.active, m.refusals, m.direct, m.connect, m.pool, m.upstream,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry returns the daemon's private Prometheus registry.
func (s *Server) Registry() *prometheus.Registry { return s.m.reg }
