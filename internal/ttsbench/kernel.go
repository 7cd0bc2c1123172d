package ttsbench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// kernelKeys are the TCP counters (/proc/net/snmp Tcp, /proc/net/netstat
// TcpExt) recorded per transfer: what the senders' loss detection and
// recovery did, and whether it was undone as spurious.
var kernelKeys = []string{
	"RetransSegs", "TCPTimeouts", "TCPSpuriousRTOs", "TCPLossUndo", "TCPFullUndo", "TCPPartialUndo",
	"TCPDSACKUndo", "TCPRenoRecovery", "TCPSackRecovery", "TCPRenoReorder", "TCPTSReorder",
	"TCPSACKReorder", "TCPRenoFailures", "TCPSackFailures", "TCPLossFailures", "TCPFastRetrans",
	"TCPSlowStartRetrans", "TCPLostRetransmit", "TCPDSACKRecv", "TCPLossProbes", "TCPLossProbeRecovery",
	"TCPRenoRecoveryFail", "TCPSackRecoveryFail",
}

// kernelHosts are the hosts whose counters a transfer records: the
// server (the sender of E2E and of the server's leg) and the relay (the
// sender of the client's leg).
var kernelHosts = []string{"s", "r1"}

// counters reads host's TCP counters (its netns's /proc/net).
func (l *lab) counters(ctx context.Context, host string) (map[string]int64, error) {
	out, err := l.w.Command(ctx, host, "cat", "/proc/net/snmp", "/proc/net/netstat").Output()
	if err != nil {
		return nil, fmt.Errorf("ttsbench: counters of %s: %w", host, err)
	}
	return parseCounters(string(out)), nil
}

// parseCounters reads the Tcp and TcpExt lines of /proc/net/snmp and
// /proc/net/netstat (a line of names, then a line of values, each led by
// "Tcp:" or "TcpExt:").
func parseCounters(s string) map[string]int64 {
	m := map[string]int64{}
	lines := strings.Split(s, "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) < 2 || len(names) != len(vals) || names[0] != vals[0] || (names[0] != "Tcp:" && names[0] != "TcpExt:") {
			continue
		}
		if _, err := strconv.ParseInt(vals[1], 10, 64); err != nil {
			continue // vals is not a values line
		}
		for k := 1; k < len(names); k++ {
			if v, err := strconv.ParseInt(vals[k], 10, 64); err == nil {
				m[names[k]] = v
			}
		}
		i++
	}
	return m
}

// kernelSnapshot reads the counters of kernelHosts; nil when one fails.
func (l *lab) kernelSnapshot(ctx context.Context) map[string]map[string]int64 {
	snap := map[string]map[string]int64{}
	for _, h := range kernelHosts {
		c, err := l.counters(ctx, h)
		if err != nil {
			l.cfg.Log.Debug("kernel counters", "err", err)
			return nil
		}
		snap[h] = c
	}
	return snap
}

// kernelDelta returns the nonzero changes of kernelKeys per host between
// two snapshots; nil when either is missing.
func kernelDelta(before, after map[string]map[string]int64) map[string]map[string]int64 {
	if before == nil || after == nil {
		return nil
	}
	out := map[string]map[string]int64{}
	for h, a := range after {
		b := before[h]
		for _, k := range kernelKeys {
			if d := a[k] - b[k]; d != 0 {
				if out[h] == nil {
					out[h] = map[string]int64{}
				}
				out[h][k] = d
			}
		}
	}
	return out
}
