package probe

import (
	"slices"
	"time"
)

// Window is the robust RTT estimator of one peer: the median of the last N
// round samples, where a round sample is the minimum of a few probes sent
// back to back.
//
// Why: queueing and scheduling noise only ever adds delay, so within a
// burst the minimum is the best view of the path (the WonderProxy matrix
// mosto plans with is a minimum RTT too); a whole round can still be bad (a
// congested second, a paused VM), and the median over rounds ignores up to
// (N-1)/2 such rounds in either direction. A minimum over the window would
// be as robust to spikes but would hide a route change that lengthens the
// path for N rounds; a mean would follow every spike. With N=3 a sustained
// change needs two rounds; the Prober runs the second one as a quick
// confirmation round (ConfirmAfter) instead of waiting a full interval.
type Window struct {
	n       int
	samples []time.Duration // ring, oldest first once full
	next    int
	scratch []time.Duration
}

// NewWindow returns an estimator over the last n samples (n < 1 means 5).
func NewWindow(n int) *Window {
	if n < 1 {
		n = 5
	}
	return &Window{n: n, samples: make([]time.Duration, 0, n), scratch: make([]time.Duration, 0, n)}
}

// Add records a sample; non-positive samples are ignored.
func (w *Window) Add(d time.Duration) {
	if d <= 0 {
		return
	}
	if len(w.samples) < w.n {
		w.samples = append(w.samples, d)
		return
	}
	w.samples[w.next] = d
	w.next = (w.next + 1) % w.n
}

// Len returns the number of samples held.
func (w *Window) Len() int { return len(w.samples) }

// Full reports whether the window holds its N samples.
func (w *Window) Full() bool { return len(w.samples) == w.n }

// Estimate returns the median of the window (the mean of the two middle
// samples for an even count) and false when the window is empty.
func (w *Window) Estimate() (time.Duration, bool) {
	if len(w.samples) == 0 {
		return 0, false
	}
	s := append(w.scratch[:0], w.samples...)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m], true
	}
	return (s[m-1] + s[m]) / 2, true
}

// Threshold decides when a new estimate is worth reporting: when it differs
// from the last reported one by more than Rel (a fraction) of it or by more
// than Abs, whichever is larger. The default, 10% or 2 ms, keeps jitter of
// short links (where 10% is tens of microseconds) from causing reports and
// still reports a 10% change on long ones, where it can change chains.
type Threshold struct {
	Rel float64       // 0 means 0.10
	Abs time.Duration // 0 means 2ms
}

// Changed reports whether now differs significantly from last.
func (t Threshold) Changed(last, now time.Duration) bool {
	rel, abs := t.Rel, t.Abs
	if rel <= 0 {
		rel = 0.10
	}
	if abs <= 0 {
		abs = 2 * time.Millisecond
	}
	limit := max(time.Duration(float64(last)*rel), abs)
	diff := now - last
	if diff < 0 {
		diff = -diff
	}
	return diff > limit
}
