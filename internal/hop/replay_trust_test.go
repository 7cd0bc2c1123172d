package hop

import (
	"errors"
	"testing"
	"time"
)

// TestReplayCacheRefusesHeadersFromBeforeStart (issue 13 item 8): a cache
// is empty after a restart, so a header issued before it was made may be a
// replay of one the previous process accepted: it is refused. Refusals
// and evictions are counted.
func TestReplayCacheRefusesHeadersFromBeforeStart(t *testing.T) {
	start := time.Date(2026, 11, 25, 1, 0, 0, 0, time.UTC)
	now := start
	c := NewReplayCache(time.Minute, 2)
	c.now = func() time.Time { return now }
	c.start = start
	old := &Header{FlowID: [16]byte{1}, Hop: 1, Time: start.Add(-time.Second)}
	if err := c.Check(old); !errors.Is(err, ErrReplay) {
		t.Errorf("header issued 1 s before the cache was made: %v; want ErrReplay", err)
	}
	now = start.Add(time.Second)
	fresh := &Header{FlowID: [16]byte{2}, Hop: 1, Time: now}
	if err := c.Check(fresh); err != nil {
		t.Fatalf("fresh header: %v", err)
	}
	if err := c.Check(fresh); !errors.Is(err, ErrReplay) {
		t.Errorf("replayed header: %v; want ErrReplay", err)
	}
	if got := c.Refused(); got != 2 {
		t.Errorf("Refused() = %d; want 2", got)
	}
	for i := byte(3); i < 6; i++ {
		if err := c.Check(&Header{FlowID: [16]byte{i}, Hop: 1, Time: now}); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Evicted(); got != 2 {
		t.Errorf("Evicted() = %d; want 2 (capacity 2, 4 live headers)", got)
	}
}
