// Package proxybench measures TCP relays side by side on loopback: direct
// (no relay), one and three chained `mosto proxy` daemons, HAProxy (TCP
// mode, splice) and nginx stream. It reports single-flow throughput, CPU
// seconds per GB of every relay process (from /proc/PID/stat), connections
// per second with many short flows, memory per idle connection and idle
// RSS, with ratios to HAProxy.
//
// It owns a sink server and load generators in its own process and the
// relay processes it starts (configs written to a temporary directory); it
// stops every process and goroutine before Run returns. It is the engine of
// `mosto bench proxy`; the relays themselves belong to internal/relay and
// to the external programs.
package proxybench
