package pathcomp

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// This file extends the chain model with loss, for transparent
// transmission segmentation (seed 002, docs/tts.md): which of the relays on
// a path to activate, given each hop's RTT and loss.
//
// Each segment (the part of the path between two active relays, or an end)
// runs its own TCP connection. Its rate grows by slow start from ICW
// segments per RTT, doubling every RTT, up to the smaller of the link rate
// and the Mathis et al. bound MSS*C/(RTT*sqrt(p)) of a loss-based
// congestion control (Reno, CUBIC) at loss p. Relays forward as they
// receive, so the chain delivers at the rate of its slowest segment at every
// instant; the first byte arrives after half the chain's RTT sum (the
// one-way delay, as in Cost). A segment's loss compounds the loss of the
// hops it spans (1 - prod(1 - p)), and its RTT is their sum. BBR does not
// back off on random loss below ~20%: the bound does not describe it.

// LossHop is one hop of a path between two points where a relay may
// split: its RTT in milliseconds and its loss probability (0..1) per packet.
type LossHop struct {
	RTT  float64
	Loss float64
}

// LossModel is the transfer-time model with loss.
type LossModel struct {
	Model            // ICW and MSS
	RateMbit float64 // rate of every segment (its bottleneck); 0 = unlimited
	// C is the constant of the Mathis bound; 0 means sqrt(3/2).
	C float64
}

// MaxLossHops bounds the hops BestSplit accepts (it tries every subset of
// the relays between them).
const MaxLossHops = 16

func (m LossModel) consts() (icw, mss, c float64) {
	icw, mss, c = float64(m.ICW), float64(m.MSS), m.C
	if icw <= 0 {
		icw = 10
	}
	if mss <= 0 {
		mss = 1460
	}
	if c <= 0 {
		c = math.Sqrt(1.5)
	}
	return
}

// SegmentRate returns the steady-state rate bound of one segment in bytes
// per millisecond: min(link rate, MSS*C/(RTT*sqrt(loss))); +Inf when the
// segment has neither loss nor a rate.
func (m LossModel) SegmentRate(s LossHop) float64 {
	_, mss, c := m.consts()
	r := math.Inf(1)
	if m.RateMbit > 0 {
		r = m.RateMbit * 1e6 / 8 / 1000
	}
	if s.Loss > 0 && s.RTT > 0 {
		r = math.Min(r, mss*c/(s.RTT*math.Sqrt(s.Loss)))
	}
	return r
}

// Merge returns the segments of a path whose relays active[i] (between hop
// i and hop i+1) are on: hops between two active relays merge (RTTs add,
// losses compound). len(active) must be len(hops)-1.
func Merge(hops []LossHop, active []bool) []LossHop {
	var out []LossHop
	cur := LossHop{}
	keep := 1.0
	for i, h := range hops {
		cur.RTT += h.RTT
		keep *= 1 - h.Loss
		if i == len(hops)-1 || active[i] {
			cur.Loss = 1 - keep
			out = append(out, cur)
			cur, keep = LossHop{}, 1
		}
	}
	return out
}

func checkHops(hops []LossHop) error {
	if len(hops) == 0 {
		return errors.New("pathcomp: no hops")
	}
	for i, h := range hops {
		if math.IsNaN(h.RTT) || math.IsInf(h.RTT, 0) || h.RTT <= 0 || h.RTT > MaxRTT {
			return fmt.Errorf("pathcomp: hop %d: RTT %v ms; want > 0 and <= %v", i, h.RTT, MaxRTT)
		}
		if math.IsNaN(h.Loss) || h.Loss < 0 || h.Loss >= 1 {
			return fmt.Errorf("pathcomp: hop %d: loss %v; want 0 <= loss < 1", i, h.Loss)
		}
	}
	return nil
}

// Time returns the predicted time in milliseconds to deliver size bytes
// over the segments segs (each its own TCP connection, relays in between).
func (m LossModel) Time(segs []LossHop, size int64) (float64, error) {
	if err := checkHops(segs); err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, fmt.Errorf("pathcomp: size %d; want > 0", size)
	}
	icw, mss, _ := m.consts()
	first, minRTT, ramp := 0.0, math.Inf(1), 0.0
	caps := make([]float64, len(segs))
	for i, s := range segs {
		first += s.RTT / 2
		minRTT = math.Min(minRTT, s.RTT)
		caps[i] = m.SegmentRate(s)
		if !math.IsInf(caps[i], 1) {
			// Rounds until slow start reaches the cap.
			ramp = math.Max(ramp, s.RTT*math.Max(0, math.Log2(caps[i]*s.RTT/(icw*mss))))
		} else {
			ramp = math.Inf(1)
		}
	}
	rate := func(t float64) float64 {
		r := math.Inf(1)
		for i, s := range segs {
			r = math.Min(r, math.Min(icw*mss*math.Exp2(t/s.RTT)/s.RTT, caps[i]))
		}
		return r
	}
	// Integrate the chain's rate through the slow-start ramp, then finish
	// at the steady rate.
	left, t, dt := float64(size), 0.0, minRTT/64
	for left > 0 && t < ramp {
		step := math.Min(dt, ramp-t)
		r := rate(t + step/2)
		if r*step >= left {
			return first + t + left/r, nil
		}
		left -= r * step
		t += step
	}
	return first + t + left/rate(t), nil
}

// BestSplit chooses the relays to activate on a path of hops (relay i sits
// between hop i and hop i+1) with at most maxPoints active (0: no limit),
// minimising Time; it tries every subset. It returns the active set and the
// predicted time.
func (m LossModel) BestSplit(hops []LossHop, size int64, maxPoints int) ([]bool, float64, error) {
	if err := checkHops(hops); err != nil {
		return nil, 0, err
	}
	if len(hops) > MaxLossHops {
		return nil, 0, fmt.Errorf("pathcomp: %d hops; at most %d", len(hops), MaxLossHops)
	}
	n := len(hops) - 1
	if maxPoints <= 0 || maxPoints > n {
		maxPoints = n
	}
	type cand struct {
		active []bool
		t      float64
		ones   int
	}
	var cands []cand
	minT := math.Inf(1)
	for mask := uint32(0); mask < 1<<n; mask++ {
		ones := bits.OnesCount32(mask)
		if ones > maxPoints {
			continue
		}
		active := make([]bool, n)
		for i := range n {
			active[i] = mask&(1<<i) != 0
		}
		t, err := m.Time(Merge(hops, active), size)
		if err != nil {
			return nil, 0, err
		}
		cands = append(cands, cand{active, t, ones})
		minT = math.Min(minT, t)
	}
	// Among the choices within 0.1% of the fastest, the fewest relays
	// (then the fastest).
	var best cand
	for i, c := range cands {
		if c.t > minT*1.001 {
			continue
		}
		if best.active == nil || c.ones < best.ones || (c.ones == best.ones && c.t < best.t) {
			best = cands[i]
		}
	}
	return best.active, best.t, nil
}
