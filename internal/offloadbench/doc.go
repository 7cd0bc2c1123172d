// Package offloadbench is `mosto bench offload`: what leaving the data path
// after slow start (internal/xlate) costs and saves. Fig3 traces the
// goodput of one long flow through a relay that is offloaded mid-flow, in
// the emulator (seed 000, Fig. 3), with and without mitigation; Veth
// compares direct TCP, a splice relay, an offloaded relay and HAProxy on a
// veth path (throughput and CPU per GB), through one relay or a chain of
// relays that each offload their own flow.
package offloadbench
