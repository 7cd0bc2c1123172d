//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"net/netip"

	"github.com/cilium/ebpf"
)

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

// InstallEgress installs one entry alone, for this host's egress program
// (Config.Egress): this host's own packets of e.In (sent by a local socket
// to a peer that handed the session off, e.g. a surrogate's answer to the
// request router's pooled connection) leave as e.Out's packets. The other
// direction is translated elsewhere (the router's host), so the TSval delta
// latched here is not passed on. The sweeper removes the entry after
// IdleTimeout without packets, or CloseLinger after a FIN or RST it saw.
// An entry of the same tuple is replaced: the sender reuses a tuple only
// after its join ended (the router holds a joined leg's tuple meanwhile).
//
// With Ifindex 0 and the program on one device, the entry leaves by it (no
// route lookup: a surrogate's agent installs on the request's path).
func (s *Splicer) InstallEgress(e Entry) error {
	if e.Ifindex == 0 && len(s.ifaces) == 1 {
		for idx := range s.ifaces {
			e.Ifindex = idx
		}
	}
	if e.Ifindex == 0 {
		idx, err := routeIfindex(e.Out.Dst.Addr())
		if err != nil {
			return s.count(refuse(ReasonRoute, "%v", err))
		}
		e.Ifindex = idx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.links != nil {
		if _, ok := s.ifaces[e.Ifindex]; !ok {
			return s.count(refuse(ReasonRoute, "%s leaves from ifindex %d, which has no xlate program", e.Out, e.Ifindex))
		}
	}
	e.Remote, e.TSBack = false, 0
	k, v := tupleKey(e.In), e.value()
	v.LastNs = uint64(monoNow())
	if _, ok := s.pairs[e.In]; ok {
		return s.count(refuse(ReasonExists, "%s is joined on this host", e.In))
	}
	if err := s.objs.Joins.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return s.count(installErr(e.In, err))
	}
	s.singles[e.In] = true
	s.joined.Add(1)
	return nil
}

// RemoveEgress removes an entry installed by InstallEgress.
func (s *Splicer) RemoveEgress(in Tuple) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.singles[in] {
		return false
	}
	k := tupleKey(in)
	s.objs.Joins.Delete(&k)
	delete(s.singles, in)
	s.removed.Add(1)
	return true
}

// Release clears Entry.Remote on the entry keyed by in: the peer's egress
// translation is not (or no longer) in place and this host translates the
// direction alone (it did already; only the Remote counters stop). The
// flag is cleared with a read-modify-write of
// the entry; a FIN or RST latched by the program in between is lost (the
// pair then ends on its idle timeout).
func (s *Splicer) Release(in Tuple) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pairs[in]; !ok {
		return false
	}
	var v xlateEntry
	k := tupleKey(in)
	if s.objs.Joins.Lookup(&k, &v) != nil {
		return false
	}
	if v.Flags&fRemote == 0 {
		return true
	}
	v.Flags &^= fRemote
	return s.objs.Joins.Update(&k, &v, ebpf.UpdateExist) == nil
}
