package pathcomp

import (
	"math"
	"slices"
	"testing"
)

func TestMerge(t *testing.T) {
	hops := []LossHop{{10, 0.01}, {20, 0}, {30, 0.02}}
	got := Merge(hops, []bool{false, true})
	want := []LossHop{{30, 0.01}, {30, 0.02}}
	if len(got) != 2 || got[0].RTT != want[0].RTT || math.Abs(got[0].Loss-want[0].Loss) > 1e-12 || got[1].RTT != 30 || math.Abs(got[1].Loss-0.02) > 1e-12 {
		t.Errorf("Merge = %v; want %v", got, want)
	}
	all := Merge(hops, []bool{false, false})
	if len(all) != 1 || all[0].RTT != 60 || math.Abs(all[0].Loss-(1-0.99*0.98)) > 1e-12 {
		t.Errorf("Merge(none active) = %v; want one 60 ms segment with compounded loss", all)
	}
}

func TestSegmentRateMathis(t *testing.T) {
	m := LossModel{}
	// MSS*sqrt(1.5)/(RTT*sqrt(p)): 1460*1.2247/(100*0.1) = 178.8 B/ms at 1%.
	if got := m.SegmentRate(LossHop{100, 0.01}); math.Abs(got-1460*math.Sqrt(1.5)/10) > 1e-9 {
		t.Errorf("SegmentRate(100 ms, 1%%) = %v B/ms", got)
	}
	if got := m.SegmentRate(LossHop{100, 0}); !math.IsInf(got, 1) {
		t.Errorf("SegmentRate without loss or rate = %v; want +Inf", got)
	}
	m.RateMbit = 100
	if got := m.SegmentRate(LossHop{1, 1e-8}); got != 12500 {
		t.Errorf("SegmentRate at 100 Mbit/s, tiny loss = %v B/ms; want 12500 (the link)", got)
	}
}

func TestLossTimeAgreesWithCost(t *testing.T) {
	// Without loss and rate, one segment: slow start as in Cost, within
	// the fluid model's rounding (a round of the discrete model is a
	// whole RTT).
	var m LossModel
	for _, size := range []int64{14_600, 450_000, 14_935_000} {
		got, err := m.Time([]LossHop{{100, 0}}, size)
		if err != nil {
			t.Fatal(err)
		}
		r := m.Rounds(size)
		want := m.Cost(Chain{Sum: 100, Max: 100}, r)
		if got < want-100 || got > want+100 {
			t.Errorf("Time(100 ms, %d B) = %.0f ms; want within one RTT of Cost %.0f (%d rounds)", size, got, want, r)
		}
	}
}

func TestLossTimeSegmentation(t *testing.T) {
	m := LossModel{RateMbit: 100}
	const size = 50 << 20
	lossy := []LossHop{{100, 0.01}, {100, 0.01}}
	e2e, _ := m.Time(Merge(lossy, []bool{false}), size)
	tts, _ := m.Time(Merge(lossy, []bool{true}), size)
	// Mathis: halving the RTT and the loss of each segment more than
	// doubles the bound; both still under the link rate.
	if tts >= e2e/2 {
		t.Errorf("lossy 2x100 ms: split %.0f ms vs end-to-end %.0f ms; want < half", tts, e2e)
	}
	clean := []LossHop{{1, 0}, {1, 0}}
	e2e, _ = m.Time(Merge(clean, []bool{false}), size)
	tts, _ = m.Time(Merge(clean, []bool{true}), size)
	// Rate-limited and clean: both at the link rate.
	if math.Abs(tts-e2e)/e2e > 0.02 {
		t.Errorf("clean 2x1 ms at 100 Mbit/s: split %.0f vs %.0f ms; want equal within 2%%", tts, e2e)
	}
	if want := float64(size) / 12500; e2e < want || e2e > want*1.05 {
		t.Errorf("clean transfer took %.0f ms; want about size/rate = %.0f", e2e, want)
	}
}

func TestBestSplit(t *testing.T) {
	m := LossModel{RateMbit: 100}
	hops := []LossHop{{50, 0.01}, {50, 0.01}, {50, 0.01}, {50, 0.01}}
	act, tAll, err := m.BestSplit(hops, 50<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(act, []bool{true, true, true}) {
		t.Errorf("BestSplit(4 equal lossy hops) = %v; want every relay", act)
	}
	act1, t1, _ := m.BestSplit(hops, 50<<20, 1)
	if !slices.Equal(act1, []bool{false, true, false}) {
		t.Errorf("BestSplit(one point) = %v; want the middle relay", act1)
	}
	if t1 <= tAll {
		t.Errorf("one point %.0f ms <= three points %.0f ms; want more points faster", t1, tAll)
	}
	// Clean path at the link rate: no relay helps a large transfer, and
	// the tie goes to fewer relays.
	act, _, _ = m.BestSplit([]LossHop{{1, 0}, {1, 0}}, 50<<20, 0)
	if act[0] {
		t.Errorf("BestSplit(clean) = %v; want no relay", act)
	}
	// Loss only on the last hop: split right before it.
	act, _, _ = m.BestSplit([]LossHop{{80, 0}, {80, 0}, {2, 0.02}}, 50<<20, 1)
	if !slices.Equal(act, []bool{false, true}) {
		t.Errorf("BestSplit(lossy last mile, one point) = %v; want the relay before the lossy hop", act)
	}
	for _, bad := range [][]LossHop{nil, {{0, 0}}, {{10, 1}}, {{10, -0.1}}, {{math.NaN(), 0}}, make([]LossHop, MaxLossHops+1)} {
		if _, _, err := m.BestSplit(bad, 1000, 0); err == nil {
			t.Errorf("BestSplit(%v) = nil error; want one", bad)
		}
	}
	if _, err := m.Time([]LossHop{{10, 0}}, 0); err == nil {
		t.Error("Time(size 0) = nil error; want one")
	}
}

// FuzzBestSplit: the chosen split is never slower than end to end or than
// any single relay, and times are finite and positive.
func FuzzBestSplit(f *testing.F) {
	f.Add(10.0, 0.01, 50.0, 0.0, 5.0, 0.02, int64(1_000_000), 100.0)
	f.Add(1.0, 0.0, 1.0, 0.0, 1.0, 0.0, int64(1), 0.0)
	f.Fuzz(func(t *testing.T, r1, p1, r2, p2, r3, p3 float64, size int64, rate float64) {
		hops := []LossHop{{r1, p1}, {r2, p2}, {r3, p3}}
		if checkHops(hops) != nil || size <= 0 || size > 1<<40 || !(rate >= 0 && rate < 1e6) {
			return
		}
		m := LossModel{RateMbit: rate}
		act, best, err := m.BestSplit(hops, size, 0)
		if err != nil {
			t.Fatal(err)
		}
		if math.IsNaN(best) || math.IsInf(best, 0) || best <= 0 {
			t.Fatalf("BestSplit time %v", best)
		}
		for _, a := range [][]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			tm, err := m.Time(Merge(hops, a), size)
			if err != nil {
				t.Fatal(err)
			}
			if best > tm*1.0011 {
				t.Fatalf("BestSplit chose %v (%v ms) but %v takes %v ms", act, best, a, tm)
			}
		}
	})
}
