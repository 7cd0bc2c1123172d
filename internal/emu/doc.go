// Package emu emulates a multi-host wide-area network on one Linux machine.
//
// Each host of a world gets its own network namespace holding one TUN
// device. One emulator (this process) holds every TUN file descriptor and
// forwards each IP packet to the destination host's device after that pair's
// one-way delay, applying loss, jitter, a rate limit and a queue limit. Delays
// come from an RTT matrix (an embedded dataset of package topo or a CSV file)
// or from explicit per-pair links; see docs/emu.md.
//
// The package owns the namespaces (mosto-<runid>-<idx>), their devices, the
// state files under /run/mosto/emu and the processes started in its
// namespaces. In the root namespace it changes nothing but
// net.ipv4.tcp_allowed_congestion_control (only when a world asks for a
// congestion control that is not allowed yet), and restores it on Close.
// Addresses come from 10.77.0.0/16 and exist only inside the world's
// namespaces. In its own process, Up raises GOMAXPROCS to cover the
// emulator's locked threads (and gives them real-time priority only when
// asked to; see UpOptions).
package emu
