package probe

import (
	"slices"
	"strings"
	"time"
)

// Sample is one reported RTT estimate for a peer, or (Unreachable, RTT 0)
// the report that the peer stopped answering.
type Sample struct {
	Peer        string
	RTT         time.Duration
	At          time.Time // when the newest sample behind the estimate was taken (for Unreachable: when it was marked)
	Unreachable bool
}

// Tracker keeps the estimators of a prober's peers and decides what to
// report; it does no I/O and reads no clock.
//
// A peer's estimate is reported when it was never reported (the first
// report therefore carries every peer with an estimate) or when it moved by
// more than the Threshold from the value last reported. An estimate
// reported before its window was full (the first one, from a single round,
// for quick discovery) is reported once more when the window is full and
// its median differs: the controller's matrix then holds the robust
// estimate, not a first round that a loaded machine inflated by less than
// the threshold (which would otherwise stand until the next Refresh). Every Refresh, the
// next report carries all peers again, so a controller that lost state (or a
// new leader) converges without asking. A failed report commits nothing:
// the same changes stay pending for the next round, and since it may have
// been applied all the same, its peers go with the next report even when
// their state moved back within the threshold meanwhile (Failed).
//
// A peer marked unreachable (MarkUnreachable, after several failed rounds)
// loses its estimate and is reported unreachable once, then in every full
// report until it answers again; its first sample after that is reported
// at once, whatever the threshold.
type Tracker struct {
	window    int
	threshold Threshold
	refresh   time.Duration
	peers     map[string]*peerState
	lastFull  time.Time // zero until a report carrying all peers succeeded
}

type peerState struct {
	w        *Window
	last     time.Duration // latest round sample
	at       time.Time
	reported time.Duration
	has      bool // reported at least once
	down     bool // marked unreachable and not answering since
	downAt   time.Time
	sentDown bool // the latest report about the peer said unreachable
	unsure   bool // a report carrying the peer failed: the controller may hold what it said
	early    bool // the reported estimate is from a window that was not full
}

// NewTracker returns a Tracker keeping window samples per peer; refresh <= 0
// disables periodic full reports.
func NewTracker(window int, th Threshold, refresh time.Duration) *Tracker {
	return &Tracker{window: window, threshold: th, refresh: refresh, peers: make(map[string]*peerState)}
}

// Observe records a round sample for peer taken at at.
func (t *Tracker) Observe(peer string, rtt time.Duration, at time.Time) {
	ps := t.peers[peer]
	if ps == nil {
		ps = &peerState{w: NewWindow(t.window)}
		t.peers[peer] = ps
	}
	if rtt <= 0 {
		return
	}
	ps.w.Add(rtt)
	ps.last, ps.at = rtt, at
	ps.down = false
}

// MarkUnreachable records at at that peer stopped answering: its estimate
// is dropped (the samples from before the outage say nothing about the path
// after it) and the next report says it is unreachable.
func (t *Tracker) MarkUnreachable(peer string, at time.Time) {
	ps := t.peers[peer]
	if ps == nil {
		ps = &peerState{}
		t.peers[peer] = ps
	}
	if ps.down {
		return
	}
	ps.w = NewWindow(t.window)
	ps.down, ps.downAt = true, at
}

// Unreachable reports whether peer is marked unreachable.
func (t *Tracker) Unreachable(peer string) bool {
	ps := t.peers[peer]
	return ps != nil && ps.down
}

// Suspects returns the peers whose latest round sample moved beyond the
// threshold from the reported value while their estimate has not (yet):
// a confirmation round for them either confirms the change (and the window's
// majority moves) or shows the sample was an outlier.
func (t *Tracker) Suspects() []string {
	var out []string
	for peer, ps := range t.peers {
		est, ok := ps.w.Estimate()
		if !ok || !ps.has {
			continue
		}
		if t.threshold.Changed(ps.reported, ps.last) && !t.threshold.Changed(ps.reported, est) {
			out = append(out, peer)
		}
	}
	slices.Sort(out)
	return out
}

// Retain forgets every peer not in keep.
func (t *Tracker) Retain(keep []string) {
	for p := range t.peers {
		if !slices.Contains(keep, p) {
			delete(t.peers, p)
		}
	}
}

// Estimate returns the current estimate for peer.
func (t *Tracker) Estimate(peer string) (time.Duration, bool) {
	ps := t.peers[peer]
	if ps == nil {
		return 0, false
	}
	return ps.w.Estimate()
}

// Pending returns the samples to report at now, sorted by peer, and whether
// they are a full report (every peer with an estimate or marked unreachable).
func (t *Tracker) Pending(now time.Time) (samples []Sample, full bool) {
	full = t.lastFull.IsZero() || (t.refresh > 0 && now.Sub(t.lastFull) >= t.refresh)
	for peer, ps := range t.peers {
		if ps.down {
			if full || !ps.sentDown || ps.unsure {
				samples = append(samples, Sample{Peer: peer, At: ps.downAt, Unreachable: true})
			}
			continue
		}
		est, ok := ps.w.Estimate()
		if !ok {
			continue
		}
		settle := ps.early && ps.w.Full() && est != ps.reported
		if full || !ps.has || ps.sentDown || ps.unsure || settle || t.threshold.Changed(ps.reported, est) {
			samples = append(samples, Sample{Peer: peer, RTT: est, At: ps.at})
		}
	}
	slices.SortFunc(samples, func(a, b Sample) int { return strings.Compare(a.Peer, b.Peer) })
	return samples, full
}

// Commit records that samples (from Pending) were reported at now.
func (t *Tracker) Commit(samples []Sample, full bool, now time.Time) {
	for _, s := range samples {
		ps := t.peers[s.Peer]
		switch {
		case ps == nil:
		case s.Unreachable:
			ps.sentDown, ps.unsure = true, false
		default:
			ps.reported, ps.has, ps.sentDown, ps.unsure = s.RTT, true, false, false
			ps.early = !ps.w.Full()
		}
	}
	if full && len(samples) > 0 {
		t.lastFull = now
	}
}

// Failed records that a report of samples (from Pending) failed. A failed
// report may still have been applied (the controller stored it and its
// answer was lost or came after the reporter's timeout), so its peers are
// reported again, at their state then, by the next report, whatever the
// threshold.
func (t *Tracker) Failed(samples []Sample) {
	for _, s := range samples {
		if ps := t.peers[s.Peer]; ps != nil {
			ps.unsure = true
		}
	}
}
