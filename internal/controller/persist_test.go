package controller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
	"github.com/mosto-net/mosto/internal/store/boltstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
)

var shopDest = api.Destination{ID: "shop", Prefix: "198.51.100.0/24", Lat: 50, Lon: 9.9, ProbeAddr: "198.51.100.1:443"}

// runNode runs a controller on st until the returned stop is called (stop
// waits for Run to return; calling it twice is harmless).
func runNode(t *testing.T, st store.Store, cfg Config) (*Controller, func()) {
	t.Helper()
	cfg.Store = st
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return c, stop
}

// waitCond polls cond every 10 ms for up to d.
func waitCond(t *testing.T, what string, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tableEgress checks that c serves lop a table whose egress maps prefix to
// egp (egp "" : no egress entry at all).
func tableEgress(c *Controller, lop, prefix, egp string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	et, err := c.WaitTable(ctx, lop, 0, "")
	if err != nil {
		return err
	}
	tab, err := api.DecodeJSON[api.Table](strings.NewReader(string(et.JSON())))
	if err != nil {
		return err
	}
	if egp == "" && len(tab.Egress) == 0 || len(tab.Egress) == 1 && tab.Egress[0].Prefix == prefix && tab.Egress[0].FEP == egp {
		return nil
	}
	return fmt.Errorf("table %s v%d egress %v; want %s -> %q", lop, tab.Version, tab.Egress, prefix, egp)
}

// destStatus checks that c lists exactly the destination id, with EgP egp
// chosen by by.
func destStatus(c *Controller, id, egp, by string) error {
	ds, err := c.Destinations(context.Background())
	if err != nil {
		return err
	}
	if len(ds) != 1 || ds[0].ID != id || ds[0].EgP != egp || ds[0].By != by {
		return fmt.Errorf("destinations %+v; want %s with EgP %s by %s", ds, id, egp, by)
	}
	return nil
}

// TestDestinationsSurviveRestart: a destination registered through the API
// and its measured EgP survive a controller restart on the same bbolt file;
// one written to the store by someone else is picked up through the watch;
// a deleted one stays deleted, its RTT records with it.
func TestDestinationsSurviveRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.db")
	open := func() *boltstore.Store {
		t.Helper()
		st, err := boltstore.Open(path, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	cfg := Config{Debounce: 20 * time.Millisecond, Period: time.Hour, Targets: TargetPolicy{Dests: 2}}

	st := open()
	setup(t, st, line, []store.RTT{sample("a", "b", 10), sample("b", "c", 10), sample("a", "c", 18)})
	c, stop := runNode(t, st, cfg)
	cl := serve(t, c)
	ctx := testCtx(t)
	if err := cl.RegisterDestination(ctx, shopDest); err != nil {
		t.Fatal(err)
	}
	if res, err := cl.Report(ctx, api.Report{FEP: "b", Destinations: []api.DestSample{{Dest: "shop", RTTMS: 6}}}); err != nil || res.Accepted != 1 {
		t.Fatalf("report = %+v, %v; want 1 accepted", res, err)
	}
	waitCond(t, "egress b measured before the restart", 10*time.Second, func() error { return tableEgress(c, "a", shopDest.Prefix, "b") })
	v1 := c.Version()
	stop()
	st.Close()

	st = open()
	c, stop = runNode(t, st, cfg)
	if err := destStatus(c, "shop", "b", "rtt"); err != nil {
		t.Errorf("after restart: %v", err)
	}
	if ds, err := c.DestTargets(ctx, "b"); err != nil || !slices.ContainsFunc(ds, func(d api.DestTarget) bool { return d.ID == "shop" }) {
		t.Errorf("after restart, DestTargets(b) = %v, %v; want shop", ds, err)
	}
	// The tables of the restarted leader (a new version) carry the EgP.
	waitCond(t, "restarted leader computes egress b", 10*time.Second, func() error {
		if c.Version() <= v1 {
			return fmt.Errorf("version %d; want > %d", c.Version(), v1)
		}
		return tableEgress(c, "a", shopDest.Prefix, "b")
	})

	// Another controller on the store (here: the store itself) replaces
	// the destination: the watch makes this one recompute.
	moved := shopDest
	moved.Prefix = "203.0.113.0/24"
	if err := st.PutDestination(ctx, moved); err != nil {
		t.Fatal(err)
	}
	waitCond(t, "recomputation after a destination change in the store", 10*time.Second, func() error { return tableEgress(c, "a", moved.Prefix, "b") })

	if err := c.DeleteDestination(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	waitCond(t, "egress gone after delete", 10*time.Second, func() error { return tableEgress(c, "a", "", "") })
	stop()
	st.Close()

	st = open()
	defer st.Close()
	if ds, err := st.Destinations(ctx); err != nil || len(ds) != 0 {
		t.Errorf("stored destinations after delete = %v, %v; want none", ds, err)
	}
	rtts, err := st.RTTs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rtts {
		if strings.HasPrefix(r.To, destPrefix) {
			t.Errorf("RTT %s -> %s left behind by the deleted destination", r.From, r.To)
		}
	}
}

// brokenStore fails every destination write.
type brokenStore struct{ store.Store }

var errBroken = errors.New("disk on fire")

func (brokenStore) PutDestination(context.Context, api.Destination) error { return errBroken }
func (brokenStore) DeleteDestination(context.Context, string) error       { return errBroken }

// TestDestinationStoreErrors: a failed write is a 5xx with the store's
// reason, and nothing is half applied (not listed, not measured, not in
// tables).
func TestDestinationStoreErrors(t *testing.T) {
	inner := openBolt(t)
	setup(t, inner, line, nil)
	if err := inner.PutDestination(testCtx(t), api.Destination{ID: "old", Prefix: "203.0.113.0/24", Lat: 50, Lon: 9.9, ProbeAddr: "203.0.113.1:443"}); err != nil {
		t.Fatal(err)
	}
	c, _ := runNode(t, brokenStore{inner}, Config{Debounce: 20 * time.Millisecond, Period: time.Hour, Targets: TargetPolicy{Dests: 4}})
	cl := serve(t, c)
	ctx := testCtx(t)
	var se *api.StatusError
	if err := cl.RegisterDestination(ctx, shopDest); !errors.As(err, &se) || se.Code/100 != 5 || !strings.Contains(err.Error(), "disk on fire") || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("register with a broken store: %v; want a 5xx saying why and that it is not registered", err)
	}
	if err := cl.DeleteDestination(ctx, "old"); !errors.As(err, &se) || se.Code/100 != 5 || !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("delete with a broken store: %v; want a 5xx saying why", err)
	}
	if err := destStatus(c, "old", "c", "distance"); err != nil {
		t.Error(err)
	}
	ts, err := cl.TargetsAndDestinations(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(ts.Destinations) != 1 || ts.Destinations[0].ID != "old" {
		t.Errorf("b measures %v; want only old", ts.Destinations)
	}
}

// TestDestinationsSharedOnEtcd: two controllers on a real etcd; a
// destination registered on one is listed, measured and routed by the
// other, and survives the first one's stop.
func TestDestinationsSharedOnEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("embedded etcd skipped in -short mode")
	}
	eps := etcdtest.Start(t)
	cfg := Config{Debounce: 20 * time.Millisecond, Period: time.Hour, Targets: TargetPolicy{Dests: 2}}
	open := func(id string) *etcdstore.Store {
		st, err := etcdstore.Open(context.Background(), etcdstore.Config{Endpoints: eps, ID: id, SessionTTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	sa := open("a")
	setup(t, sa, line, []store.RTT{sample("a", "b", 10), sample("b", "c", 10), sample("a", "c", 18)})
	a, stopA := runNode(t, sa, cfg)
	waitCond(t, "a leads", 10*time.Second, func() error {
		if !a.IsLeader() {
			return errors.New("a does not lead")
		}
		return nil
	})
	b, _ := runNode(t, open("b"), cfg)
	ctx := testCtx(t)
	if err := serve(t, a).RegisterDestination(ctx, shopDest); err != nil {
		t.Fatal(err)
	}
	clB := serve(t, b)
	if err := destStatus(b, "shop", "c", "distance"); err != nil {
		t.Errorf("b right after registering on a: %v", err)
	}
	waitCond(t, "b asks c to measure shop", 10*time.Second, func() error {
		ts, err := clB.TargetsAndDestinations(ctx, "c")
		if err != nil || len(ts.Destinations) != 1 || ts.Destinations[0].ID != "shop" {
			return fmt.Errorf("c measures %v, %v; want shop", ts.Destinations, err)
		}
		return nil
	})
	// A report to b right away is accepted (b looks at the store).
	if res, err := clB.Report(ctx, api.Report{FEP: "b", Destinations: []api.DestSample{{Dest: "shop", RTTMS: 6}}}); err != nil || res.Accepted != 1 {
		t.Fatalf("report to b = %+v, %v; want 1 accepted", res, err)
	}
	waitCond(t, "leader a routes shop by b's measurement, served by b", 10*time.Second, func() error { return tableEgress(b, "a", shopDest.Prefix, "b") })

	v := b.Version()
	stopA()
	sa.Close()
	stopped := time.Now()
	waitCond(t, "b leads and computes after a stopped", 15*time.Second, func() error {
		if !b.IsLeader() || b.Version() <= v {
			return fmt.Errorf("b leader %v version %d; want leader, > %d", b.IsLeader(), b.Version(), v)
		}
		return tableEgress(b, "a", shopDest.Prefix, "b")
	})
	t.Logf("a stopped: b leads and serves tables routing shop by its measured EgP after %v", time.Since(stopped).Round(time.Millisecond))
	if err := destStatus(b, "shop", "b", "rtt"); err != nil {
		t.Errorf("b after a stopped: %v", err)
	}
	if err := clB.DeleteDestination(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	waitCond(t, "egress gone after delete on b", 10*time.Second, func() error { return tableEgress(b, "a", "", "") })
}
