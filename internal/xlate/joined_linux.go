//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import "net/netip"

// Joined reports whether the entry keyed by in (either direction of a join)
// is still installed. A caller that keeps a joined leg's socket open (in
// TCP_REPAIR mode, silent) so that its local port is not reused by a new
// connection while the join lives polls it to know when to close (the
// request router does; see docs/router.md).
func (s *Splicer) Joined(in Tuple) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pairs[in]
	return ok
}

// Entry returns the counters of the entry keyed by in (one direction of a
// join); ok is false when it is not installed. The request router reads
// the surrogate -> router direction to know the surrogate has answered
// (so the request needs no retransmission and its leg can go silent).
// Not to be called after Close.
func (s *Splicer) Entry(in Tuple) (EntryStats, bool) {
	var v xlateEntry
	k := tupleKey(in)
	if err := s.objs.Joins.Lookup(&k, &v); err != nil {
		return EntryStats{}, false
	}
	return entryStats(v), true
}

// RouteIfindex is the device this network namespace's routing table sends
// dst's packets out of: what Install looks up for an Entry whose Ifindex
// is 0 (a netlink round trip). A caller installing many joins towards the
// same addresses can look it up once and set Ifindex (the request router
// caches it per address).
func RouteIfindex(dst netip.Addr) (int, error) { return routeIfindex(dst) }
