// Package deploy holds no code: it is the operator's bundle (Prometheus
// scrape config and rules, Grafana dashboard, systemd units, Containerfile,
// Kubernetes manifests) and the test that checks it against the project:
// every metric a query names is exported by mosto, every flag a unit or
// manifest passes exists, the proxy configuration they ship loads. See
// docs/ops.md.
package deploy
