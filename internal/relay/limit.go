package relay

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// connLimiter bounds open connections globally and per source address
// (entry listeners and hop listener counted apart).
type connLimiter struct {
	max, perSource, hopPerSource int

	mu    sync.Mutex
	n     int
	entry map[netip.Addr]int
	hop   map[netip.Addr]int
}

func newConnLimiter(max, perSource, hopPerSource int) *connLimiter {
	return &connLimiter{
		max: max, perSource: perSource, hopPerSource: hopPerSource,
		entry: make(map[netip.Addr]int), hop: make(map[netip.Addr]int),
	}
}

// acquire admits a connection from ip, or returns the refusal reason.
func (l *connLimiter) acquire(ip netip.Addr, hop bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= l.max {
		return refuseLimitGlobal
	}
	m, limit := l.entry, l.perSource
	if hop {
		m, limit = l.hop, l.hopPerSource
	}
	if limit > 0 && m[ip] >= limit {
		return refuseLimitSource
	}
	l.n++
	m[ip]++
	return ""
}

func (l *connLimiter) release(ip netip.Addr, hop bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	m := l.entry
	if hop {
		m = l.hop
	}
	if m[ip]--; m[ip] <= 0 {
		delete(m, ip)
	}
}

func (l *connLimiter) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// rateLog logs refusals: each at Debug, and at most one Warn per reason per
// interval carrying the count of refusals since the previous Warn, so a
// flood cannot flood the log.
type rateLog struct {
	log      *slog.Logger
	interval time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	hits map[string]int
}

func newRateLog(log *slog.Logger, interval time.Duration) *rateLog {
	return &rateLog{log: log, interval: interval, last: make(map[string]time.Time), hits: make(map[string]int)}
}

func (r *rateLog) refused(reason string, src netip.AddrPort, err error) {
	r.log.Debug("refused", "reason", reason, "src", src.String(), "err", err)
	now := time.Now()
	r.mu.Lock()
	r.hits[reason]++
	if now.Sub(r.last[reason]) < r.interval {
		r.mu.Unlock()
		return
	}
	n := r.hits[reason]
	r.hits[reason] = 0
	r.last[reason] = now
	r.mu.Unlock()
	r.log.Warn("refusing connections", "reason", reason, "count", n, "example_src", src.String(), "err", err)
}
