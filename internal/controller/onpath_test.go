package controller

import (
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/onpath"
	"github.com/mosto-net/mosto/internal/store"
)

// The relays' leg reports reach the planner, and its decision reaches the
// tables (Table.Intercept), under a new version when it changes.
func TestOnPathDecisionInTables(t *testing.T) {
	st := openBolt(t)
	setup(t, st, line, []store.RTT{sample("a", "b", 10), sample("b", "a", 10), sample("b", "c", 10)})
	now := time.Now()
	c, err := New(Config{Store: st, Now: func() time.Time { return now },
		OnPath: onpath.Config{Hold: time.Second, Paths: []onpath.Path{{Name: "cs", Relays: []string{"a", "b"},
			Dests: []string{"10.77.0.3"}, Ports: "8080", RateMbit: 100}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	tab := decodeTable(t, c, "c")
	if len(tab.Intercept) != 2 || !tab.Intercept[0].Active || !tab.Intercept[1].Active || tab.Intercept[0].Next != "b" {
		t.Fatalf("first table's decisions %+v: want a and b active (measuring)", tab.Intercept)
	}
	v1 := tab.Version
	// A clean short path: the relays do not pay.
	now = now.Add(time.Minute)
	for _, r := range []api.Report{
		{FEP: "a", Segments: []api.SegmentSample{{Path: "cs", To: "a", Flows: 3, MinRTTMS: 1, SegsOut: 30000}, {Path: "cs", From: "a", To: "b", Flows: 3, MinRTTMS: 1, SegsOut: 3}}},
		{FEP: "b", Segments: []api.SegmentSample{{Path: "cs", From: "a", To: "b", Flows: 3, MinRTTMS: 1, SegsOut: 30000}, {Path: "cs", From: "b", Flows: 3, MinRTTMS: 1, SegsOut: 3}}},
	} {
		if _, err := c.Report(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Compute(ctx, false); err != nil {
		t.Fatal(err)
	}
	tab = decodeTable(t, c, "c")
	if tab.Version <= v1 {
		t.Fatalf("no new table version after the decision changed (%d)", tab.Version)
	}
	for _, in := range tab.Intercept {
		if in.Active {
			t.Errorf("%+v: active on a clean 3 ms path", in)
		}
	}
	// A report about an unknown path is refused (counted), not an error.
	if _, err := c.Report(ctx, api.Report{FEP: "a", Segments: []api.SegmentSample{{Path: "zz", To: "a", Flows: 1, MinRTTMS: 1}}}); err != nil {
		t.Fatal(err)
	}
	// A sample about a leg the reporter is not an end of is invalid.
	if _, err := c.Report(ctx, api.Report{FEP: "c", Segments: []api.SegmentSample{{Path: "cs", To: "a", Flows: 1, MinRTTMS: 1}}}); err == nil {
		t.Error("c reported a's leg")
	}
}
