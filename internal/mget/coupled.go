package mget

import "time"

// Coupled congestion control of sub-flows that share links (RFC 6356's
// goals, at the level of the receiver's requests).
//
// Every sub-flow's bytes travel on its own TCP connection, whose congestion
// control the client does not see; what the client controls is how much
// each sub-flow may have requested and not received (its window). A
// sub-flow whose window exceeds its path's share is network-limited: its
// TCP connection takes one TCP flow's share of the bottleneck. So n
// uncoupled sub-flows through one bottleneck take n shares, which RFC 6356
// forbids (goal 2: a multipath flow takes no more than one TCP flow would
// on the best of its paths).
//
// The sub-flows of one Source.Group (the controller says their chains
// share links) are coupled: at any time one of them, the group's leader,
// has its full window (2 x rate x RTT + a range: network-limited, exactly
// one TCP flow's share on its path); the others request nothing and keep
// their connection (the group is one TCP flow on its best path). The
// leader is the live member with the best rate: the first member in
// source order (the controller's rank) to start, then a parked member
// whose rate when it last led beats the leader's by leadMargin once the
// leader has led leadMin (goal 3: move the group's traffic off a path that
// became congested); a leader that stalls, fails or ends hands over at
// once, so the coupling costs no failover time. RFC 6356's linked increase
// reaches the same total on a shared bottleneck by dividing one window
// between the sub-flows; giving the whole window to the best one is the
// limit it tends to when one path is better (its goal 3), and the only
// division the client can enforce without seeing losses. Sub-flows of
// different groups, or of none, have independent windows: on disjoint
// paths each takes its path's share (goal 1).
const (
	leadMargin = 1.25
	leadMin    = 2 * time.Second
)

// mayRequestLocked reports whether s may have requests in flight: it is
// uncoupled, or its group's leader. d.mu must be held.
func (d *dl) mayRequestLocked(s *sub) bool {
	if s.src.Group == "" {
		return true
	}
	return d.leaders[s.src.Group] == s
}

// electLocked picks each coupled group's leader and reports whether one
// changed. d.mu must be held.
func (d *dl) electLocked() bool {
	changed := false
	now := time.Now()
	seen := map[string]bool{}
	for _, s := range d.subs {
		g := s.src.Group
		if g == "" || seen[g] {
			continue
		}
		seen[g] = true
		cur := d.leaders[g]
		var best *sub // the live member with the best rate when it last led
		for _, m := range d.subs {
			if m.src.Group != g || !m.live || m == cur {
				continue
			}
			if best == nil || m.known > best.known {
				best = m
			}
		}
		next := cur
		switch {
		case cur == nil || !cur.live:
			next = best
		case best != nil && now.Sub(cur.ledSince) >= leadMin && best.known > leadMargin*cur.rate:
			next = best
		}
		if next == cur {
			continue
		}
		if cur != nil {
			cur.known = cur.rate
			cur.st.Led += now.Sub(cur.ledSince).Seconds()
		}
		if next != nil {
			next.ledSince = now
			d.leaders[g] = next
		} else {
			delete(d.leaders, g)
		}
		changed = true
	}
	return changed
}
