package relay

// Stage: entry (size hint). The InP learns the transfer size of each
// service or destination from the flows it completed, and uses a robust
// estimate as the size hint that picks the chain's rounds class.

import (
	"bytes"
	"container/list"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	// MinFlows is the number of completed flows of a key (within MaxAge)
	// before its estimate replaces the listener's static size hint; 0:
	// DefaultSizeMinFlows; -1: off (the static hint only).
	MinFlows int `yaml:"min_flows"`
	// Window is the number of most recent flows per key the estimate is
	// taken over; 0: DefaultSizeWindow.
	Window int `yaml:"window"`
	// MaxKeys bounds the keys remembered; past it the least recently used
	// key is forgotten, keys that have not reached MinFlows first (see
	// sizeLearner); 0: DefaultSizeMaxKeys.
	MaxKeys int `yaml:"max_keys"`
	// Quantile is the quantile of the window's sizes used as the hint,
	// in [0.5, 1]; 0: DefaultSizeQuantile. Above the median because the
	// planner's cost of a size taken too small grows with the rounds the
	// transfer really takes, while a size taken too large costs at most
	// a bounded extra sum of RTTs (docs/size-learning.md).
	Quantile float64 `yaml:"quantile"`
	// MaxAge is the decay: sizes older than this no longer count; a key
	// left with fewer than MinFlows recent sizes falls back to the static
	// hint; 0: DefaultSizeMaxAge.
	MaxAge Duration `yaml:"max_age"`
}

// Size learning defaults and bounds.
const (
	DefaultSizeMinFlows = 5
	DefaultSizeWindow   = 31
	DefaultSizeMaxKeys  = 4096
	DefaultSizeQuantile = 0.75
	DefaultSizeMaxAge   = time.Hour
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
	if c.MaxKeys < 0 || c.MaxKeys == 1 || c.MaxKeys > MaxSizeKeys {
		bad("size_learning.max_keys: %d, want 0 (default %d) or 2-%d", c.MaxKeys, DefaultSizeMaxKeys, MaxSizeKeys)
	}
	if c.Quantile != 0 && !(c.Quantile >= 0.5 && c.Quantile <= 1) {
		bad("size_learning.quantile: %v, want 0 (default %v) or 0.5-1", c.Quantile, DefaultSizeQuantile)
	}
	if c.MaxAge < 0 {
		bad("size_learning.max_age: %v, want >= 0", time.Duration(c.MaxAge))
	}
	if c.MinFlows > 0 && c.Window > 0 && c.MinFlows > c.Window {
		bad("size_learning.min_flows %d exceeds window %d: the estimate could never be used", c.MinFlows, c.Window)
	}
}

// hintSource is where a lookup's size hint came from; its value is the
// metrics label.
type hintSource string

// Size hint sources.
const (
	hintPath    hintSource = "learned_path" // the key with the HTTP path prefix
	hintLearned hintSource = "learned"      // the service or destination key
	hintStatic  hintSource = "static"       // the listener's size
)

// sizeLearner holds the recent flow sizes per key. Safe for concurrent use;
// a nil *sizeLearner learns nothing and returns the static hint.
//
// Memory is bounded by maxKeys keys of at most window sizes each. The keys
// live in two least-recently-used lists (a segmented LRU): a new key
// starts on probation, whose length is capped at a quarter of maxKeys,
// and moves to the protected list once it has minFlows sizes (the point
// where it starts answering lookups). A client that opens flows to many
// destinations once each only churns the probation list: the keys that
// answer lookups stay until keys that also reached minFlows push them out.
type sizeLearner struct {
	minFlows, window int
	quantile         float64
	maxAge           time.Duration
	probCap, protCap int
	now              func() time.Time

	mu        sync.Mutex
	keys      map[string]*list.Element // of *sizeKey, in probation or protected
	probation list.List                // front: most recently used
	protected list.List
	evicted   uint64
}

// sizeKey is one key's recent sizes, oldest first (a ring of window).
type sizeKey struct {
	name      string
	v         []sizeSample
	head      int // index of the oldest sample once v is full
	protected bool
	est       int64 // the estimate over v, when !dirty
	// dirty: v changed since est was computed. The estimate is computed
	// when a lookup asks for it, not per completed flow (a relay with no
	// table never asks).
	dirty bool
}

type sizeSample struct {
	bytes int64
	at    int64 // unix nanoseconds
}

// newSizeLearner returns the learner of c, or nil when c turns it off.
func newSizeLearner(c SizeLearnConfig) *sizeLearner {
	if c.MinFlows < 0 {
		return nil
	}
	l := &sizeLearner{minFlows: c.MinFlows, window: c.Window, quantile: c.Quantile, maxAge: time.Duration(c.MaxAge),
		now: time.Now, keys: make(map[string]*list.Element)}
	if l.minFlows == 0 {
		l.minFlows = DefaultSizeMinFlows
	}
	if l.window == 0 {
		l.window = DefaultSizeWindow
	}
	if l.quantile == 0 {
		l.quantile = DefaultSizeQuantile
	}
	if l.maxAge == 0 {
		l.maxAge = DefaultSizeMaxAge
	}
	maxKeys := c.MaxKeys
	if maxKeys == 0 {
		maxKeys = DefaultSizeMaxKeys
	}
	maxKeys = max(maxKeys, 2)
	l.probCap = max(1, maxKeys/4)
	l.protCap = maxKeys - l.probCap
	l.minFlows = min(l.minFlows, l.window)
	return l
}

// sizeKeys are the keys a flow's size is learned under: base is the
// service or destination, path the same with the HTTP path prefix when the
// flow's first bytes showed one ("" otherwise).
type sizeKeys struct{ base, path string }

// hint returns the size hint of a flow and where it came from: the
// estimate of its path key once that key has minFlows sizes younger than
// maxAge, else of its base key, else static.
func (l *sizeLearner) hint(k sizeKeys, static int64) (int64, hintSource) {
	if l == nil {
		return static, hintStatic
	}
	now := l.now().UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, key := range [2]string{k.path, k.base} {
		if key == "" {
			continue
		}
		e := l.keys[key]
		if e == nil {
			continue
		}
		sk := e.Value.(*sizeKey)
		l.expire(sk, now)
		if len(sk.v) < l.minFlows {
			continue
		}
		l.listOf(sk).MoveToFront(e)
		if sk.dirty {
			sk.est, sk.dirty = quantileSize(sk.v, l.quantile), false
		}
		if i == 0 {
			return sk.est, hintPath
		}
		return sk.est, hintLearned
	}
	return static, hintStatic
}

// observe records a completed flow that delivered down bytes to the
// client under both its keys. Flows that delivered nothing (refused, reset
// before the response) say nothing about the object's size and are not
// recorded.
func (l *sizeLearner) observe(k sizeKeys, down int64) {
	if l == nil || down <= 0 {
		return
	}
	now := l.now().UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, key := range [2]string{k.path, k.base} {
		if key != "" {
			l.add(key, down, now)
		}
	}
}

func (l *sizeLearner) add(key string, down, now int64) {
	e := l.keys[key]
	if e == nil {
		if l.probation.Len() >= l.probCap {
			l.evict(&l.probation)
		}
		e = l.probation.PushFront(&sizeKey{name: key, v: make([]sizeSample, 0, min(l.window, 8))})
		l.keys[key] = e
	}
	sk := e.Value.(*sizeKey)
	l.expire(sk, now)
	s := sizeSample{down, now}
	if len(sk.v) < l.window {
		sk.v = append(sk.v, s)
	} else {
		sk.v[sk.head] = s
		sk.head = (sk.head + 1) % l.window
	}
	sk.dirty = true
	if !sk.protected && len(sk.v) >= l.minFlows {
		l.probation.Remove(e)
		if l.protected.Len() >= l.protCap {
			l.evict(&l.protected)
		}
		sk.protected = true
		e = l.protected.PushFront(sk)
		l.keys[key] = e
		return
	}
	l.listOf(sk).MoveToFront(e)
}

// expire drops the sizes of sk older than maxAge (the decay).
func (l *sizeLearner) expire(sk *sizeKey, now int64) {
	cut := now - int64(l.maxAge)
	n := 0
	for n < len(sk.v) && sk.v[(sk.head+n)%len(sk.v)].at < cut {
		n++
	}
	if n == 0 {
		return
	}
	// Rebuild oldest first without the expired sizes.
	kept := make([]sizeSample, 0, cap(sk.v))
	for i := n; i < len(sk.v); i++ {
		kept = append(kept, sk.v[(sk.head+i)%len(sk.v)])
	}
	sk.v, sk.head, sk.dirty = kept, 0, true
}

func (l *sizeLearner) listOf(sk *sizeKey) *list.List {
	if sk.protected {
		return &l.protected
	}
	return &l.probation
}

// evict forgets the least recently used key of ls.
func (l *sizeLearner) evict(ls *list.List) {
	e := ls.Back()
	if e == nil {
		return
	}
	ls.Remove(e)
	delete(l.keys, e.Value.(*sizeKey).name)
	l.evicted++
}

// stats returns the keys remembered and the keys forgotten so far.
func (l *sizeLearner) stats() (keys int, evicted uint64) {
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys), l.evicted
}

// quantileSize is the q-quantile of v by nearest rank (the ceil(q n)-th
// smallest; q 0.5 is the lower middle of an even count).
func quantileSize(v []sizeSample, q float64) int64 {
	s := make([]int64, len(v))
	for i, x := range v {
		s[i] = x.bytes
	}
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
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
