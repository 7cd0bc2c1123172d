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
	}
	if reg != nil {
		reg.MustRegister(m.computations, m.computeSeconds, m.tablesWritten, m.reports, m.samples, m.leader, m.version, m.feps)
	}
	return m
}
