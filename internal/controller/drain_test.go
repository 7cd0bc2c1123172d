package controller

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/store"
)

// poll is one long-poll of lop's table newer than since, decoded.
func poll(t *testing.T, c *Controller, lop string, since uint64) *api.Table {
	t.Helper()
	et, err := c.WaitTable(testCtx(t), lop, since, "")
	if err != nil {
		t.Fatalf("WaitTable(%s, %d): %v", lop, since, err)
	}
	tab, err := api.DecodeJSON[api.Table](bytes.NewReader(et.JSON()))
	if err != nil {
		t.Fatalf("table %s: %v", lop, err)
	}
	return &tab
}

// ackTable tells c that lop holds version v, as the next long-poll of an
// agent does (since = v), without waiting for a newer table.
func ackTable(c *Controller, lop string, v uint64) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.WaitTable(ctx, lop, v, "")
}

// drainWorld runs a controller over a, b, c (a -> c goes through b) and d,
// b with a certificate on record, and returns it with the first tables of
// a, c and d, each acknowledged.
func drainWorld(t *testing.T, cfg Config) (*Controller, store.Store, map[string]*api.Table) {
	t.Helper()
	st := openBolt(t)
	feps := slices.Clone(line)
	feps[1].CertSerial = "b0b"
	setup(t, st, feps, []store.RTT{sample("a", "b", 10), sample("b", "a", 10), sample("b", "c", 10), sample("c", "b", 10), sample("a", "c", 50), sample("c", "a", 50)})
	cfg.Store, cfg.Debounce = st, 20*time.Millisecond
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	tabs := map[string]*api.Table{}
	for _, lop := range []string{"a", "c", "d"} {
		tabs[lop] = poll(t, c, lop, 0)
		ackTable(c, lop, tabs[lop].Version)
	}
	if got := pathOf(tabs["a"], "a", "c", 1_000_000); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("a -> c = %v before the deletion; want [a b c]", got)
	}
	return c, st, tabs
}

func registered(t *testing.T, st store.Store, id string) bool {
	t.Helper()
	feps, err := st.FEPs(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(feps, func(f api.FEP) bool { return f.ID == id })
}

// TestDeleteDrainsFirst (issue 13, a FEP deleted while flows run): the
// deletion first publishes tables whose chains avoid the FEP while it
// stays a member of every table, and revokes and deletes it only once
// every polling LoP holds them; then the FEP leaves the members.
func TestDeleteDrainsFirst(t *testing.T) {
	c, st, tabs := drainWorld(t, Config{DrainTimeout: time.Minute, DrainGrace: 10 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- c.DeleteFEP(context.Background(), "b") }()

	ta := poll(t, c, "a", tabs["a"].Version)
	if got := pathOf(ta, "a", "c", 1_000_000); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("a -> c = %v in the drain table; want [a c] (no chain through b)", got)
	}
	tc := poll(t, c, "c", tabs["c"].Version)
	for _, tab := range []*api.Table{ta, tc} {
		if tab.Members["b"] != "b.example:7000" || tab.Keys.Current.Send["b"] == "" {
			t.Errorf("%s's drain table: members %v, send keys %v; want b still a member with its key", tab.LoP, tab.Members, tab.Keys.Current.Send)
		}
		for _, e := range tab.Table.Chains {
			if slices.Contains(e.Path[1:len(e.Path)-1], "b") {
				t.Errorf("%s's drain table has a chain through b: %v", tab.LoP, e.Path)
			}
		}
	}
	ackTable(c, "a", ta.Version)
	// c holds the drain table but has not polled again: b is still there.
	if !registered(t, st, "b") || c.Revoked("b0b") {
		t.Fatal("b deleted or revoked before every LoP acknowledged the drain table")
	}
	select {
	case err := <-done:
		t.Fatalf("DeleteFEP returned (%v) before c acknowledged the drain table", err)
	default:
	}
	ackTable(c, "c", tc.Version)
	if err := <-done; err != nil {
		t.Fatalf("DeleteFEP: %v", err)
	}
	if registered(t, st, "b") || !c.Revoked("b0b") {
		t.Error("after the drain: b still registered or its certificate not revoked")
	}
	ta2 := poll(t, c, "a", ta.Version)
	if _, ok := ta2.Members["b"]; ok {
		t.Errorf("a's table after the deletion still has b: %v", ta2.Members)
	}
	if len(c.drainingIDs()) != 0 {
		t.Errorf("still draining %v after the deletion", c.drainingIDs())
	}
}

// TestDeleteDrainTimeout: a LoP that never acknowledges the drain table
// (a dead proxy) delays the deletion by DrainTimeout at most, counted.
func TestDeleteDrainTimeout(t *testing.T) {
	c, st, _ := drainWorld(t, Config{DrainTimeout: 200 * time.Millisecond, DrainGrace: 10 * time.Millisecond})
	if err := c.DeleteFEP(testCtx(t), "b"); err != nil {
		t.Fatalf("DeleteFEP: %v", err)
	}
	if registered(t, st, "b") || !c.Revoked("b0b") {
		t.Error("after the drain timed out: b still registered or not revoked")
	}
	if n := counterValue(t, c.m.drainTimeouts); n != 1 {
		t.Errorf("drain timeouts = %v; want 1", n)
	}
	// No drain: a deletion takes effect at once.
	c2, st2, _ := drainWorld(t, Config{DrainTimeout: -1})
	if err := c2.DeleteFEP(testCtx(t), "b"); err != nil {
		t.Fatalf("DeleteFEP without drain: %v", err)
	}
	if registered(t, st2, "b") || !c2.Revoked("b0b") || counterValue(t, c2.m.drainTimeouts) != 0 {
		t.Error("DrainTimeout < 0: b not deleted at once")
	}
}

func counterValue(t *testing.T, c *metrics.Counter) float64 {
	t.Helper()
	return c.Value()
}
