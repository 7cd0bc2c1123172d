package relay

// Stage: entry (size hint). The InP learns the transfer size of each
// service or destination from the flows it completed, and uses a robust
// estimate as the size hint that picks the chain's rounds class.

import (
	"bytes"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mosto-net/mosto/internal/metrics"
)

// flowBytes is the downstream byte counter of one flow being learned: it
// adds to the role's counter and keeps the flow's own total.
type flowBytes struct {
	*metrics.Counter
	n atomic.Int64
}

func (f *flowBytes) Add(v float64) {
	f.Counter.Add(v)
	f.n.Add(int64(v))
}

// SizeLearnConfig configures size learning at the InP (seed 001, "future
// work": sizes learned per destination instead of a static hint). The zero
// value learns with the defaults; MinFlows -1 turns it off.
type SizeLearnConfig struct {
	// MinFlows is the number of completed flows of a key before its
	// estimate replaces the listener's static size hint; 0:
	// DefaultSizeMinFlows; -1: off (the static hint only).
	MinFlows int `yaml:"min_flows"`
	// Window is the number of most recent flows per key the estimate is
	// taken over; 0: DefaultSizeWindow.
	Window int `yaml:"window"`
	// MaxKeys bounds the keys remembered; past it the least recently
	// updated key is forgotten; 0: DefaultSizeMaxKeys.
	MaxKeys int `yaml:"max_keys"`
}

// Size learning defaults and bounds.
const (
	DefaultSizeMinFlows = 5
	DefaultSizeWindow   = 31
	DefaultSizeMaxKeys  = 4096
	MaxSizeWindow       = 1024
	MaxSizeKeys         = 1 << 20
)

func (c SizeLearnConfig) validate(bad func(string, ...any)) {
	if c.MinFlows < -1 || c.MinFlows > MaxSizeWindow {
		bad("size_learning.min_flows: %d, want -1 (off), 0 (default %d) or 1-%d", c.MinFlows, DefaultSizeMinFlows, MaxSizeWindow)
	}
	if c.Window < 0 || c.Window > MaxSizeWindow {
		bad("size_learning.window: %d, want 0 (default %d) or 1-%d", c.Window, DefaultSizeWindow, MaxSizeWindow)
	}
	if c.MaxKeys < 0 || c.MaxKeys > MaxSizeKeys {
		bad("size_learning.max_keys: %d, want 0 (default %d) or 1-%d", c.MaxKeys, DefaultSizeMaxKeys, MaxSizeKeys)
	}
	if c.MinFlows > 0 && c.Window > 0 && c.MinFlows > c.Window {
		bad("size_learning.min_flows %d exceeds window %d: the estimate could never be used", c.MinFlows, c.Window)
	}
}

// sizeLearner holds the recent flow sizes per key. Safe for concurrent use;
// a nil *sizeLearner learns nothing and returns the static hint.
type sizeLearner struct {
	minFlows, window, maxKeys int

	mu   sync.Mutex
	keys map[string]*sizeRing
	tick uint64 // update counter, for least-recently-updated eviction
}

// sizeRing is the last window sizes of one key.
type sizeRing struct {
	v    []int64 // ring of up to window sizes
	next int     // where the next size goes once v is full
	seen uint64  // tick of the last update
	est  int64   // the estimate over v, when !dirty
	// dirty: v changed since est was computed. The median is computed
	// when a lookup asks for it, not per completed flow (a relay with no
	// table never asks).
	dirty bool
}

// newSizeLearner returns the learner of c, or nil when c turns it off.
func newSizeLearner(c SizeLearnConfig) *sizeLearner {
	if c.MinFlows < 0 {
		return nil
	}
	l := &sizeLearner{minFlows: c.MinFlows, window: c.Window, maxKeys: c.MaxKeys, keys: make(map[string]*sizeRing)}
	if l.minFlows == 0 {
		l.minFlows = DefaultSizeMinFlows
	}
	if l.window == 0 {
		l.window = DefaultSizeWindow
	}
	if l.maxKeys == 0 {
		l.maxKeys = DefaultSizeMaxKeys
	}
	l.minFlows = min(l.minFlows, l.window)
	return l
}

// sizeKeys are the keys a flow's size is learned under: base is the
// service or destination, path the same with the HTTP path prefix when the
// flow's first bytes showed one ("" otherwise).
type sizeKeys struct{ base, path string }

// hint returns the size hint of a flow: the estimate of its path key once
// that key saw minFlows flows, else of its base key, else static.
func (l *sizeLearner) hint(k sizeKeys, static int64) int64 {
	if l == nil {
		return static
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, key := range [2]string{k.path, k.base} {
		if r := l.keys[key]; key != "" && r != nil && len(r.v) >= l.minFlows {
			if r.dirty {
				r.est, r.dirty = medianSize(r.v), false
			}
			return r.est
		}
	}
	return static
}

// observe records a completed flow that delivered down bytes to the
// client under both its keys. Flows that delivered nothing (refused, reset
// before the response) say nothing about the object's size and are not
// recorded.
func (l *sizeLearner) observe(k sizeKeys, down int64) {
	if l == nil || down <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, key := range [2]string{k.path, k.base} {
		if key != "" {
			l.add(key, down)
		}
	}
}

func (l *sizeLearner) add(key string, down int64) {
	l.tick++
	r := l.keys[key]
	if r == nil {
		if len(l.keys) >= l.maxKeys {
			l.evict()
		}
		r = &sizeRing{v: make([]int64, 0, min(l.window, 8))}
		l.keys[key] = r
	}
	if len(r.v) < l.window {
		r.v = append(r.v, down)
	} else {
		r.v[r.next] = down
		r.next = (r.next + 1) % l.window
	}
	r.seen = l.tick
	r.dirty = true
}

// evict forgets the least recently updated key (O(keys), once per new key
// past the bound).
func (l *sizeLearner) evict() {
	var oldest string
	var at uint64
	for k, r := range l.keys {
		if oldest == "" || r.seen < at {
			oldest, at = k, r.seen
		}
	}
	delete(l.keys, oldest)
}

// medianSize is the median of v (the lower middle for an even count: a
// size hint that errs small picks the chain of fewer rounds).
func medianSize(v []int64) int64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// maxPathKey bounds the HTTP path prefix kept in a key.
const maxPathKey = 64

// keysOf returns the keys a flow's size is learned under: the service's
// name for a service listener, else the target (host:port); and, when the
// client's first bytes (early) start with an HTTP request line, the same
// plus the first segment of its path ("/video/a.mp4" -> "/video"), so the
// objects behind one destination that differ by path prefix are learned
// apart. The event loops choose the chain before reading any byte, so
// their flows have the base key only.
func keysOf(service string, t Target, early []byte) sizeKeys {
	k := sizeKeys{base: "dst " + t.String()}
	if service != "" {
		k.base = "svc " + service
	}
	if p := httpPathPrefix(early); p != "" {
		k.path = k.base + " " + p
	}
	return k
}

// httpPathPrefix returns the first path segment of an HTTP/1 request line
// at the start of b ("GET /a/b?x HTTP/1.1" -> "/a"), or "" if b does not
// start with one.
func httpPathPrefix(b []byte) string {
	sp := bytes.IndexByte(b, ' ')
	if sp < 3 || sp > 10 {
		return ""
	}
	for _, c := range b[:sp] {
		if c < 'A' || c > 'Z' {
			return ""
		}
	}
	rest := b[sp+1:]
	if len(rest) == 0 || rest[0] != '/' {
		return ""
	}
	end := 1
	for end < len(rest) && end < maxPathKey {
		c := rest[end]
		if c == '/' || c == '?' || c == '#' || c == ' ' || c < 0x21 || c > 0x7e {
			break
		}
		end++
	}
	if end < len(rest) && rest[end] != '/' && rest[end] != '?' && rest[end] != '#' && rest[end] != ' ' {
		return "" // a control byte, non-ASCII or an over-long segment: not a request line we key on
	}
	if end == len(rest) && !bytes.Contains(b, []byte(" HTTP/")) {
		return "" // cut short: the segment may go on
	}
	return string(rest[:end])
}
