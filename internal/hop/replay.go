package hop

import (
	"container/heap"
	"fmt"
	"sync"
	"time"
)

// ReplayCache remembers the (FlowID, Hop) pairs of accepted headers for as
// long as Read could accept them again (issue time + window), in bounded
// memory. When full it forgets the entry closest to expiring (counted:
// Evicted). A header issued before the cache was made is refused: the
// cache of the process before a restart is gone, and it may have accepted
// that header already. It is safe for concurrent use.
type ReplayCache struct {
	window time.Duration
	max    int
	now    func() time.Time
	start  time.Time // headers issued before are refused

	mu      sync.Mutex
	entries map[replayKey]*replayEntry
	byExp   expHeap
	evicted uint64
	refused uint64
}

type replayKey struct {
	flow [16]byte
	hop  int
}

type replayEntry struct {
	key replayKey
	exp time.Time
	idx int
}

// NewReplayCache returns a cache that remembers each header for window past
// its issue time (use Read's maxSkew) and holds at most capacity entries
// (capacity < 1 means 1<<16). Size capacity above the accepted-header rate
// times 2*window, or an evicted pair could be replayed.
func NewReplayCache(window time.Duration, capacity int) *ReplayCache {
	if window <= 0 {
		window = DefaultMaxSkew
	}
	if capacity < 1 {
		capacity = 1 << 16
	}
	return &ReplayCache{window: window, max: capacity, now: time.Now, start: time.Now(), entries: make(map[replayKey]*replayEntry)}
}

// Seen records h and reports whether its (FlowID, Hop) was already recorded
// and has not expired, or h was issued before the cache was made: true
// means h is (or may be) a replay.
func (c *ReplayCache) Seen(h *Header) bool {
	_, seen := c.seen(h)
	return seen
}

// seen is Seen, also saying whether h predates the cache.
func (c *ReplayCache) seen(h *Header) (early, seen bool) {
	k := replayKey{flow: h.FlowID, hop: h.Hop}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.Time.Before(c.start) {
		c.refused++
		return true, true
	}
	for len(c.byExp) > 0 && !c.byExp[0].exp.After(now) {
		e := heap.Pop(&c.byExp).(*replayEntry)
		delete(c.entries, e.key)
	}
	if _, ok := c.entries[k]; ok {
		c.refused++
		return false, true
	}
	exp := h.Time.Add(c.window)
	if !exp.After(now) {
		// Read refuses it as expired anyway; nothing to remember.
		return false, false
	}
	if len(c.byExp) >= c.max {
		e := heap.Pop(&c.byExp).(*replayEntry)
		delete(c.entries, e.key)
		c.evicted++
	}
	e := &replayEntry{key: k, exp: exp}
	heap.Push(&c.byExp, e)
	c.entries[k] = e
	return false, false
}

// Check is Seen as an error: it wraps ErrReplay for a replay (or a header
// issued before the cache was made), else nil.
func (c *ReplayCache) Check(h *Header) error {
	switch early, seen := c.seen(h); {
	case early:
		return fmt.Errorf("%w: flow %x hop %d issued at %s, before this process started (%s)", ErrReplay, h.FlowID, h.Hop,
			h.Time.UTC().Format(time.RFC3339Nano), c.start.UTC().Format(time.RFC3339Nano))
	case seen:
		return fmt.Errorf("%w: flow %x hop %d", ErrReplay, h.FlowID, h.Hop)
	}
	return nil
}

// Refused returns how many headers Seen or Check refused (replays and
// headers issued before the cache was made).
func (c *ReplayCache) Refused() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

// Len returns the number of remembered pairs.
func (c *ReplayCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Evicted returns how many unexpired pairs were forgotten because the cache
// was full.
func (c *ReplayCache) Evicted() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.evicted
}

type expHeap []*replayEntry

func (h expHeap) Len() int           { return len(h) }
func (h expHeap) Less(i, j int) bool { return h[i].exp.Before(h[j].exp) }
func (h expHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *expHeap) Push(x any) {
	e := x.(*replayEntry)
	e.idx = len(*h)
	*h = append(*h, e)
}
func (h *expHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
