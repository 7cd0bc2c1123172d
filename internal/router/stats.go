package router

import (
	"sync/atomic"
	"time"
)

type counter struct{ v atomic.Int64 }

func (c *counter) add(n int64) { c.v.Add(n) }
func (c *counter) get() int64  { return c.v.Load() }

// Stats are the router's counters since it started.
type Stats struct {
	Accepted   int64 // client connections
	Requests   int64 // valid request heads
	BadRequest int64 // 400 and 431 answers
	Timeouts   int64 // 408 answers (slowloris)
	Redirects  int64 // 302 answers
	Proxied    int64 // sessions relayed (ModeProxy)
	HandedOff  int64 // sessions joined (ModeHandoff)
	// HandoffFallbacks: joins refused with both connections working; the
	// router proxied those sessions.
	HandoffFallbacks int64
	Failed           int64 // sessions that got a 502 or a reset (surrogate unreachable, join failed)
	PoolHits         int64 // pooled connections used
	PoolMisses       int64 // sessions that had to dial
	PoolStale        int64 // pooled connections found closed or too old
	// Forwarded sessions (proxy and handoff, fallbacks included) and the
	// sum of their times from the complete request head to the request
	// written to the surrogate leg, and of the pool's part of it: the
	// router's own delay on the way to the first byte.
	Forwarded   int64
	ForwardTime time.Duration
	PoolTime    time.Duration
}
