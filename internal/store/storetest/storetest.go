package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// Factory opens a fresh, empty store for one subtest; the suite closes it.
type Factory func(t *testing.T) store.Store

// Run runs the conformance suite against stores made by open.
func Run(t *testing.T, open Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"FEPs", testFEPs},
		{"DeleteFEPRemovesRTTs", testDeleteFEP},
		{"RTTsKeepNewest", testRTTs},
		{"VersionsIncrease", testVersions},
		{"TablesOnlyMoveForward", testTables},
		{"Destinations", testDests},
		{"DeleteDestinationRemovesRTTs", testDeleteDest},
		{"Keys", testKeys},
		{"TokensSingleUse", testTokens},
		{"Revocations", testRevocations},
		{"WatchSeesChanges", testWatch},
		{"WatchersSeeDestinations", testWatchDests},
		{"Lead", testLead},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() { s.Close() })
			tc.fn(t, s)
		})
	}
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func fep(id string) api.FEP {
	return api.FEP{ID: id, HopAddr: "127.0.0.1:7000", ProbeAddr: "127.0.0.1:7001", Location: "loc " + id, Lat: 1.5, Lon: -2.25}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testFEPs(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	got, err := s.FEPs(ctx)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("FEPs of empty store = %v; want none", got)
	}
	for _, id := range []string{"c", "a", "b"} {
		must(t, s.PutFEP(ctx, fep(id)))
	}
	upd := fep("b")
	upd.HopAddr = "10.0.0.2:9000"
	must(t, s.PutFEP(ctx, upd))
	got, err = s.FEPs(ctx)
	must(t, err)
	want := []api.FEP{fep("a"), upd, fep("c")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FEPs = %+v; want %+v", got, want)
	}
}

func testDeleteFEP(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, id := range []string{"a", "b", "c"} {
		must(t, s.PutFEP(ctx, fep(id)))
	}
	must(t, s.PutRTTs(ctx, []store.RTT{
		{From: "a", To: "b", MS: 10, At: now}, {From: "b", To: "a", MS: 11, At: now},
		{From: "b", To: "c", MS: 12, At: now}, {From: "c", To: "a", MS: 13, At: now},
	}))
	must(t, s.DeleteFEP(ctx, "a"))
	if err := s.DeleteFEP(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second DeleteFEP(a) = %v; want ErrNotFound", err)
	}
	feps, err := s.FEPs(ctx)
	must(t, err)
	if len(feps) != 2 || feps[0].ID != "b" || feps[1].ID != "c" {
		t.Errorf("FEPs after delete = %v; want b, c", feps)
	}
	rtts, err := s.RTTs(ctx)
	must(t, err)
	if len(rtts) != 1 || rtts[0].From != "b" || rtts[0].To != "c" {
		t.Errorf("RTTs after deleting a = %+v; want only b->c", rtts)
	}
}

func testRTTs(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, s.PutRTTs(ctx, []store.RTT{{From: "a", To: "b", MS: 10, At: t0}}))
	must(t, s.PutRTTs(ctx, []store.RTT{{From: "a", To: "b", MS: 20, At: t0.Add(time.Second)}, {From: "b", To: "a", MS: 5, At: t0}}))
	// An older sample arriving late must not overwrite a newer one.
	must(t, s.PutRTTs(ctx, []store.RTT{{From: "a", To: "b", MS: 99, At: t0.Add(-time.Second)}}))
	rtts, err := s.RTTs(ctx)
	must(t, err)
	got := map[string]float64{}
	for _, r := range rtts {
		got[r.From+">"+r.To] = r.MS
		if r.From == "a" && !r.At.Equal(t0.Add(time.Second)) {
			t.Errorf("a->b At = %v; want %v", r.At, t0.Add(time.Second))
		}
	}
	want := map[string]float64{"a>b": 20, "b>a": 5}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("RTTs = %v; want %v", got, want)
	}
	// An unreachable sample replaces the pair's RTT like any newer sample,
	// and a newer RTT replaces it.
	must(t, s.PutRTTs(ctx, []store.RTT{{From: "a", To: "b", At: t0.Add(2 * time.Second), Unreachable: true}}))
	if r := rttOf(t, s, "a", "b"); !r.Unreachable || r.MS != 0 {
		t.Errorf("a->b after an unreachable sample = %+v; want unreachable", r)
	}
	must(t, s.PutRTTs(ctx, []store.RTT{{From: "a", To: "b", MS: 7, At: t0.Add(3 * time.Second)}}))
	if r := rttOf(t, s, "a", "b"); r.Unreachable || r.MS != 7 {
		t.Errorf("a->b after a newer rtt = %+v; want 7 ms, reachable", r)
	}
}

func rttOf(t *testing.T, s store.Store, from, to string) store.RTT {
	t.Helper()
	rtts, err := s.RTTs(ctxT(t))
	must(t, err)
	for _, r := range rtts {
		if r.From == from && r.To == to {
			return r
		}
	}
	t.Fatalf("no rtt %s -> %s", from, to)
	return store.RTT{}
}

func testVersions(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := uint64(0)
			for i := 0; i < 10; i++ {
				v, err := s.NextVersion(ctx)
				if err != nil {
					errs <- err
					return
				}
				if v <= last {
					errs <- fmt.Errorf("NextVersion = %d after %d", v, last)
					return
				}
				last = v
				mu.Lock()
				if seen[v] {
					errs <- fmt.Errorf("version %d returned twice", v)
				}
				seen[v] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(seen) != 40 {
		t.Errorf("%d distinct versions; want 40", len(seen))
	}
}

func testTables(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	n, err := s.PutTables(ctx, []store.Table{
		{LoP: "a", Version: 5, Data: []byte("a5")},
		{LoP: "b", Version: 5, Data: []byte("b5")},
	})
	must(t, err)
	if n != 2 {
		t.Errorf("PutTables wrote %d; want 2", n)
	}
	n, err = s.PutTables(ctx, []store.Table{
		{LoP: "a", Version: 4, Data: []byte("a4")},    // older: ignored
		{LoP: "b", Version: 5, Data: []byte("b5bis")}, // same: ignored
		{LoP: "c", Version: 7, Data: []byte("c7")},
		{LoP: "a", Version: 8, Data: []byte("a8")},
	})
	must(t, err)
	if n != 2 {
		t.Errorf("PutTables wrote %d; want 2 (c7, a8)", n)
	}
	vers, err := s.TableVersions(ctx)
	must(t, err)
	if want := map[string]uint64{"a": 8, "b": 5, "c": 7}; !reflect.DeepEqual(vers, want) {
		t.Errorf("TableVersions = %v; want %v", vers, want)
	}
	all, err := s.Tables(ctx, []string{"c", "a", "b", "nope"})
	must(t, err)
	want := []store.Table{{LoP: "a", Version: 8, Data: []byte("a8")}, {LoP: "b", Version: 5, Data: []byte("b5")}, {LoP: "c", Version: 7, Data: []byte("c7")}}
	if !reflect.DeepEqual(all, want) {
		t.Errorf("Tables(c, a, b, nope) = %s; want %s", fmtTables(all), fmtTables(want))
	}
	some, err := s.Tables(ctx, []string{"c"})
	must(t, err)
	if !reflect.DeepEqual(some, want[2:]) {
		t.Errorf("Tables(c) = %s; want c7", fmtTables(some))
	}
	none, err := s.Tables(ctx, nil)
	must(t, err)
	if len(none) != 0 {
		t.Errorf("Tables(nil) = %s; want none", fmtTables(none))
	}
}

func fmtTables(ts []store.Table) string {
	s := "["
	for _, t := range ts {
		s += fmt.Sprintf(" %s@%d=%q", t.LoP, t.Version, t.Data)
	}
	return s + " ]"
}

func dest(id string) api.Destination {
	return api.Destination{ID: id, Prefix: "198.51.100.0/24", Lat: 37.3, Lon: -121.9, ProbeAddr: "198.51.100.10:443"}
}

func testDests(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	got, err := s.Destinations(ctx)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("Destinations of empty store = %v; want none", got)
	}
	if err := s.DeleteDestination(ctx, "shop"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteDestination(unknown) = %v; want ErrNotFound", err)
	}
	for _, id := range []string{"shop", "cdn", "mail"} {
		must(t, s.PutDestination(ctx, dest(id)))
	}
	upd := dest("mail")
	upd.Prefix, upd.ProbeAddr, upd.Lat = "2001:db8::/32", "", -33.9
	must(t, s.PutDestination(ctx, upd)) // overwrite
	got, err = s.Destinations(ctx)
	must(t, err)
	want := []api.Destination{dest("cdn"), upd, dest("shop")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Destinations = %+v; want %+v", got, want)
	}
	must(t, s.DeleteDestination(ctx, "cdn"))
	if err := s.DeleteDestination(ctx, "cdn"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second DeleteDestination(cdn) = %v; want ErrNotFound", err)
	}
	got, err = s.Destinations(ctx)
	must(t, err)
	if want := []api.Destination{upd, dest("shop")}; !reflect.DeepEqual(got, want) {
		t.Errorf("Destinations after delete = %+v; want %+v", got, want)
	}
	// Destinations are not FEPs.
	feps, err := s.FEPs(ctx)
	must(t, err)
	if len(feps) != 0 {
		t.Errorf("FEPs = %v; want none (destinations only were stored)", feps)
	}
}

func testDeleteDest(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, id := range []string{"a", "b"} {
		must(t, s.PutFEP(ctx, fep(id)))
	}
	must(t, s.PutDestination(ctx, dest("shop")))
	must(t, s.PutDestination(ctx, dest("shopx")))
	must(t, s.PutRTTs(ctx, []store.RTT{
		{From: "a", To: "b", MS: 10, At: now},
		{From: "a", To: store.DestPrefix + "shop", MS: 20, At: now},
		{From: "b", To: store.DestPrefix + "shop", MS: 21, At: now},
		{From: "b", To: store.DestPrefix + "shopx", MS: 22, At: now},
	}))
	must(t, s.DeleteDestination(ctx, "shop"))
	rtts, err := s.RTTs(ctx)
	must(t, err)
	got := map[string]float64{}
	for _, r := range rtts {
		got[r.From+">"+r.To] = r.MS
	}
	if want := map[string]float64{"a>b": 10, "b>@shopx": 22}; !reflect.DeepEqual(got, want) {
		t.Errorf("RTTs after deleting destination shop = %v; want %v", got, want)
	}
	// Deleting a FEP removes its RTTs to destinations too.
	must(t, s.DeleteFEP(ctx, "b"))
	rtts, err = s.RTTs(ctx)
	must(t, err)
	if len(rtts) != 0 {
		t.Errorf("RTTs after deleting b = %+v; want none (a->b went with b)", rtts)
	}
	ds, err := s.Destinations(ctx)
	must(t, err)
	if len(ds) != 1 || ds[0].ID != "shopx" {
		t.Errorf("Destinations = %+v; want shopx only", ds)
	}
}

func testKeys(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	if _, err := s.Keys(ctx); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Keys of empty store: err = %v; want ErrNotFound", err)
	}
	k := store.Keys{Current: []byte{1, 2, 3}, Previous: []byte{4, 5}, Rotated: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	must(t, s.PutKeys(ctx, k))
	got, err := s.Keys(ctx)
	must(t, err)
	if !reflect.DeepEqual(got, k) {
		t.Errorf("Keys = %+v; want %+v", got, k)
	}
}

func testTokens(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	must(t, s.PutToken(ctx, store.Token{ID: "t1", FEP: "fra", Expires: now.Add(time.Hour)}))
	must(t, s.PutToken(ctx, store.Token{ID: "old", Expires: now.Add(-time.Second)}))
	if _, err := s.UseToken(ctx, "nope", now); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UseToken(unknown) = %v; want ErrNotFound", err)
	}
	if _, err := s.UseToken(ctx, "old", now); !errors.Is(err, store.ErrTokenExpired) {
		t.Errorf("UseToken(expired) = %v; want ErrTokenExpired", err)
	}
	// Two concurrent uses: exactly one wins.
	var wg sync.WaitGroup
	res := make(chan error, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, err := s.UseToken(ctx, "t1", now)
			if err == nil && tok.FEP != "fra" {
				err = fmt.Errorf("token FEP = %q; want fra", tok.FEP)
			}
			res <- err
		}()
	}
	wg.Wait()
	close(res)
	ok, used := 0, 0
	for err := range res {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, store.ErrTokenUsed):
			used++
		default:
			t.Errorf("UseToken(t1): %v", err)
		}
	}
	if ok != 1 || used != 1 {
		t.Errorf("concurrent UseToken: %d succeeded, %d refused as used; want 1 and 1", ok, used)
	}
}

func testWatch(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	wctx, cancel := context.WithCancel(ctx)
	ch := s.Watch(wctx)
	steps := []struct {
		name string
		do   func() error
		want store.Change
	}{
		{"PutFEP", func() error { return s.PutFEP(ctx, fep("a")) }, store.ChangeFEPs},
		{"PutRTTs", func() error {
			return s.PutRTTs(ctx, []store.RTT{{From: "a", To: "b", MS: 1, At: time.Now()}})
		}, store.ChangeRTTs},
		{"PutTables", func() error {
			_, err := s.PutTables(ctx, []store.Table{{LoP: "a", Version: 1, Data: []byte("x")}})
			return err
		}, store.ChangeTables},
		{"PutKeys", func() error { return s.PutKeys(ctx, store.Keys{Current: []byte{1}}) }, store.ChangeKeys},
		{"PutDestination", func() error { return s.PutDestination(ctx, dest("shop")) }, store.ChangeDests},
		{"DeleteDestination", func() error { return s.DeleteDestination(ctx, "shop") }, store.ChangeDests},
	}
	for _, st := range steps {
		// Let a watch that starts asynchronously (etcd) get going first.
		time.Sleep(50 * time.Millisecond)
		must(t, st.do())
		deadline := time.After(10 * time.Second)
		var got store.Change
		for got&st.want == 0 {
			select {
			case c, ok := <-ch:
				if !ok {
					t.Fatalf("%s: watch channel closed early", st.name)
				}
				got |= c
			case <-deadline:
				t.Fatalf("%s: no %b change notified within 10s (got %b)", st.name, st.want, got)
			}
		}
	}
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch channel not closed within 10s of cancel")
		}
	}
}

// testWatchDests: two concurrent watchers both see a destination added
// and deleted.
func testWatchDests(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	a, b := s.Watch(ctx), s.Watch(ctx)
	time.Sleep(50 * time.Millisecond) // an asynchronous watch (etcd) gets going
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"PutDestination", func() error { return s.PutDestination(ctx, dest("shop")) }},
		{"DeleteDestination", func() error { return s.DeleteDestination(ctx, "shop") }},
	} {
		must(t, step.do())
		for i, ch := range []<-chan store.Change{a, b} {
			WaitChange(t, ch, store.ChangeDests, 10*time.Second, fmt.Sprintf("%s, watcher %d", step.name, i))
		}
	}
}

// WaitChange waits up to d for a notification of want on ch.
func WaitChange(t *testing.T, ch <-chan store.Change, want store.Change, d time.Duration, what string) {
	t.Helper()
	deadline := time.After(d)
	var got store.Change
	for got&want == 0 {
		select {
		case c, ok := <-ch:
			if !ok {
				t.Fatalf("%s: watch channel closed early", what)
			}
			got |= c
		case <-deadline:
			t.Fatalf("%s: no %b change notified within %v (got %b)", what, want, d, got)
		}
	}
}

func testLead(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	lctx, cancel := context.WithCancel(ctx)
	leadCtx, err := s.Lead(lctx)
	must(t, err)
	if leadCtx.Err() != nil {
		t.Fatalf("leadership context done at once: %v", leadCtx.Err())
	}
	cancel()
	select {
	case <-leadCtx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("leadership context not done within 10s of cancelling Lead's ctx")
	}
	// After resigning, leading again works.
	l2, err := s.Lead(ctx)
	must(t, err)
	if l2.Err() != nil {
		t.Errorf("second Lead: context done at once: %v", l2.Err())
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := s.Lead(cctx); err == nil {
		t.Error("Lead with a cancelled context succeeded; want an error")
	}
}

func testRevocations(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	got, err := s.Revocations(ctx)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("Revocations of empty store = %v; want none", got)
	}
	at := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	ch := s.Watch(ctx)
	must(t, s.PutRevocation(ctx, store.Revocation{Serial: "1f", FEP: "a", At: at}))
	must(t, s.PutRevocation(ctx, store.Revocation{Serial: "2e", FEP: "b", At: at}))
	must(t, s.PutRevocation(ctx, store.Revocation{Serial: "1f", FEP: "a", At: at}))
	got, err = s.Revocations(ctx)
	must(t, err)
	if len(got) != 2 || got[0].Serial != "1f" || got[0].FEP != "a" || !got[0].At.Equal(at) || got[1].Serial != "2e" {
		t.Errorf("Revocations = %+v; want 1f (a) and 2e (b)", got)
	}
	select {
	case c := <-ch:
		if c&store.ChangeFEPs == 0 {
			t.Errorf("revocation notified as %b; want ChangeFEPs", c)
		}
	case <-ctx.Done():
		t.Error("no notification of a revocation")
	}
}
