package probe

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Measurer measures the RTT to one address. UDPEcho and TCPHandshake
// implement it.
type Measurer interface {
	Measure(ctx context.Context, addr string) (time.Duration, error)
}

// Target is a peer to measure.
type Target struct {
	ID   string
	Addr string // host:port of its measurement endpoint (or hop port for TCPHandshake)
}

// ReportFunc delivers samples to the controller. An error keeps them
// pending.
type ReportFunc func(ctx context.Context, samples []Sample) error

// Config configures a Prober. Zero values take the defaults.
type Config struct {
	Measurer Measurer      // nil: &UDPEcho{}
	Interval time.Duration // between rounds; 0 means 10s
	// Jitter shortens each wait to Interval*(1-Jitter*u), u uniform in
	// [0,1): rounds of different FEPs drift apart, and no gap between two
	// rounds is ever longer than Interval. 0 means 0.1, <0 none.
	Jitter float64
	Probes int // probes per peer per round (the round sample is their minimum); 0 means 3
	// Spacing is the gap between the starts of a round's probes to one
	// peer: they are in flight together (matched by sequence number), so a
	// round costs about one RTT plus (Probes-1)*Spacing instead of Probes
	// RTTs. 0 means 5ms; <0 sends them one after the other.
	Spacing time.Duration
	Window  int // round samples per estimator; 0 means 3
	// ConfirmAfter is the delay of a confirmation round, which re-measures
	// only the peers whose latest sample moved beyond the threshold
	// (Tracker.Suspects); 0 means Interval/50 capped at 200ms (so a change
	// is reported within one probe interval plus two RTTs of the changed
	// pair and that delay), <0 disables confirmation rounds.
	ConfirmAfter time.Duration
	Threshold    Threshold     // 0 means 10% or 2 ms, whichever is larger
	Refresh      time.Duration // full report period; 0 means 10m, <0 never
	Concurrency  int           // peers measured at once; 0 means 32
	// UnreachableAfter is the number of consecutive full rounds in which a
	// peer answered no probe after which it is reported unreachable (once,
	// then in every full report until it answers again); 0 means 3.
	UnreachableAfter int
}

// Prober measures its targets every Interval and reports significant
// changes.
type Prober struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}

	mu      sync.Mutex // guards targets and tracker
	targets []Target
	tracker *Tracker
	failed  map[string]int // consecutive failed full rounds per peer
}

// NewProber returns a Prober; log may be nil.
func NewProber(cfg Config, log *slog.Logger) *Prober {
	if cfg.Measurer == nil {
		cfg.Measurer = &UDPEcho{}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = 0.1
	}
	if cfg.Jitter < 0 {
		cfg.Jitter = 0
	}
	if cfg.Jitter > 0.9 {
		cfg.Jitter = 0.9
	}
	if cfg.Probes <= 0 {
		cfg.Probes = 3
	}
	if cfg.Window <= 0 {
		cfg.Window = 3
	}
	if cfg.Spacing == 0 {
		cfg.Spacing = 5 * time.Millisecond
	}
	if cfg.ConfirmAfter == 0 {
		cfg.ConfirmAfter = min(200*time.Millisecond, cfg.Interval/50)
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 10 * time.Minute
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.UnreachableAfter <= 0 {
		cfg.UnreachableAfter = 3
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Prober{
		cfg:     cfg,
		log:     log,
		wake:    make(chan struct{}, 1),
		tracker: NewTracker(cfg.Window, cfg.Threshold, cfg.Refresh),
		failed:  make(map[string]int),
	}
}

// SetTargets replaces the peers to measure and, when they changed, wakes
// the prober for a round.
func (p *Prober) SetTargets(ts []Target) {
	p.mu.Lock()
	if slices.Equal(p.targets, ts) {
		p.mu.Unlock()
		return
	}
	p.targets = append([]Target(nil), ts...)
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	p.tracker.Retain(ids)
	for id := range p.failed {
		if !slices.Contains(ids, id) {
			delete(p.failed, id)
		}
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Estimates returns the current estimate of every peer that has one.
func (p *Prober) Estimates() map[string]time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]time.Duration)
	for _, t := range p.targets {
		if d, ok := p.tracker.Estimate(t.ID); ok {
			out[t.ID] = d
		}
	}
	return out
}

// Run measures and reports until ctx ends. The first round starts at once;
// the next one starts Interval (less jitter) after the start of the
// previous one, or at once when that round took longer.
func (p *Prober) Run(ctx context.Context, report ReportFunc) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-p.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		select {
		case <-p.wake: // this round reads the targets that woke it
		default:
		}
		// Rounds start every nextWait, whatever they and their
		// confirmation took: a change waits at most Interval for a round.
		next := time.Now().Add(p.nextWait())
		p.Round(ctx)
		p.Flush(ctx, report)
		if p.cfg.ConfirmAfter > 0 {
			if !p.confirm(ctx, report) {
				return nil
			}
		}
		timer.Reset(max(0, time.Until(next)))
	}
}

// confirm runs one confirmation round for the suspect peers, if any, after
// ConfirmAfter. It returns false when ctx ended.
func (p *Prober) confirm(ctx context.Context, report ReportFunc) bool {
	p.mu.Lock()
	suspects := p.tracker.Suspects()
	p.mu.Unlock()
	if len(suspects) == 0 {
		return true
	}
	t := time.NewTimer(p.cfg.ConfirmAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	p.log.Debug("confirmation round", "peers", suspects)
	p.round(ctx, suspects)
	p.Flush(ctx, report)
	return true
}

func (p *Prober) nextWait() time.Duration {
	f := 1 - p.cfg.Jitter*rand.Float64()
	return time.Duration(float64(p.cfg.Interval) * f)
}

// Flush sends the pending samples through report and commits them on success.
func (p *Prober) Flush(ctx context.Context, report ReportFunc) error {
	p.mu.Lock()
	samples, full := p.tracker.Pending(time.Now())
	p.mu.Unlock()
	if len(samples) == 0 {
		return nil
	}
	if err := report(ctx, samples); err != nil {
		p.mu.Lock()
		p.tracker.Failed(samples)
		p.mu.Unlock()
		p.log.Warn("rtt report failed; will retry", "samples", len(samples), "err", err)
		return fmt.Errorf("report: %w", err)
	}
	p.mu.Lock()
	p.tracker.Commit(samples, full, time.Now())
	p.mu.Unlock()
	p.log.Debug("rtt report sent", "samples", len(samples), "full", full)
	return nil
}

// Round measures every target once (Probes back-to-back probes each, at
// most Concurrency peers at a time) and feeds the estimators.
func (p *Prober) Round(ctx context.Context) { p.round(ctx, nil) }

// round measures the targets named in only (all when only is nil).
func (p *Prober) round(ctx context.Context, only []string) {
	p.mu.Lock()
	var targets []Target
	for _, t := range p.targets {
		if only == nil || slices.Contains(only, t.ID) {
			targets = append(targets, t)
		}
	}
	p.mu.Unlock()
	type result struct {
		id  string
		rtt time.Duration
		at  time.Time
		err error
	}
	results := make([]result, len(targets))
	sem := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, t := range targets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rtt, err := p.burst(ctx, t.Addr)
			results[i] = result{id: t.ID, rtt: rtt, at: time.Now(), err: err}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // the failures are ours: shutting down
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range results {
		if r.err != nil {
			if only != nil {
				continue // only full rounds count towards UnreachableAfter
			}
			p.failed[r.id]++
			if p.failed[r.id] == p.cfg.UnreachableAfter {
				p.log.Warn("peer unreachable; reporting it", "peer", r.id, "rounds", p.cfg.UnreachableAfter, "err", r.err)
				p.tracker.MarkUnreachable(r.id, r.at)
			}
			continue
		}
		if p.tracker.Unreachable(r.id) {
			p.log.Info("peer answers again", "peer", r.id, "rtt", r.rtt)
		}
		delete(p.failed, r.id)
		p.tracker.Observe(r.id, r.rtt, r.at)
	}
}

// burst sends Probes probes to addr and returns the smallest RTT. With a
// positive Spacing the probes are in flight together, the k-th sent
// k*Spacing after the first; otherwise one after the other.
func (p *Prober) burst(ctx context.Context, addr string) (time.Duration, error) {
	rtts := make([]time.Duration, p.cfg.Probes)
	errs := make([]error, p.cfg.Probes)
	if p.cfg.Spacing < 0 {
		for k := range rtts {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			rtts[k], errs[k] = p.cfg.Measurer.Measure(ctx, addr)
		}
	} else {
		var wg sync.WaitGroup
		for k := range rtts {
			if k > 0 && !sleep(ctx, p.cfg.Spacing) {
				break
			}
			wg.Go(func() { rtts[k], errs[k] = p.cfg.Measurer.Measure(ctx, addr) })
		}
		wg.Wait()
	}
	var best time.Duration
	var lastErr error
	for k, d := range rtts {
		if errs[k] != nil {
			lastErr = errs[k]
			continue
		}
		if d > 0 && (best == 0 || d < best) {
			best = d
		}
	}
	if best == 0 {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if lastErr == nil {
			lastErr = errNoSample
		}
		return 0, lastErr
	}
	return best, nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
