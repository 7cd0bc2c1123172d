package mget

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"
)

// Source is one sub-flow: a mirror's URL reached over one path. Several
// sources may name the same URL over different paths (multipath).
type Source struct {
	URL  string
	Path string // the path's name in stats ("direct" when empty)
	// Dial opens the path's connection to the URL's host:port; nil dials
	// directly.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Group couples the sub-flow's window with the other sub-flows of the
	// same non-empty Group: sub-flows whose paths share links (the
	// controller's chains say which). A group takes no more than one TCP
	// flow would on its best path (see coupled.go); "" is uncoupled.
	Group string
}

// Config configures Get.
type Config struct {
	Sources  []Source
	Out      string // file written in place
	Continue bool   // resume from Out and its state file Out+".mget"
	SHA256   []byte // when set, the file must hash to it
	Block    int64  // range size; 0: 128 KiB
	// Stall is how long a sub-flow with requests in flight may receive
	// nothing before its ranges go back to the pool; 0: 2 s. A source's
	// first probe waits at least 2 s whatever Stall is.
	Stall time.Duration
	// MaxWindow caps the bytes a sub-flow has requested and not received;
	// 0: 16 MiB.
	MaxWindow int64
	// GiveUp is how many sessions in a row may receive nothing before a
	// sub-flow drops its source; 0: 12 (with the backoff and the re-probe
	// wait, about a minute or more: well beyond seed 003's 7-second
	// silence).
	GiveUp int
	// Progress, when set, is called about every 200 ms with a snapshot.
	Progress func(Snapshot)
	Log      *slog.Logger // nil discards
}

// Snapshot is the state of a download for a progress display.
type Snapshot struct {
	Size, Received int64
	Elapsed        time.Duration
	Names          []string  // per sub-flow: host and path
	MBps           []float64 // per sub-flow rate (EWMA)
}

// Stats describes a finished (or failed) download; it is what --json prints.
type Stats struct {
	File     string     `json:"file"`
	Identity Identity   `json:"identity"`
	Bytes    int64      `json:"bytes"`   // received in this run
	Resumed  int64      `json:"resumed"` // held from an earlier run
	Seconds  float64    `json:"seconds"`
	MBps     float64    `json:"mbps"`
	SHA256   string     `json:"sha256,omitempty"`
	Subflows []SubStats `json:"subflows"`
	Samples  []Sample   `json:"samples,omitempty"`
}

// SubStats is one sub-flow's part of a download.
type SubStats struct {
	URL      string  `json:"url"`
	Path     string  `json:"path"`
	Group    string  `json:"group,omitempty"`
	Led      float64 `json:"led_s,omitempty"` // seconds this sub-flow led its coupled group
	Bytes    int64   `json:"bytes"`
	DupBytes int64   `json:"dup_bytes"` // received in end-game duplicates
	Requests int     `json:"requests"`
	Stalls   int     `json:"stalls"`
	Errors   int     `json:"errors"`
	LastErr  string  `json:"last_error,omitempty"`
	Disabled string  `json:"disabled,omitempty"` // why the source was dropped
	RTTms    float64 `json:"rtt_ms"`
	MBps     float64 `json:"mbps"` // bytes over the whole download time
}

// Sample is the per-sub-flow receive rate over one sampling interval.
type Sample struct {
	T    float64   `json:"t"` // seconds since the start
	MBps []float64 `json:"mbps"`
}

const sampleEvery = 100 * time.Millisecond

// dl is one download's shared state; mu guards everything below it.
type dl struct {
	cfg   Config
	log   *slog.Logger
	start time.Time

	probes []chan probeResult // per sub-flow, its first identity probe
	ready  chan struct{}      // closed once id, sched and file are set

	mu      sync.Mutex
	id      Identity
	sched   *Sched
	file    *os.File
	changed chan struct{} // closed and replaced when ranges free up
	subs    []*sub
	werr    error // first write error
	resumed int64
	samples []Sample
	leaders map[string]*sub // per coupled group, the sub-flow that may request (coupled.go)
}

type probeResult struct {
	id  Identity
	err error
}

// sub is one sub-flow's state (guarded by dl.mu).
type sub struct {
	src       Source
	u         *url.URL
	st        SubStats
	rate      float64 // bytes/s, EWMA
	last      float64 // bytes/s over the last sampling interval
	active    float64 // the EWMA rate when the sub-flow last received bytes
	warm      float64 // active when the session went live: its window's rate while young
	warmUntil time.Time
	lastBytes int64
	srtt      time.Duration
	live      bool    // a session is past its probe or first range and may request
	known     float64 // rate (bytes/s) when it last led its group
	spec      *Span   // the first range, asked before the scheduler was made (sessFirst)
	specOwn   bool    // setup gave spec's block to this sub-flow (Sched.Claim)
	// verified: a response of this source matched the reference identity;
	// from then on its requests carry If-Range (before, a mirror of
	// another version would answer 200 instead of showing its validators).
	verified bool
	ledSince time.Time // when it became its group's leader
	exited   bool
	dropped  error // why the source was dropped
}

// Get downloads one object from its sources into cfg.Out and returns the
// stats. Every source's answers are checked against the reference identity
// (the first source that answers, in the given order); a source that breaks
// the range protocol or disagrees is dropped. The download fails when no
// source is left, on a write error, or when --sha256 does not match.
func Get(ctx context.Context, cfg Config) (*Stats, error) {
	if len(cfg.Sources) == 0 {
		return nil, errors.New("mget: no source")
	}
	if cfg.Out == "" {
		return nil, errors.New("mget: no output file")
	}
	if cfg.Block <= 0 {
		cfg.Block = 128 << 10
	}
	if cfg.Stall <= 0 {
		cfg.Stall = 2 * time.Second
	}
	if cfg.MaxWindow <= 0 {
		cfg.MaxWindow = 16 << 20
	}
	if cfg.GiveUp <= 0 {
		cfg.GiveUp = 12
	}
	d := &dl{cfg: cfg, log: cfg.Log, start: time.Now(), ready: make(chan struct{}), changed: make(chan struct{}), leaders: map[string]*sub{}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	for _, src := range cfg.Sources {
		u, err := url.Parse(src.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("mget: source %q: want an http:// or https:// URL", src.URL)
		}
		if src.Path == "" {
			src.Path = "direct"
		}
		d.subs = append(d.subs, &sub{src: src, u: u, st: SubStats{URL: src.URL, Path: src.Path, Group: src.Group}})
		d.probes = append(d.probes, make(chan probeResult, 1))
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	exited := make(chan int, len(d.subs))
	for i := range d.subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.runSub(ctx, i)
			exited <- i
		}()
	}
	defer wg.Wait()

	if err := d.setup(ctx); err != nil {
		cancel()
		wg.Wait()
		return d.stats(), err
	}
	defer d.file.Close()
	err := d.wait(ctx, exited)
	cancel()
	wg.Wait()
	d.mu.Lock()
	done := d.sched.Done()
	d.mu.Unlock()
	st := d.stats()
	if err == nil && !done {
		err = errors.New("mget: download incomplete")
	}
	if err != nil {
		if serr := d.saveState(); serr != nil {
			err = errors.Join(err, serr)
		}
		return st, err
	}
	sum, err := hashFile(d.file)
	if err != nil {
		return st, fmt.Errorf("mget: %w", err)
	}
	st.SHA256 = hex.EncodeToString(sum)
	if cfg.SHA256 != nil && !bytes.Equal(sum, cfg.SHA256) {
		os.Remove(statePath(cfg.Out))
		return st, fmt.Errorf("mget: %s: SHA-256 %s, want %x", cfg.Out, st.SHA256, cfg.SHA256)
	}
	if err := os.Remove(statePath(cfg.Out)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("mget: %w", err)
	}
	return st, nil
}

// setup picks the reference identity from the probes, in source order,
// then opens the file (resuming when asked) and makes the scheduler.
func (d *dl) setup(ctx context.Context) error {
	var errs []error
	var ref *Identity
	for i, ch := range d.probes {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r := <-ch:
			if r.err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", d.subs[i].src.URL, r.err))
				continue
			}
			ref = &r.id
		}
		if ref != nil {
			break
		}
	}
	if ref == nil {
		return fmt.Errorf("mget: no source answered a range request: %w", errors.Join(errs...))
	}
	var got []int64
	flags := os.O_RDWR | os.O_CREATE
	if d.cfg.Continue {
		st, err := loadState(statePath(d.cfg.Out))
		switch {
		case errors.Is(err, os.ErrNotExist):
			flags |= os.O_TRUNC
		case err != nil:
			return err
		case st.Identity != *ref:
			return fmt.Errorf("mget: %s holds part of another version (%+v; the sources have %+v): remove it and %s", d.cfg.Out, st.Identity, *ref, statePath(d.cfg.Out))
		case st.Block != d.cfg.Block:
			d.cfg.Block = st.Block
			got = st.Got
		default:
			got = st.Got
		}
	} else {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(d.cfg.Out, flags, 0o644)
	if err != nil {
		return fmt.Errorf("mget: %w", err)
	}
	if err := f.Truncate(ref.Size); err != nil {
		f.Close()
		return fmt.Errorf("mget: %w", err)
	}
	d.mu.Lock()
	d.id = *ref
	d.file = f
	d.sched = NewSched(ref.Size, d.cfg.Block, got)
	d.resumed = d.sched.Received()
	// First ranges already asked (before the length was known) are their
	// sub-flows' blocks, as if Next had handed them out.
	for k, s := range d.subs {
		if s.spec != nil {
			s.specOwn = d.sched.Claim(k, s.spec.Block)
		}
	}
	d.mu.Unlock()
	close(d.ready)
	return nil
}

// wait samples rates, reports progress and saves the resume state until
// the download is done or every sub-flow has given up.
func (d *dl) wait(ctx context.Context, exited <-chan int) error {
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	lastSave := time.Now()
	alive := len(d.subs)
	for {
		d.mu.Lock()
		done, werr := d.sched.Done(), d.werr
		d.mu.Unlock()
		if werr != nil {
			return werr
		}
		if done {
			d.sample()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			if alive--; alive == 0 {
				d.mu.Lock()
				done := d.sched.Done()
				var errs []error
				for _, s := range d.subs {
					if s.dropped != nil {
						errs = append(errs, fmt.Errorf("%s via %s: %w", s.src.URL, s.src.Path, s.dropped))
					}
				}
				d.mu.Unlock()
				if done {
					return nil
				}
				return fmt.Errorf("mget: every source dropped: %w", errors.Join(errs...))
			}
		case <-tick.C:
			d.sample()
			if time.Since(lastSave) >= time.Second {
				lastSave = time.Now()
				if err := d.saveState(); err != nil {
					return err
				}
			}
		}
	}
}

// samples holds the rate time series (owned by the wait goroutine through
// dl.mu).
func (d *dl) sample() {
	d.mu.Lock()
	snap := Snapshot{Size: d.id.Size, Received: d.sched.Received(), Elapsed: time.Since(d.start)}
	sm := Sample{T: time.Since(d.start).Seconds()}
	for i, r := range d.sampleRatesLocked() {
		s := d.subs[i]
		sm.MBps = append(sm.MBps, r/1e6)
		snap.Names = append(snap.Names, s.u.Host+" "+s.src.Path)
		snap.MBps = append(snap.MBps, s.rate/1e6)
	}
	if d.electLocked() {
		d.notifyLocked()
	}
	d.samples = append(d.samples, sm)
	d.mu.Unlock()
	if d.cfg.Progress != nil {
		d.cfg.Progress(snap)
	}
}

// sampleRatesLocked takes one sampleEvery's rate sample of every sub-flow,
// updates their EWMA, and returns the samples (bytes/s). d.mu must be held.
func (d *dl) sampleRatesLocked() []float64 {
	out := make([]float64, len(d.subs))
	for i, s := range d.subs {
		delta := s.st.Bytes + s.st.DupBytes - s.lastBytes
		s.lastBytes += delta
		r := float64(delta) / sampleEvery.Seconds()
		if s.rate == 0 {
			s.rate = r // the first sample: an EWMA from 0 would hold the window back
		} else {
			s.rate = 0.7*s.rate + 0.3*r
		}
		s.last = r
		if r > 0 {
			s.active = s.rate
		}
		out[i] = r
	}
	return out
}

func (d *dl) stats() *Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	el := time.Since(d.start).Seconds()
	st := &Stats{File: d.cfg.Out, Identity: d.id, Resumed: d.resumed, Seconds: el, Samples: d.samples}
	for _, s := range d.subs {
		ss := s.st
		ss.RTTms = float64(s.srtt) / 1e6
		if d.leaders[s.src.Group] == s && !s.ledSince.IsZero() {
			ss.Led += time.Since(s.ledSince).Seconds()
		}
		ss.MBps = float64(ss.Bytes+ss.DupBytes) / el / 1e6
		st.Bytes += ss.Bytes + ss.DupBytes
		st.Subflows = append(st.Subflows, ss)
	}
	if el > 0 {
		st.MBps = float64(st.Bytes) / el / 1e6
	}
	return st
}

// notifyLocked wakes sub-flows waiting for ranges. d.mu must be held.
func (d *dl) notifyLocked() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// runSub is sub-flow i's loop: sessions with backoff until the download is
// done, the context ends or the source is dropped.
func (d *dl) runSub(ctx context.Context, i int) {
	s := d.subs[i]
	probed := false
	kind := sessFirst
	idle := 0 // sessions in a row that received nothing
	var backoff time.Duration
	defer func() {
		d.mu.Lock()
		s.exited = true
		d.notifyLocked()
		d.mu.Unlock()
	}()
	for ctx.Err() == nil {
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		d.mu.Lock()
		before := s.st.Bytes + s.st.DupBytes
		asked := s.st.Requests
		d.mu.Unlock()
		err := d.session(ctx, i, kind, &probed)
		if ctx.Err() != nil {
			return
		}
		kind = sessNext
		if err != nil {
			kind = sessRetry
		}
		d.mu.Lock()
		done := d.sched != nil && d.sched.Done() // nil until the reference is known
		switch {
		case s.st.Bytes+s.st.DupBytes > before:
			idle = 0
		case err == nil && s.st.Requests == asked:
			// A session that found no range to ask for (the others hold
			// the rest, or the download just finished) says nothing
			// about the source.
		default:
			idle++
		}
		d.mu.Unlock()
		if err == nil && done {
			return
		}
		if err == nil && idle < d.cfg.GiveUp {
			backoff = 0
			continue
		}
		if err == nil {
			err = fmt.Errorf("no byte in %d sessions", idle)
		}
		d.mu.Lock()
		s.st.Errors++
		s.st.LastErr = err.Error()
		if isTimeout(err) {
			s.st.Stalls++
		}
		if idle >= d.cfg.GiveUp {
			err = fmt.Errorf("%w: %d sessions in a row without a byte; last: %v", ErrGaveUp, idle, err)
		}
		if errors.Is(err, ErrBadSource) || errors.Is(err, ErrMismatch) || errors.Is(err, ErrGaveUp) {
			s.st.Disabled = err.Error()
			s.dropped = err
			d.mu.Unlock()
			d.log.Warn("mget: source dropped", "url", s.src.URL, "path", s.src.Path, "err", err)
			return
		}
		d.mu.Unlock()
		d.log.Debug("mget: sub-flow retry", "url", s.src.URL, "path", s.src.Path, "err", err, "backoff", backoff)
		backoff = min(max(2*backoff, 250*time.Millisecond), 4*time.Second)
	}
}

// ErrGaveUp marks a source that delivered nothing for Config.GiveUp
// sessions in a row (refusing, resetting or silent).
var ErrGaveUp = errors.New("source gave nothing")

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// inflight is one pipelined request.
type inflight struct {
	sp   Span
	sent time.Time
	lone bool // sent on an empty pipeline: its header time is an RTT sample
	// own: the scheduler counts the request as sp.Block's (always, except
	// a first range whose block the scheduler could not give it, see
	// Sched.Claim: its bytes are read and dropped).
	own bool
}

// sessKind says how a session of a sub-flow starts.
type sessKind int

const (
	// sessFirst is a sub-flow's first session. Before the reference
	// identity is known (Sched not made yet) it asks at once for a real
	// range, block i for sub-flow i, and its first response tells the
	// identity: no one-byte probe, no extra round trip before the first
	// range (the block is the sub-flow's as soon as the scheduler is made,
	// see setup). Once the reference is known it takes ranges from the
	// scheduler, and its first response is checked as every response is.
	// A coupled sub-flow (Source.Group) or a resumed download (Continue)
	// probes first, as sessRetry does.
	sessFirst sessKind = iota
	// sessNext follows a session that ended cleanly (a source that closes
	// its connection after each response): ranges at once.
	sessNext
	// sessRetry follows a stall or an error: a one-byte probe first, which
	// may wait long, so a silent source holds no range while it is silent
	// and answers the moment it comes back.
	sessRetry
)

// sconn is one session's connection; stop unhooks its closing on ctx.
type sconn struct {
	c    net.Conn
	br   *bufio.Reader
	stop func() bool
}

func (d *dl) open(ctx context.Context, s *sub) (*sconn, error) {
	dctx, cancel := context.WithTimeout(ctx, 2*d.cfg.Stall+5*time.Second)
	c, err := d.dial(dctx, s)
	cancel()
	if err != nil {
		return nil, err
	}
	return &sconn{c: c, br: bufio.NewReaderSize(c, 64<<10), stop: context.AfterFunc(ctx, func() { c.Close() })}, nil
}

func (c *sconn) close() {
	c.stop()
	c.c.Close()
}

// session runs one connection of sub-flow i: its start (see sessKind),
// then pipelined range requests under the window until an error or the
// end. No byte of a response is written before the response is checked
// against the reference identity; every range it holds is released before
// it returns.
func (d *dl) session(ctx context.Context, i int, kind sessKind, probed *bool) (err error) {
	s := d.subs[i]
	c, err := d.open(ctx, s)
	if err != nil {
		return d.probeFailed(i, probed, err)
	}
	var q []inflight
	var head *http.Response // q[0]'s response when its header was read and checked before the loop
	var headUpto int64      // and the end of the bytes it carries
	defer func() {
		if c != nil {
			c.close()
		}
		d.mu.Lock()
		notify := false
		if s.live {
			s.live = false
			notify = d.electLocked()
		}
		if s.specOwn {
			d.sched.Release(i, s.spec.Block)
			notify = true
		}
		s.spec, s.specOwn = nil, false
		for _, r := range q {
			if r.own {
				d.sched.Release(i, r.sp.Block)
				notify = true
			}
		}
		if notify {
			d.notifyLocked()
		}
		d.mu.Unlock()
	}()
	// reopen replaces the connection after a response that closed it.
	reopen := func() error {
		c.close()
		c, err = d.open(ctx, s)
		return err
	}
	// A fresh path's first answer may wait for a retransmission at the
	// initial RTO: it gets at least 2 s even when Stall, a mid-transfer
	// silence, is shorter.
	first := max(d.cfg.Stall, 2*time.Second)

	d.mu.Lock()
	ready := d.sched != nil
	spec := kind == sessFirst && !ready && !d.cfg.Continue && s.src.Group == ""
	if spec {
		off := int64(i) * d.cfg.Block
		s.spec = &Span{Block: i, Off: off, End: off + d.cfg.Block}
		s.st.Requests++
	}
	d.mu.Unlock()
	probe := kind == sessRetry || (kind == sessFirst && !ready && !spec)
	if kind != sessRetry && ready {
		*probed = true // the reference is known: nobody waits for this sub-flow's identity
	}

	if spec {
		// The first range, asked before the object's length is known.
		sp := *s.spec
		t0 := time.Now()
		c.c.SetDeadline(t0.Add(first))
		if _, err := c.c.Write(d.request(s, sp.Off, sp.End, Identity{})); err != nil {
			return d.probeFailed(i, probed, err)
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			return d.probeFailed(i, probed, err)
		}
		if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
			// The object ends before this block (or is empty): give the
			// block up and ask for the identity with the one-byte probe.
			_, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil {
				return d.probeFailed(i, probed, err)
			}
			d.mu.Lock()
			if s.specOwn {
				d.sched.Release(i, s.spec.Block)
				d.notifyLocked()
			}
			s.spec, s.specOwn = nil, false
			d.mu.Unlock()
			if resp.Close {
				if err := reopen(); err != nil {
					return d.probeFailed(i, probed, err)
				}
			}
			probe = true
		} else {
			upto, id, err := checkPart(resp.StatusCode, resp.Header, sp.Off, sp.End, Identity{Size: -1})
			if err != nil {
				// Not drained (a 200 may carry the whole object): the
				// connection closes.
				return d.probeFailed(i, probed, err)
			}
			done, err := d.identified(ctx, i, probed, id, time.Since(t0), func() {
				// setup made block i this request's (specOwn) unless the
				// block does not exist or is done.
				q = []inflight{{sp: sp, sent: t0, own: s.specOwn}}
				s.spec, s.specOwn = nil, false
			})
			if done || err != nil {
				return err
			}
			head, headUpto = resp, upto
		}
	}

	if probe {
		// One byte tells the identity and the RTT. A re-probe (after a
		// stall or error) holds no range, so it may wait long: a source
		// that went silent answers it the moment it comes back, instead
		// of at the next retry. A first probe waits less (the reference
		// identity may wait for it).
		wait := first
		if kind == sessRetry {
			wait = max(5*d.cfg.Stall, 10*time.Second)
		}
		t0 := time.Now()
		c.c.SetDeadline(t0.Add(wait))
		if _, err := c.c.Write(d.request(s, 0, 1, Identity{})); err != nil {
			return d.probeFailed(i, probed, err)
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			return d.probeFailed(i, probed, err)
		}
		_, id, err := checkPart(resp.StatusCode, resp.Header, 0, 1, Identity{Size: -1})
		if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && resp.Header.Get("Content-Range") == "bytes */0" {
			id, err = identityOf(resp.Header, 0), nil // an empty object has no byte 0
		}
		if err != nil {
			return d.probeFailed(i, probed, err) // not drained: a 200 may carry the whole object
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return d.probeFailed(i, probed, err)
		}
		if done, err := d.identified(ctx, i, probed, id, time.Since(t0), nil); done || err != nil {
			return err
		}
		if resp.Close {
			// The source closes after each response: open the range
			// connection without another probe.
			if err := reopen(); err != nil {
				return err
			}
		}
	}

	d.mu.Lock()
	ref := d.id
	s.live = true
	// A sub-flow back from a stall or error (a source that was silent)
	// starts from the rate it had when it last received, not from its
	// EWMA decayed by the silence: it takes its share back at once.
	s.warm, s.warmUntil = s.active, time.Now().Add(warmFor)
	if d.electLocked() {
		d.notifyLocked()
	}
	d.mu.Unlock()
	// The first answer on a connection that carried nothing yet gets the
	// fresh path's wait.
	fresh := !spec && !probe
	buf := make([]byte, 64<<10)
	for {
		// Fill the window.
		d.mu.Lock()
		var reqs []byte
		var queued int64
		for _, r := range q {
			queued += r.sp.Len()
		}
		win := d.windowLocked(s)
		empty := len(q) == 0
		for queued < win {
			sp, ok := d.sched.Next(i, func(o int) bool { return s.rate > d.subs[o].rate })
			if !ok {
				break
			}
			q = append(q, inflight{sp: sp, sent: time.Now(), lone: empty && len(q) == 0, own: true})
			queued += sp.Len()
			s.st.Requests++
			ifRange := d.id
			if !s.verified {
				ifRange = Identity{} // the first answer shows the source's validators
			}
			reqs = append(reqs, d.request(s, sp.Off, sp.End, ifRange)...)
		}
		done := d.sched.Done()
		changed := d.changed
		d.mu.Unlock()
		if len(q) == 0 {
			if done {
				return nil
			}
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
				continue
			}
		}
		if len(reqs) > 0 {
			c.c.SetWriteDeadline(time.Now().Add(d.cfg.Stall))
			if _, err := c.c.Write(reqs); err != nil {
				return err
			}
		}
		// Read the oldest response.
		r := q[0]
		resp, upto := head, headUpto
		head = nil
		if resp == nil {
			wait := d.cfg.Stall
			if fresh {
				wait, fresh = first, false
			}
			c.c.SetReadDeadline(time.Now().Add(wait))
			resp, err = http.ReadResponse(c.br, nil)
			if err != nil {
				return err
			}
			upto, _, err = checkPart(resp.StatusCode, resp.Header, r.sp.Off, r.sp.End, ref)
			if err != nil {
				return err // not drained: the connection closes
			}
			d.mu.Lock()
			s.verified = true
			d.mu.Unlock()
			if r.lone {
				rtt := time.Since(r.sent)
				d.mu.Lock()
				if s.srtt == 0 {
					s.srtt = rtt
				} else {
					s.srtt = (7*s.srtt + rtt) / 8
				}
				d.mu.Unlock()
			}
		}
		pos := r.sp.Off
		for pos < upto {
			c.c.SetReadDeadline(time.Now().Add(d.cfg.Stall))
			n, rerr := resp.Body.Read(buf[:min(int64(len(buf)), upto-pos)])
			if n > 0 && r.own {
				if _, werr := d.file.WriteAt(buf[:n], pos); werr != nil {
					d.mu.Lock()
					d.werr = fmt.Errorf("mget: write %s: %w", d.cfg.Out, werr)
					d.mu.Unlock()
					return werr
				}
				d.mu.Lock()
				if r.sp.Dup {
					s.st.DupBytes += int64(n)
				} else {
					s.st.Bytes += int64(n)
				}
				d.sched.Progress(r.sp, pos+int64(n))
				d.mu.Unlock()
			}
			pos += int64(n)
			if rerr == io.EOF && pos < upto {
				rerr = io.ErrUnexpectedEOF
			}
			if rerr != nil && rerr != io.EOF {
				resp.Body.Close()
				return fmt.Errorf("range %d-%d: %w", r.sp.Off, r.sp.End-1, rerr)
			}
			if rerr == io.EOF {
				break
			}
		}
		resp.Body.Close()
		d.mu.Lock()
		if r.own {
			d.sched.Release(i, r.sp.Block)
		}
		q = q[1:]
		d.notifyLocked()
		d.mu.Unlock()
		if resp.Close {
			return nil
		}
	}
}

// identified reports source i's identity from its first answer (once),
// waits until the reference identity is known, records rtt as an RTT
// sample of the sub-flow and runs locked (if not nil) in the same critical
// section, then checks the identity against the reference: a source that
// disagrees fails with sameObject's error. done is true when ctx ended
// first (the session ends without an error).
func (d *dl) identified(ctx context.Context, i int, probed *bool, id Identity, rtt time.Duration, locked func()) (done bool, err error) {
	s := d.subs[i]
	if !*probed {
		*probed = true
		d.probes[i] <- probeResult{id: id}
	}
	select {
	case <-ctx.Done():
		return true, nil
	case <-d.ready:
	}
	d.mu.Lock()
	ref := d.id
	if s.srtt == 0 || rtt < s.srtt {
		s.srtt = rtt
	}
	if locked != nil {
		locked()
	}
	d.mu.Unlock()
	if err := sameObject(ref, id); err != nil {
		return false, err
	}
	d.mu.Lock()
	s.verified = true
	d.mu.Unlock()
	return false, nil
}

// probeFailed reports a failed first probe (or first range) and returns
// err.
func (d *dl) probeFailed(i int, probed *bool, err error) error {
	if !*probed {
		*probed = true
		d.probes[i] <- probeResult{err: err}
	}
	return err
}

// minWindowTime is the least time of a sub-flow's rate its window holds.
const minWindowTime = 250 * time.Millisecond

// warmFor is how long a new session's window uses the rate the sub-flow
// had when it last received (if higher than what it measures now): about
// ten samples, after which the EWMA holds the new session's rate.
const warmFor = time.Second

// windowLocked returns sub-flow s's window: what it may have requested and
// not received, grown with its measured rate x RTT (twice, so the pipe
// stays full while the next request crosses), at least one range. The rate
// is the larger of the EWMA and the last sample (the window follows a rise
// within one sample, e.g. when another source goes silent and this one's
// TCP connection takes the freed capacity, and a fall slowly), and of the
// rate before a stall while the session is young (warmFor).
func (d *dl) windowLocked(s *sub) int64 {
	if !d.mayRequestLocked(s) {
		return 0
	}
	rate := max(s.rate, s.last)
	if time.Now().Before(s.warmUntil) {
		rate = max(rate, s.warm)
	}
	// The RTT measured on an empty pipeline misses the queue a competing
	// flow keeps at the bottleneck: at least minWindowTime of the rate.
	w := int64(rate*max(2*s.srtt.Seconds(), minWindowTime.Seconds())) + d.cfg.Block
	if rate == 0 {
		w = 2 * d.cfg.Block
	}
	return min(max(w, d.cfg.Block), d.cfg.MaxWindow)
}

// request returns an HTTP/1.1 GET of bytes [off, end) of s's URL, with an
// If-Range on the reference identity when it has a validator.
func (d *dl) request(s *sub, off, end int64, id Identity) []byte {
	var b bytes.Buffer
	b.WriteString("GET " + s.u.RequestURI() + " HTTP/1.1\r\nHost: " + s.u.Host + "\r\nUser-Agent: mosto-get\r\n")
	b.WriteString("Range: bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(end-1, 10) + "\r\n")
	switch {
	case strong(id.ETag):
		b.WriteString("If-Range: " + id.ETag + "\r\n")
	case id.Modified != "":
		b.WriteString("If-Range: " + id.Modified + "\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

func (d *dl) dial(ctx context.Context, s *sub) (net.Conn, error) {
	host := s.u.Host
	if s.u.Port() == "" {
		port := "80"
		if s.u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(s.u.Hostname(), port)
	}
	dial := s.src.Dial
	if dial == nil {
		var dl net.Dialer
		dial = dl.DialContext
	}
	conn, err := dial(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if s.u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: s.u.Hostname(), NextProtos: []string{"http/1.1"}})
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		return tc, nil
	}
	return conn, nil
}

func hashFile(f *os.File) ([]byte, error) {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
