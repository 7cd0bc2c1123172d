package emu

import (
	"math"
	"testing"
)

// queued sends GSO packets of segs segments through a pipe with link l and
// returns what the pipe scheduled (one item per packet it will deliver).
func queued(t *testing.T, l Link, packets, segs int) []schedItem {
	t.Helper()
	w := &World{offload: true, bufs: newBufPools()}
	s := &scheduler{w: w, sleepUntil: math.MinInt64} // asleep forever: push never kicks
	p := newPipe(w, -1, s, l, 42)
	for i := range packets {
		p.send(int64(i)*int64(10e6), gsoPacket(make([]byte, segs*1448), 1448, 0x10))
	}
	return s.q
}

// TestJitterGSO: with JitterGSO a GSO packet keeps one jitter draw and goes
// on whole unless one of its segments is lost (then the survivors go one by
// one, all at the same time); without it every segment draws its own.
func TestJitterGSO(t *testing.T) {
	const packets, segs = 200, 8
	l := Link{DelayMS: 50, JitterMS: 20, Reorder: true, RateMbit: 1000, LossPct: 1e-9, JitterGSO: true}
	q := queued(t, l, packets, segs)
	if len(q) != packets {
		t.Fatalf("JitterGSO, no loss: %d items scheduled; want %d whole GSO packets", len(q), packets)
	}
	for _, it := range q {
		if !isGSO(it.buf) || gsoSegments(it.buf) != segs {
			t.Fatalf("JitterGSO: scheduled a packet of %d segments (GSO %v); want %d", gsoSegments(it.buf), isGSO(it.buf), segs)
		}
	}
	distinct := map[int64]bool{}
	for _, it := range q {
		distinct[it.at] = true
	}
	if len(distinct) < packets/2 {
		t.Errorf("JitterGSO: %d distinct delivery times for %d packets; want jitter between packets", len(distinct), packets)
	}

	l.LossPct, l.RateMbit = 20, 0 // no serialization: survivors share one time
	q = queued(t, l, packets, segs)
	byAt := map[int64]int{}
	for _, it := range q {
		if isGSO(it.buf) {
			continue // no segment of it lost
		}
		byAt[it.at]++
	}
	if len(byAt) == 0 {
		t.Fatal("JitterGSO, 20% loss: no packet was split")
	}
	shared := 0
	for _, n := range byAt {
		if n > 1 {
			shared++
		}
	}
	if shared == 0 {
		t.Error("JitterGSO, 20% loss: the surviving segments of a packet do not share its delivery time")
	}

	l.LossPct, l.RateMbit, l.JitterGSO = 1e-9, 1000, false
	q = queued(t, l, packets, segs)
	if len(q) != packets*segs {
		t.Fatalf("per-segment jitter: %d items scheduled; want %d segments", len(q), packets*segs)
	}
	distinct = map[int64]bool{}
	for _, it := range q {
		distinct[it.at] = true
	}
	if len(distinct) < packets*segs/2 {
		t.Errorf("per-segment jitter: %d distinct delivery times for %d segments; want one draw each", len(distinct), packets*segs)
	}
}

// TestLimitPkts: a link with LimitPkts holds at most that many packets,
// queued and delayed together (netem's limit); the rest are dropped and
// counted, and delivering one makes room for one more.
func TestLimitPkts(t *testing.T) {
	w := &World{offload: true, bufs: newBufPools()}
	s := &scheduler{w: w, sleepUntil: math.MinInt64}
	l := Link{DelayMS: 100, JitterMS: 50, Reorder: true, LossPct: 1e-9, RateMbit: 1000, QueuePkts: 1000, LimitPkts: 10}
	p := newPipe(w, -1, s, l, 7)
	for i := range 50 {
		p.send(int64(i)*int64(1e6), gsoPacket(make([]byte, 1448), 1448, 0x10))
	}
	if len(s.q) != 10 || p.stats().QueueDrops != 40 {
		t.Fatalf("limit 10: %d scheduled, %d dropped; want 10 and 40", len(s.q), p.stats().QueueDrops)
	}
	p.held.Add(-1) // one delivered (deliver's accounting; no device here)
	p.send(int64(60e6), gsoPacket(make([]byte, 1448), 1448, 0x10))
	if len(s.q) != 11 {
		t.Errorf("after one delivery: %d scheduled; want 11", len(s.q))
	}
	l.LimitPkts = 0
	p.setLink(l)
	for i := range 50 {
		p.send(int64(100e6)+int64(i)*int64(1e6), gsoPacket(make([]byte, 1448), 1448, 0x10))
	}
	if len(s.q) != 61 {
		t.Errorf("no limit: %d scheduled; want 61", len(s.q))
	}
}
