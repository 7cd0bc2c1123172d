package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
)

// TestFailover runs three controllers on one embedded etcd: one leads and
// computes, all serve; cancelling the leader makes another one lead and
// compute within 10 s.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("embedded etcd failover skipped in -short mode")
	}
	eps := etcdtest.Start(t)
	type node struct {
		c      *Controller
		cancel context.CancelFunc
		done   chan struct{}
	}
	var nodes []*node
	for i := 0; i < 3; i++ {
		st, err := etcdstore.Open(context.Background(), etcdstore.Config{Endpoints: eps, ID: fmt.Sprintf("c%d", i), SessionTTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if i == 0 {
			setup(t, st, line, []store.RTT{sample("a", "b", 10), sample("b", "c", 10), sample("a", "c", 50)})
		}
		c, err := New(Config{Store: st, Debounce: 50 * time.Millisecond, Period: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		n := &node{c: c, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(n.done)
			c.Run(ctx)
		}()
		t.Cleanup(func() { cancel(); <-n.done })
		nodes = append(nodes, n)
	}
	waitFor := func(what string, d time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > d {
				t.Fatalf("%s: not within %s", what, d)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return time.Since(start)
	}
	leaders := func(alive []*node) []*node {
		var out []*node
		for _, n := range alive {
			if n.c.IsLeader() {
				out = append(out, n)
			}
		}
		return out
	}
	waitFor("one leader with tables on every controller", 20*time.Second, func() bool {
		if len(leaders(nodes)) != 1 {
			return false
		}
		v := leaders(nodes)[0].c.Version()
		for _, n := range nodes {
			if v == 0 || n.c.Version() != v {
				return false
			}
		}
		return true
	})
	old := leaders(nodes)[0]
	v1 := old.c.Version()
	// Followers serve the leader's table.
	for _, n := range nodes {
		et, err := n.c.WaitTable(testCtx(t), "a", 0, "")
		if err != nil || et.Version != v1 {
			t.Fatalf("follower table = %v, %v; want version %d", et, err, v1)
		}
	}

	old.cancel()
	<-old.done
	var alive []*node
	for _, n := range nodes {
		if n != old {
			alive = append(alive, n)
		}
	}
	took := waitFor("a new leader computes", 10*time.Second, func() bool {
		l := leaders(alive)
		return len(l) == 1 && l[0].c.Version() > v1
	})
	t.Logf("failover: new leader computed version > %d after %s", v1, took.Round(time.Millisecond))
	if len(leaders(alive)) != 1 {
		t.Fatalf("%d leaders after failover; want 1", len(leaders(alive)))
	}

	// A report taken by the follower reaches the new leader, which recomputes.
	var follower, leader *node
	for _, n := range alive {
		if n.c.IsLeader() {
			leader = n
		} else {
			follower = n
		}
	}
	v2 := leader.c.Version()
	if _, err := follower.c.Report(testCtx(t), api.Report{FEP: "a", Samples: []api.Sample{{Peer: "c", RTTMS: 5}}}); err != nil {
		t.Fatal(err)
	}
	waitFor("recomputation after a report to the follower, seen by the follower", 10*time.Second, func() bool {
		return leader.c.Version() > v2 && follower.c.Version() == leader.c.Version()
	})
}
