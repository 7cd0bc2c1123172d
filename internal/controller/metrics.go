package controller

import "github.com/mosto-net/mosto/internal/metrics"

type controllerMetrics struct {
	computations   *metrics.Counter
	computeSeconds *metrics.Gauge
	tablesWritten  *metrics.Counter
	reports        *metrics.Counter
	samples        *metrics.Counter
	leader         *metrics.Gauge
	version        *metrics.Gauge
	feps           *metrics.Gauge
	fepReport      *metrics.GaugeVec
	keysRotated    *metrics.Gauge
	revocations    *metrics.Counter
	drainTimeouts  *metrics.Counter
	// refused counts what the controller refused, by reason (revoked_cert,
	// unassigned_target, faster_than_light, rate_limited, unknown_peer).
	refused *metrics.CounterVec
}

// newMetrics registers the controller's metrics with reg (nil: a private
// registry nobody gathers).
func newMetrics(reg *metrics.Registry) *controllerMetrics {
	if reg == nil {
		reg = metrics.NewRegistry()
	}
	return &controllerMetrics{
		computations:   reg.Counter(metrics.Opts{Name: "mosto_controller_computations_total", Help: "Table computations run by this controller as leader."}),
		computeSeconds: reg.Gauge(metrics.Opts{Name: "mosto_controller_compute_seconds", Help: "Duration of the last computation (matrix, chains, tables, store)."}),
		tablesWritten:  reg.Counter(metrics.Opts{Name: "mosto_controller_tables_written_total", Help: "LoP tables written with a new version."}),
		reports:        reg.Counter(metrics.Opts{Name: "mosto_controller_reports_total", Help: "RTT reports accepted."}),
		samples:        reg.Counter(metrics.Opts{Name: "mosto_controller_samples_total", Help: "RTT samples stored."}),
		leader:         reg.Gauge(metrics.Opts{Name: "mosto_controller_leader", Help: "1 while this controller is the leader."}),
		version:        reg.Gauge(metrics.Opts{Name: "mosto_controller_table_version", Help: "Highest table version served."}),
		feps:           reg.Gauge(metrics.Opts{Name: "mosto_controller_feps", Help: "Registered FEPs."}),
		fepReport: reg.GaugeVec(metrics.Opts{Name: "mosto_controller_fep_last_report_timestamp_seconds",
			Help: "Unix time of the last report (RTTs or counters) a FEP sent to this controller."}, "fep"),
		keysRotated: reg.Gauge(metrics.Opts{Name: "mosto_controller_keys_rotated_timestamp_seconds",
			Help: "Unix time the current hop key was made (set by the leader)."}),
		revocations: reg.Counter(metrics.Opts{Name: "mosto_controller_cert_revocations_total", Help: "FEP certificates revoked (deleted or re-joined FEPs)."}),
		drainTimeouts: reg.Counter(metrics.Opts{Name: "mosto_controller_drain_timeouts_total",
			Help: "FEP deletions whose drain (every LoP holding tables without the FEP) timed out: deleted anyway."}),
		refused: reg.CounterVec(metrics.Opts{Name: "mosto_controller_refused_total",
			Help: "Requests or samples refused, by reason (revoked_cert, unassigned_target, faster_than_light, rate_limited, unknown_peer)."}, "reason"),
	}
}
