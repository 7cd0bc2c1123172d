package relay

import (
	"log/slog"
	"net/netip"
	"reflect"
	"sync"
	"time"
)

// connLimiter bounds open connections with separate budgets for the entry
// listeners and the hop listener (a hop-port flood cannot starve clients,
// nor a client flood the overlay), and per source: IPv4 per address, IPv6
// per /64 (one host holds a whole /64). On the hop listener, addresses of
// members (hop addresses in the current member list) have no per-source
// cap; every other address gets hopPerSource.
type connLimiter struct {
	max, hopMax, perSource, hopPerSource int
	member                               func(netip.Addr) bool // nil: no members

	mu         sync.Mutex
	nEntry     int
	nHop       int
	entry, hop map[netip.Addr]int
}

func newConnLimiter(max, hopMax, perSource, hopPerSource int, member func(netip.Addr) bool) *connLimiter {
	return &connLimiter{
		max: max, hopMax: hopMax, perSource: perSource, hopPerSource: hopPerSource, member: member,
		entry: make(map[netip.Addr]int), hop: make(map[netip.Addr]int),
	}
}

// sourceKey is what a source is counted as: the IPv4 address, or the /64
// of an IPv6 address.
func sourceKey(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// acquire admits a connection from ip, or returns the refusal reason.
func (l *connLimiter) acquire(ip netip.Addr, hop bool) string {
	k := sourceKey(ip)
	limit := l.perSource
	if hop {
		limit = l.hopPerSource
		if l.member != nil && l.member(ip.Unmap()) {
			limit = 0
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n, max, m := &l.nEntry, l.max, l.entry
	if hop {
		n, max, m = &l.nHop, l.hopMax, l.hop
	}
	if *n >= max {
		return refuseLimitGlobal
	}
	if limit > 0 && m[k] >= limit {
		return refuseLimitSource
	}
	*n++
	m[k]++
	return ""
}

func (l *connLimiter) release(ip netip.Addr, hop bool) {
	k := sourceKey(ip)
	l.mu.Lock()
	defer l.mu.Unlock()
	n, m := &l.nEntry, l.entry
	if hop {
		n, m = &l.nHop, l.hop
	}
	*n--
	if m[k]--; m[k] <= 0 {
		delete(m, k)
	}
}

// total returns the open connections of both budgets.
func (l *connLimiter) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nEntry + l.nHop
}

// memberIPs answers whether an address is a member's, from a member list
// it parses again only when the list (the map) changes.
type memberIPs struct {
	members func() map[string]string

	mu   sync.Mutex
	from uintptr // identity of the map the set was built from
	n    int
	set  map[netip.Addr]bool
}

func (m *memberIPs) has(ip netip.Addr) bool {
	cur := m.members()
	id := reflect.ValueOf(cur).Pointer()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.set == nil || id != m.from || len(cur) != m.n {
		m.set = make(map[netip.Addr]bool, len(cur))
		for _, a := range cur {
			if ap, err := netip.ParseAddrPort(a); err == nil {
				m.set[ap.Addr().Unmap()] = true
			}
		}
		m.from, m.n = id, len(cur)
	}
	return m.set[ip]
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
