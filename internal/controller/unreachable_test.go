package controller

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

func unreachable(from, to string, at time.Time) store.RTT {
	return store.RTT{From: from, To: to, At: at.UTC(), Unreachable: true}
}

func TestBuildMatrixUnreachable(t *testing.T) {
	feps := line[:2] // a, b
	now := time.Now()
	at := func(from, to string, ms float64, d time.Duration) store.RTT {
		return store.RTT{From: from, To: to, MS: ms, At: now.Add(d).UTC()}
	}
	inf := math.Inf(1)
	tests := []struct {
		name string
		rtts []store.RTT
		want float64
	}{
		{"one end, unreachable", []store.RTT{unreachable("a", "b", now)}, inf},
		{"unreachable wins over the other end's rtt", []store.RTT{unreachable("a", "b", now), at("b", "a", 10, 0)}, inf},
		{"both ends unreachable", []store.RTT{unreachable("a", "b", now), unreachable("b", "a", now)}, inf},
		{"newer rtt replaces unreachable", []store.RTT{unreachable("a", "b", now), at("a", "b", 12, time.Second), at("b", "a", 10, 0)}, 11},
		{"newer unreachable replaces rtt", []store.RTT{at("a", "b", 12, 0), unreachable("a", "b", now.Add(time.Second))}, inf},
		{"older unreachable is ignored", []store.RTT{unreachable("a", "b", now.Add(-time.Second)), at("a", "b", 12, 0)}, 12},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := BuildMatrix(feps, tc.rtts)
			if got := m.RTT[0][1]; got != tc.want || m.RTT[1][0] != tc.want {
				t.Errorf("a-b = %v / %v; want %v", got, m.RTT[1][0], tc.want)
			}
		})
	}
	reach := BuildMatrix(feps, []store.RTT{at("a", "b", 10, 0)})
	gone := BuildMatrix(feps, []store.RTT{at("a", "b", 10, 0), unreachable("b", "a", now)})
	if !Significant(reach, gone, 0.1, 2) || !Significant(gone, reach, 0.1, 2) {
		t.Error("a pair becoming unreachable (or reachable again) is not a significant change")
	}
}

// TestUnmeasuredPairIsNoHop checks that only the direct InP -> EgP
// connection is estimated from coordinates: a pair nobody measured is never
// an inter-proxy hop, however short its estimate.
func TestUnmeasuredPairIsNoHop(t *testing.T) {
	st := openBolt(t)
	// a, b, c are 70 km apart (estimates of a few ms); a-b measured 1 ms,
	// a-c 50 ms, b-c never measured.
	c := computed(t, st, line[:3], []store.RTT{sample("a", "b", 1), sample("a", "c", 50)})
	tab := decodeTable(t, c, "a")
	for _, size := range []int64{14_000, 15_000_000} {
		if got := pathOf(tab, "a", "c", size); !slices.Equal(got, []string{"a", "c"}) {
			t.Errorf("a -> c (%d B) = %v; want [a c] (b-c is unmeasured, no hop)", size, got)
		}
	}
	for _, lop := range []string{"a", "b", "c"} {
		for _, e := range decodeTable(t, c, lop).Table.Chains {
			for k := 1; k < len(e.Path); k++ {
				if p := [2]string{e.Path[k-1], e.Path[k]}; len(e.Path) > 2 && (p == [2]string{"b", "c"} || p == [2]string{"c", "b"}) {
					t.Errorf("table %s: chain %v uses the unmeasured pair b-c as a hop", lop, e.Path)
				}
			}
		}
	}
}

// TestUnreachablePeerLeavesChains runs a controller: a chain through x; x's
// neighbours report it unreachable, the next table avoids x at once; x
// answers again, and chains may go through it again.
func TestUnreachablePeerLeavesChains(t *testing.T) {
	// a, x, y, c close together; a-x-c 20 ms, a-y-c 30 ms, a-c 50 ms.
	feps := []api.FEP{fepAt("a", 50, 8), fepAt("c", 50, 9), fepAt("x", 50, 10), fepAt("y", 50, 11)}
	st := openBolt(t)
	setup(t, st, feps, []store.RTT{
		sample("a", "x", 10), sample("x", "c", 10), sample("a", "y", 15), sample("y", "c", 15), sample("a", "c", 50),
	})
	c, err := New(Config{Store: st, Debounce: 50 * time.Millisecond, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.computed = make(chan uint64, 16)
	run(t, c)
	ctx := testCtx(t)
	waitComputed := func(what string) {
		t.Helper()
		select {
		case <-c.computed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no computation after %s", what)
		}
	}
	wantPath := func(want []string) {
		t.Helper()
		tab := decodeTable(t, c, "a")
		for _, size := range []int64{14_000, 15_000_000} {
			if got := pathOf(tab, "a", "c", size); !slices.Equal(got, want) {
				t.Errorf("a -> c (%d B) = %v; want %v", size, got, want)
			}
		}
	}
	report := func(from string, s api.Sample, wantChanged int) {
		t.Helper()
		res, err := c.Report(ctx, api.Report{FEP: from, Samples: []api.Sample{s}})
		if err != nil {
			t.Fatalf("report %s -> %s: %v", from, s.Peer, err)
		}
		if res.Changed != wantChanged || res.Accepted != 1 {
			t.Errorf("report %s -> %+v: %+v; want accepted 1, changed %d", from, s, res, wantChanged)
		}
	}
	waitComputed("taking the lead")
	wantPath([]string{"a", "x", "c"})

	report("a", api.Sample{Peer: "x", Unreachable: true}, 1)
	report("c", api.Sample{Peer: "x", Unreachable: true}, 1)
	report("c", api.Sample{Peer: "x", Unreachable: true}, 0) // the same state again: no change
	waitComputed("x unreachable")
	// The second report may land in a second computation.
	deadline := time.Now().Add(5 * time.Second)
	for {
		tab := decodeTable(t, c, "a")
		if p := pathOf(tab, "a", "c", 14_000); slices.Equal(p, []string{"a", "y", "c"}) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantPath([]string{"a", "y", "c"})
	for _, lop := range []string{"a", "c", "y"} {
		for _, e := range decodeTable(t, c, lop).Table.Chains {
			if len(e.Path) > 2 && slices.Contains(e.Path[1:len(e.Path)-1], "x") {
				t.Errorf("table %s: chain %v goes through the unreachable x", lop, e.Path)
			}
		}
	}
	m, err := c.Matrix(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.RTTMS[0][2] != nil { // a -> x
		t.Errorf("matrix a -> x = %v; want none (unreachable)", *m.RTTMS[0][2])
	}

	// x answers again: its RTT counts at once.
	report("a", api.Sample{Peer: "x", RTTMS: 10}, 1)
	report("c", api.Sample{Peer: "x", RTTMS: 10}, 1)
	deadline = time.Now().Add(10 * time.Second)
	for {
		tab := decodeTable(t, c, "a")
		if p := pathOf(tab, "a", "c", 14_000); slices.Equal(p, []string{"a", "x", "c"}) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantPath([]string{"a", "x", "c"})
}

// TestUnreachableDirectNotEstimated checks that a direct InP -> EgP pair
// reported unreachable is not estimated from coordinates like a pair never
// measured: a measured chain is taken, the direct path only when there is
// none.
func TestUnreachableDirectNotEstimated(t *testing.T) {
	now := time.Now()
	// a, b, c are 70 km apart: an estimated a-c (about 2 ms) beats the
	// measured a-b-c (20 ms).
	tests := []struct {
		name string
		rtts []store.RTT
		want []string
	}{
		{"a-c unmeasured: estimated direct", []store.RTT{sample("a", "b", 10), sample("b", "c", 10)}, []string{"a", "c"}},
		{"a-c unreachable: the measured chain", []store.RTT{sample("a", "b", 10), sample("b", "c", 10), unreachable("a", "c", now)}, []string{"a", "b", "c"}},
		{"a-c unreachable, no chain: direct", []store.RTT{sample("a", "b", 10), unreachable("c", "a", now)}, []string{"a", "c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := openBolt(t)
			c := computed(t, st, line[:3], tc.rtts)
			tab := decodeTable(t, c, "a")
			for _, size := range []int64{14_000, 15_000_000} {
				if got := pathOf(tab, "a", "c", size); !slices.Equal(got, tc.want) {
					t.Errorf("a -> c (%d B) = %v; want %v", size, got, tc.want)
				}
			}
		})
	}
	// Unmeasured -> unreachable changes the tables although both are +Inf.
	rtts := []store.RTT{sample("a", "b", 10), sample("b", "c", 10)}
	if !Significant(BuildMatrix(line[:3], rtts), BuildMatrix(line[:3], append(rtts, unreachable("a", "c", now))), 0.1, 2) {
		t.Error("an unmeasured pair reported unreachable is not a significant change")
	}
}
