package controller

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

func TestChooseEgress(t *testing.T) {
	feps := line // a (50,8), b (50,9), c (50,10), d (-33,151)
	near := api.Destination{ID: "shop", Prefix: "198.51.100.0/24", Lat: 50, Lon: 9.9, ProbeAddr: "198.51.100.1:443"}
	geoOnly := api.Destination{Prefix: "203.0.113.0/24", Lat: -34, Lon: 150}
	dst := func(from string, ms float64) store.RTT { return sample(from, destKey("shop"), ms) }
	now := time.Now()
	tests := []struct {
		name string
		rtts []store.RTT
		fep  string
		by   string
	}{
		{"nothing measured: nearest", nil, "c", "distance"},
		{"measured beats geography", []store.RTT{dst("a", 4), dst("c", 9)}, "a", "rtt"},
		{"lowest RTT", []store.RTT{dst("a", 12), dst("b", 7), dst("c", 9)}, "b", "rtt"},
		{"tie to the lower id", []store.RTT{dst("c", 5), dst("b", 5)}, "b", "rtt"},
		{"unregistered FEP ignored", []store.RTT{dst("zz", 1), dst("c", 9)}, "c", "rtt"},
		{"only an unregistered FEP: nearest", []store.RTT{dst("zz", 1)}, "c", "distance"},
		{"FEP-to-FEP RTTs are not destination RTTs", []store.RTT{sample("a", "shop", 1)}, "c", "distance"},
		{"another destination's RTT", []store.RTT{sample("a", destKey("other"), 1)}, "c", "distance"},
		{"dead FEP skipped", []store.RTT{dst("a", 4), dst("c", 9), unreachable("b", "a", now), unreachable("c", "a", now)}, "c", "rtt"},
		{"dead FEP's own stale reports ignored", []store.RTT{dst("a", 4), dst("c", 9), unreachable("b", "a", now), sample("a", "b", 3)}, "c", "rtt"},
		{"unreachable from one peer only: not dead", []store.RTT{dst("a", 4), dst("c", 9), unreachable("b", "a", now), sample("c", "a", 5)}, "a", "rtt"},
		{"only a dead FEP measured: nearest living", []store.RTT{dst("c", 1), unreachable("a", "c", now)}, "b", "distance"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := chooseEgress([]api.Destination{near, geoOnly}, feps, tt.rtts)
			if len(got) != 2 {
				t.Fatalf("%d choices; want 2", len(got))
			}
			if f := feps[got[0].fep].ID; f != tt.fep || got[0].by != tt.by {
				t.Errorf("EgP of shop = %s by %s; want %s by %s", f, got[0].by, tt.fep, tt.by)
			}
			if f := feps[got[1].fep].ID; f != "d" || got[1].by != "distance" {
				t.Errorf("EgP of the unmeasured destination = %s by %s; want d by distance", f, got[1].by)
			}
		})
	}
	if got := chooseEgress([]api.Destination{near}, nil, nil); got[0].fep != -1 {
		t.Errorf("no FEPs: EgP index %d; want -1", got[0].fep)
	}
}

func TestChooseDestTargets(t *testing.T) {
	dests := []api.Destination{
		{ID: "shop", Prefix: "198.51.100.0/24", Lat: 50, Lon: 9.9, ProbeAddr: "198.51.100.1:443"},
		{ID: "syd", Prefix: "203.0.113.0/24", Lat: -34, Lon: 150, ProbeAddr: "203.0.113.1:443"},
		{ID: "noprobe", Prefix: "192.0.2.0/24", Lat: 50, Lon: 9},
	}
	got := chooseDestTargets(line, dests, 2)
	want := map[string][]string{"a": nil, "b": {"shop"}, "c": {"shop", "syd"}, "d": {"syd"}}
	for i, f := range line {
		var ids []string
		for _, d := range got[i] {
			ids = append(ids, d.ID)
		}
		if !slices.Equal(ids, want[f.ID]) {
			t.Errorf("%s measures %v; want %v", f.ID, ids, want[f.ID])
		}
	}
}

// TestDestinationsThroughAPI registers a destination through the API,
// checks which FEPs are asked to measure it, that their reports move its
// EgP from the nearest FEP to the one with the lowest measured RTT in the
// tables, and that deleting it removes it from the tables.
func TestDestinationsThroughAPI(t *testing.T) {
	st := openBolt(t)
	setup(t, st, line, []store.RTT{sample("a", "b", 10), sample("b", "c", 10), sample("a", "c", 18)})
	c, err := New(Config{Store: st, Debounce: 20 * time.Millisecond, Period: time.Hour, Targets: TargetPolicy{Dests: 2}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	cl := serve(t, c)
	ctx := testCtx(t)
	shop := api.Destination{ID: "shop", Prefix: "198.51.100.0/24", Lat: 50, Lon: 9.9, ProbeAddr: "198.51.100.1:443"}
	if err := cl.RegisterDestination(ctx, shop); err != nil {
		t.Fatal(err)
	}
	for fep, want := range map[string]bool{"a": false, "b": true, "c": true, "d": false} {
		ts, err := cl.TargetsAndDestinations(ctx, fep)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.ContainsFunc(ts.Destinations, func(d api.DestTarget) bool { return d.ID == "shop" && d.ProbeAddr == shop.ProbeAddr }); got != want {
			t.Errorf("%s asked to measure shop: %v; want %v (%v)", fep, got, want, ts.Destinations)
		}
	}
	egressOf := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		var got []api.Egress
		for time.Now().Before(deadline) {
			got = decodeTable(t, c, "a").Egress
			if want == "" && len(got) == 0 || len(got) == 1 && got[0].FEP == want && got[0].Prefix == shop.Prefix {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("table egress %v; want %s for %s", got, want, shop.Prefix)
	}
	egressOf("c") // nearest by distance
	status := func(egp, by string) {
		t.Helper()
		ds, err := cl.Destinations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 1 || ds[0].ID != "shop" || ds[0].EgP != egp || ds[0].By != by {
			t.Errorf("Destinations() = %+v; want shop with EgP %s by %s", ds, egp, by)
		}
	}
	status("c", "distance")

	report := func(fep, dest string, ms float64) api.ReportResult {
		t.Helper()
		res, err := cl.Report(ctx, api.Report{FEP: fep, Destinations: []api.DestSample{{Dest: dest, RTTMS: ms}}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	report("c", "shop", 30)
	if res := report("b", "shop", 6); res.Accepted != 1 || res.Changed != 1 {
		t.Errorf("report = %+v; want 1 accepted, 1 changed", res)
	}
	if res := report("b", "nope", 1); res.Accepted != 0 {
		t.Errorf("report about an unknown destination = %+v; want nothing accepted", res)
	}
	egressOf("b") // lowest measured RTT, not the nearest
	status("b", "rtt")
	if ds, _ := cl.Destinations(ctx); len(ds) == 1 && (ds[0].RTTMS["b"] != 6 || ds[0].RTTMS["c"] != 30) {
		t.Errorf("measured RTTs %v; want b=6, c=30", ds[0].RTTMS)
	}
	if m, err := cl.Matrix(ctx); err != nil || slices.ContainsFunc(m.Names, func(n string) bool { return strings.HasPrefix(n, destPrefix) }) {
		t.Errorf("matrix names %v, %v: destination records leaked into the FEP matrix", m.Names, err)
	}

	if err := cl.DeleteDestination(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	egressOf("")
	var se *api.StatusError
	if err := cl.DeleteDestination(ctx, "shop"); !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("deleting it again: %v; want 404", err)
	}
}

// TestTopologyDestinationsMeasured checks that a destination of the
// topology file with an id and a probe address is measured like a
// registered one, and that a FEP deleted takes its destination RTTs along.
func TestTopologyDestinationsMeasured(t *testing.T) {
	st := openBolt(t)
	setup(t, st, line, nil)
	top := Topology{Egress: []Destination{{ID: "syd", Prefix: "203.0.113.0/24", Lat: -34, Lon: 150, ProbeAddr: "203.0.113.1:443"}}}
	c, err := New(Config{Store: st, Topology: top, Targets: TargetPolicy{Dests: 4}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for _, id := range []string{"a", "d"} {
		if ds, err := c.DestTargets(ctx, id); err != nil || len(ds) != 1 || ds[0].ID != "syd" {
			t.Errorf("DestTargets(%s) = %v, %v; want syd", id, ds, err)
		}
	}
	if _, err := c.Report(ctx, api.Report{FEP: "a", Destinations: []api.DestSample{{Dest: "syd", RTTMS: 250}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Report(ctx, api.Report{FEP: "d", Destinations: []api.DestSample{{Dest: "syd", RTTMS: 300}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	if eg := decodeTable(t, c, "b").Egress; len(eg) != 1 || eg[0].FEP != "a" {
		t.Errorf("egress %v; want a (250 ms measured, below d's 300 ms)", eg)
	}
	if err := c.DeleteFEP(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	ds, err := c.Destinations(context.Background())
	if err != nil || len(ds) != 1 || ds[0].EgP != "d" || ds[0].RTTMS["a"] != 0 {
		t.Errorf("after deleting a: %+v, %v; want EgP d and no RTT from a", ds, err)
	}
}

// TestBuildMatrixDirections checks how the two directions of a pair
// combine: the mean of both, the one measured otherwise, and of several
// samples of one direction the newest.
func TestBuildMatrixDirections(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(from, to string, ms float64, s int) store.RTT {
		return store.RTT{From: from, To: to, MS: ms, At: t0.Add(time.Duration(s) * time.Second)}
	}
	tests := []struct {
		name string
		rtts []store.RTT
		want float64
	}{
		{"one direction", []store.RTT{at("a", "b", 10, 0)}, 10},
		{"agree: mean", []store.RTT{at("a", "b", 10, 0), at("b", "a", 11, 5)}, 10.5},
		{"disagree: still the mean", []store.RTT{at("a", "b", 10, 0), at("b", "a", 30, 5)}, 20},
		{"an older duplicate is ignored", []store.RTT{at("a", "b", 10, 9), at("a", "b", 50, 1)}, 10},
		{"a newer duplicate wins", []store.RTT{at("a", "b", 50, 1), at("a", "b", 10, 9), at("b", "a", 12, 3)}, 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := BuildMatrix(line[:2], tt.rtts)
			if m.RTT[0][1] != tt.want || m.RTT[1][0] != tt.want {
				t.Errorf("RTT a-b = %v / %v; want %v both ways", m.RTT[0][1], m.RTT[1][0], tt.want)
			}
		})
	}
}
