// Package probe is mosto's network performance discovery (seed Sec. IV-B):
// the measurement endpoint every FEP runs (a UDP echo server with a bounded
// rate), two ways to measure the RTT to a peer (a UDP echo round trip and a
// TCP handshake to the peer's hop port), a robust estimator over a window of
// samples, and a Prober that measures the peers the controller assigns and
// reports an RTT only when it changed by more than a threshold.
//
// It does not talk to the controller: reports go to a callback (the agent
// posts them to /v1/reports) and targets come from SetTargets.
package probe
