// Package topo reads network descriptions — RTT-matrix CSV files, Rocketfuel
// latencies.intra maps and Topology Zoo GML graphs — and turns them into an
// RTT matrix between named locations. It also embeds the default real RTT
// datasets (with provenance). It performs no network I/O.
package topo
