// Package metrics is mosto's own Prometheus instrumentation: counters,
// gauges, histograms, their label vectors, function-backed values, the Go
// runtime and process series, and the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// It replaces github.com/prometheus/client_golang in the binary. That
// library, with procfs, client_model (protobuf) and runtime/metrics, took
// about 1.8 ms of package initialisation at every process start, which a
// socket-activated proxy pays on its first connection. This package has no
// package-level state and no init work: everything is built when a
// Registry is made.
//
// Names, labels, types and HELP texts of the exposed series are the ones the
// client library exposed (the Grafana dashboards and alerts of deploy/
// depend on them; the Go and process series keep client_golang's names).
// Values are updated lock-free (atomics); a label vector takes a read lock
// to find an existing child. Registration errors (bad or duplicate names,
// wrong label count) are programming errors and panic, as MustRegister did.
//
// It owns no listener: Handler serves a Registry over HTTP and the caller
// mounts it.
package metrics
