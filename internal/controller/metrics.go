package controller

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	computations   prometheus.Counter
	computeSeconds prometheus.Gauge
	tablesWritten  prometheus.Counter
	reports        prometheus.Counter
	samples        prometheus.Counter
	leader         prometheus.Gauge
	version        prometheus.Gauge
	feps           prometheus.Gauge
	fepReport      *prometheus.GaugeVec
	keysRotated    prometheus.Gauge
	revocations    prometheus.Counter
	// refused counts what the controller refused, by reason (revoked_cert,
	// unassigned_target, faster_than_light, rate_limited, unknown_peer).
	refused *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		computations:   prometheus.NewCounter(prometheus.CounterOpts{Name: "mosto_controller_computations_total", Help: "Table computations run by this controller as leader."}),
		computeSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mosto_controller_compute_seconds", Help: "Duration of the last computation (matrix, chains, tables, store)."}),
		tablesWritten:  prometheus.NewCounter(prometheus.CounterOpts{Name: "mosto_controller_tables_written_total", Help: "LoP tables written with a new version."}),
		reports:        prometheus.NewCounter(prometheus.CounterOpts{Name: "mosto_controller_reports_total", Help: "RTT reports accepted."}),
		samples:        prometheus.NewCounter(prometheus.CounterOpts{Name: "mosto_controller_samples_total", Help: "RTT samples stored."}),
		leader:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "mosto_controller_leader", Help: "1 while this controller is the leader."}),
		version:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "mosto_controller_table_version", Help: "Highest table version served."}),
		feps:           prometheus.NewGauge(prometheus.GaugeOpts{Name: "mosto_controller_feps", Help: "Registered FEPs."}),
		fepReport: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mosto_controller_fep_last_report_timestamp_seconds",
			Help: "Unix time of the last report (RTTs or counters) a FEP sent to this controller."}, []string{"fep"}),
		keysRotated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mosto_controller_keys_rotated_timestamp_seconds",
			Help: "Unix time the current hop key was made (set by the leader)."}),
		revocations: prometheus.NewCounter(prometheus.CounterOpts{Name: "mosto_controller_cert_revocations_total", Help: "FEP certificates revoked (deleted or re-joined FEPs)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mosto_controller_refused_total",
			Help: "Requests or samples refused, by reason (revoked_cert, unassigned_target, faster_than_light, rate_limited, unknown_peer)."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.computations, m.computeSeconds, m.tablesWritten, m.reports, m.samples, m.leader, m.version, m.feps, m.fepReport, m.keysRotated, m.revocations, m.refused)
	}
	return m
}
