package onpath

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

var t0 = time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)

func planner(t *testing.T, hold time.Duration) *Planner {
	t.Helper()
	start := t0
	if hold == 0 {
		// No hold: the start is long past, any change may happen.
		hold, start = time.Nanosecond, t0.Add(-time.Hour)
	}
	pl, err := New(Config{Hold: hold, Paths: []Path{{Name: "cs", Relays: []string{"r1", "r2"},
		Dests: []string{"10.77.0.3"}, Ports: "8080", RateMbit: 100, Size: 10_000_000}}}, start)
	if err != nil {
		t.Fatal(err)
	}
	return pl
}

// allOn reports what r1 and r2 see with both active: each leg is one hop.
// Loss is what the relay sending data on the leg sees (downloads: the
// relay towards the client).
func allOn(t *testing.T, pl *Planner, at time.Time, rtt [3]float64, loss [3]float64) bool {
	t.Helper()
	c1, err1 := pl.Observe(at, "r1", []api.SegmentSample{
		{Path: "cs", To: "r1", Flows: 4, MinRTTMS: rtt[0], SegsOut: 20000, Retrans: 20000 * loss[0]},
		{Path: "cs", From: "r1", To: "r2", Flows: 4, MinRTTMS: rtt[1], SegsOut: 10, Retrans: 0},
	})
	c2, err2 := pl.Observe(at, "r2", []api.SegmentSample{
		{Path: "cs", From: "r1", To: "r2", Flows: 4, MinRTTMS: rtt[1], SegsOut: 20000, Retrans: 20000 * loss[1]},
		{Path: "cs", From: "r2", Flows: 4, MinRTTMS: rtt[2], SegsOut: 20000, Retrans: 20000 * loss[2]},
	})
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	return c1 || c2
}

func active(pl *Planner) []bool { return pl.Status()[0].Active }

func TestStartsAllOn(t *testing.T) {
	pl := planner(t, 0)
	for _, in := range pl.Intercepts() {
		if !in.Active {
			t.Errorf("%+v: inactive before any measurement", in)
		}
	}
	in := pl.Intercepts()
	if in[0].FEP != "r1" || in[0].Prev != "" || in[0].Next != "r2" || in[1].Prev != "r1" || in[1].Next != "" {
		t.Errorf("neighbours: %+v", in)
	}
	if in[0].Ports != "8080" || !slices.Equal(in[0].Dests, []string{"10.77.0.3"}) {
		t.Errorf("scope: %+v", in[0])
	}
}

// A lossy first hop: the model wants the relay next to it, and the
// decision is the model's.
func TestLossyHopActivates(t *testing.T) {
	pl := planner(t, 0)
	allOn(t, pl, t0, [3]float64{20, 20, 20}, [3]float64{0.02, 0, 0})
	st := pl.Status()[0]
	if math.Abs(st.Hops[0].Loss-0.01) > 1e-9 || st.Hops[1].Loss != 0 || st.Hops[0].RTT != 20 {
		t.Errorf("estimates %+v: want hop 0 loss 0.01 (half of 2%% after one report), RTT 20", st.Hops)
	}
	if !st.Active[0] {
		t.Errorf("active %v: r1 (next to the lossy hop) off", st.Active)
	}
	if st.PredMS <= 0 || st.PredMS > st.BestMS*1.1 {
		t.Errorf("predicted %v ms vs best %v ms", st.PredMS, st.BestMS)
	}
}

// A clean short path: relays do not pay; the all-on start is dropped.
func TestCleanPathDeactivates(t *testing.T) {
	pl := planner(t, 0)
	if !allOn(t, pl, t0, [3]float64{1, 1, 1}, [3]float64{0, 0, 0}) {
		t.Fatal("no change from the all-on start on a clean short path")
	}
	if a := active(pl); slices.Contains(a, true) {
		t.Errorf("active %v on a clean 3 ms path at 100 Mbit/s", a)
	}
	for _, in := range pl.Intercepts() {
		if in.Active || in.Prev != "" || in.Next != "" {
			t.Errorf("%+v", in)
		}
	}
}

// Hold: a change within Hold of the last one waits; after it, it happens.
func TestHold(t *testing.T) {
	pl := planner(t, time.Minute)
	if allOn(t, pl, t0.Add(time.Second), [3]float64{1, 1, 1}, [3]float64{0, 0, 0}) {
		t.Fatal("changed within the hold time of the start")
	}
	if !allOn(t, pl, t0.Add(61*time.Second), [3]float64{1, 1, 1}, [3]float64{0, 0, 0}) {
		t.Fatal("no change after the hold time")
	}
	if slices.Contains(active(pl), true) {
		t.Fatalf("active %v", active(pl))
	}
}

// Between the thresholds nothing moves: loss that makes the relays pay a
// little (less than Gain) does not bring them back.
func TestNoFlap(t *testing.T) {
	pl := planner(t, 0)
	allOn(t, pl, t0, [3]float64{1, 1, 1}, [3]float64{0, 0, 0})
	if slices.Contains(active(pl), true) {
		t.Fatal("clean path kept relays")
	}
	// With every relay off, r-less flows are not measured; nothing
	// reports and the decision stays. A report of a tiny loss on the
	// whole path (as a relay would see it after a later activation)
	// does not reach the threshold.
	changes := 0
	for k := range 20 {
		at := t0.Add(time.Duration(k) * time.Second)
		if ch, err := pl.Observe(at, "r1", []api.SegmentSample{{Path: "cs", To: "r1", Flows: 1, MinRTTMS: 1 + 0.1*float64(k%2), SegsOut: 2000, Retrans: float64(k % 2)}}); err != nil {
			t.Fatal(err)
		} else if ch {
			changes++
		}
	}
	if changes != 0 {
		t.Errorf("%d changes under noise around a clean path", changes)
	}
}

// A leg across an inactive relay covers several hops: the hops' RTTs
// scale to its sum, and their losses share it.
func TestSpanFold(t *testing.T) {
	pl := planner(t, 0)
	allOn(t, pl, t0, [3]float64{10, 10, 30}, [3]float64{0, 0.01, 0.01})
	before := pl.Status()[0].Hops
	// r1's upstream leg to the server (r2 inactive from r1's view).
	if _, err := pl.Observe(t0, "r1", []api.SegmentSample{{Path: "cs", From: "r1", Flows: 2, MinRTTMS: 80, SegsOut: 5000, Retrans: 0}}); err != nil {
		t.Fatal(err)
	}
	h := pl.Status()[0].Hops
	if h[0] != before[0] {
		t.Errorf("hop 0 changed by a leg that does not cover it: %v -> %v", before[0], h[0])
	}
	// 40 ms known, 80 measured: the sum moves halfway (60), in proportion.
	if math.Abs(h[1].RTT+h[2].RTT-60) > 1e-9 || math.Abs(h[2].RTT/h[1].RTT-3) > 1e-9 {
		t.Errorf("hops 1-2 RTT %v, %v: want sum 60 in ratio 1:3", h[1].RTT, h[2].RTT)
	}
	if !(h[1].Loss < before[1].Loss && h[2].Loss < before[2].Loss) || math.Abs(h[1].Loss/h[2].Loss-before[1].Loss/before[2].Loss) > 1e-3 {
		t.Errorf("losses %v %v -> %v %v: want both lower, in the same ratio", before[1].Loss, before[2].Loss, h[1].Loss, h[2].Loss)
	}
}

func TestObserveRefuses(t *testing.T) {
	pl := planner(t, 0)
	for _, s := range []api.SegmentSample{
		{Path: "nope", To: "r1", Flows: 1, MinRTTMS: 1},
		{Path: "cs", To: "r9", Flows: 1, MinRTTMS: 1},
		{Path: "cs", From: "r2", To: "r1", Flows: 1, MinRTTMS: 1},
	} {
		if _, err := pl.Observe(t0, s.To+s.From, []api.SegmentSample{s}); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
	// A relay reporting a leg it is not an end of.
	if _, err := pl.Observe(t0, "r2", []api.SegmentSample{{Path: "cs", To: "r1", Flows: 1, MinRTTMS: 1}}); err == nil {
		t.Error("r2 reported the leg to r1")
	}
	if st := pl.Status()[0]; st.Hops[0].RTT != 0 {
		t.Errorf("a refused sample changed the estimates: %+v", st.Hops)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{Paths: []Path{{Name: "a"}}},
		{Paths: []Path{{Name: "a", Relays: []string{"r1", "r1"}}}},
		{Paths: []Path{{Name: "a", Relays: []string{"r1"}, Ports: "0"}}},
		{Paths: []Path{{Name: "a", Relays: []string{"r1"}, Dests: []string{"nope"}}}},
		{Paths: []Path{{Name: "a", Relays: []string{"r1"}}, {Name: "a", Relays: []string{"r2"}}}},
		{Gain: 1.5},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// RTTs without a loss figure (too few segments) do not decide: a
// decision on RTTs alone would drop the relays of a lossy path, and an
// inactive relay measures nothing more.
func TestNoDecisionWithoutLoss(t *testing.T) {
	pl := planner(t, 0)
	ch, err := pl.Observe(t0, "r1", []api.SegmentSample{
		{Path: "cs", To: "r1", Flows: 1, MinRTTMS: 1, SegsOut: 100},
		{Path: "cs", From: "r1", To: "r2", Flows: 1, MinRTTMS: 1, SegsOut: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	ch2, err := pl.Observe(t0, "r2", []api.SegmentSample{{Path: "cs", From: "r2", Flows: 1, MinRTTMS: 1, SegsOut: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if st := pl.Status()[0]; ch || ch2 || st.Measured || !slices.Equal(st.Active, []bool{true, true}) {
		t.Errorf("decided on RTTs alone: %+v", st)
	}
}
