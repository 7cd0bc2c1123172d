package pathcomp

import (
	"fmt"
	"math"
)

// Per-segment initial windows ("pooled hops vs fresh ends", docs/planner.md).
//
// A chain's hops are the operator's: pooled connections whose window
// survived (Model.ICW, e.g. the route initcwnd of the FEPs), while the two
// end segments outside the chain (client - InP and EgP - origin) are fresh
// connections with the hosts' own windows (Model.EndICW). Each segment
// ramps up on its own, so a transfer of r_tuned rounds over the chain and
// r_end rounds over each end costs
//
//	1/2 (sum + in + out) + max((r_end - 1) max(in, out), (r_tuned - 1) max)
//
// with in, out the ends' RTTs (Model.EndRTT each in a table). This is
// nondecreasing in the chain's sum and max, so the best chain for a pair
// is still a point of its (sum, max) front and the fronts stay exact; only
// the choice among the front's points changes.

// endsOn reports whether m models the end segments apart.
func (m Model) endsOn() bool { return m.EndICW > 0 }

// EndRounds returns the slow-start rounds of size bytes over an end
// segment: Rounds with EndICW for ICW (the chain's rounds when the ends
// are not modelled).
func (m Model) EndRounds(size int64) int {
	if !m.endsOn() {
		return m.Rounds(size)
	}
	return Model{ICW: m.EndICW, MSS: m.MSS}.Rounds(size)
}

// CostEnds returns the predicted time in milliseconds of size bytes over
// chain c with end segments of RTT in and out (milliseconds): the formula
// above. With EndICW unset the ends ramp like the chain.
func (m Model) CostEnds(c Chain, size int64, in, out float64) float64 {
	return float64(m.twiceEnds(micros(c.Sum), micros(c.Max), m.Rounds(size), m.EndRounds(size), micros(in), micros(out))) / 2000
}

// twiceEnds is twice CostEnds in whole microseconds, from the chain's sum
// and max, the chain's and the ends' rounds and the ends' RTTs.
func (m Model) twiceEnds(sum, mx int64, r, re int, in, out int64) int64 {
	ends := max(in, out)
	return sum + in + out + 2*max(int64(re-1)*ends, int64(r-1)*mx)
}

// checkEnds validates the end-segment fields of a model.
func (m Model) checkEnds() error {
	if m.EndICW < 0 {
		return fmt.Errorf("pathcomp: end icw %d: want >= 0", m.EndICW)
	}
	if math.IsNaN(m.EndRTT) || m.EndRTT < 0 || m.EndRTT > MaxRTT {
		return fmt.Errorf("pathcomp: end rtt %v ms: want 0-%v", m.EndRTT, float64(MaxRTT))
	}
	if m.EndRTT > 0 && !m.endsOn() {
		return fmt.Errorf("pathcomp: end rtt %v ms without an end icw", m.EndRTT)
	}
	return nil
}

// BestEnds returns the chain from i to j of least CostEnds for size bytes
// with end RTTs in and out: the cheapest point of the pair's front (exact:
// the cost is nondecreasing in sum and max). Ties go to the smaller sum.
func (f *Fronts) BestEnds(i, j int, size int64, in, out float64) (Chain, bool) {
	front := f.Front(i, j)
	if len(front) == 0 {
		return Chain{}, false
	}
	m := f.model
	r, re := m.Rounds(size), m.EndRounds(size)
	mi, mo := micros(in), micros(out)
	best, bestCost := 0, int64(0)
	for k, c := range front {
		cost := m.twiceEnds(micros(c.Sum), micros(c.Max), r, re, mi, mo)
		if k == 0 || cost < bestCost {
			best, bestCost = k, cost
		}
	}
	return front[best], true
}
