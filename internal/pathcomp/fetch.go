package pathcomp

import (
	"fmt"
	"math"
)

// The fetch model: the time of a whole request and response over a data
// path of TCP segments, each with its own RTT, initial window, loss and
// state (open before the fetch, or opened by it). The chain model (Cost,
// CostEnds) is the part of it the planner needs to choose a chain: FetchTime
// of a chain with pooled hops and fresh ends is CostEnds plus the request's
// trip and the client's handshake (FetchChain, tested), which do not depend
// on the hops' maximum.

// Segment is one TCP connection of a fetch's data path, seen in the
// direction the response flows.
type Segment struct {
	RTT float64 // milliseconds
	// Window is the segment's initial window in segments: the smaller of
	// the sender's initial congestion window and the receiver's initial
	// receive window (an untuned Linux receiver advertises 10 segments
	// and grows it like slow start); 0: the model's ICW. Unlimited (a warm
	// connection whose window already holds the response) is
	// WarmWindow.
	Window int
	// Open: the connection exists before the fetch (pooled, kept alive),
	// so the fetch does not wait for its handshake.
	Open bool
	// Loss is the probability that a data packet is lost on the segment.
	Loss float64
}

// WarmWindow as a Segment.Window: the segment sends the whole response in
// its first round.
const WarmWindow = math.MaxInt32

// LossRTTFraction is the delay of in-order delivery per lost packet, as a
// fraction of the segment's RTT: a loss is declared after RACK's
// reordering window (min RTT / 4), and a congestion control that does not
// slow down for random loss (BBR) keeps its rate (docs/bench.md, session 6:
// fitted on a 1%-loss access world at 0.16-0.33; RACK's 1/4 is used). A
// loss-based congestion control would need LossModel's rate bound instead.
const LossRTTFraction = 0.25

// FetchTime returns the predicted time in milliseconds from the client's
// connect to the last byte of a response of size bytes over path (the
// client's segment first, the origin's last), with rateBps the bottleneck
// rate in bytes per second (0: none):
//
//	sum of the RTTs of the segments the fetch opens (each handshake
//	  waits for the request to reach its proxy: serial)
//	+ sum of every RTT (the request goes out, the first byte comes back)
//	+ max over segments of (rounds at the segment's window - 1) x its RTT
//	  (relays forward as they receive: the slowest ramp bounds the rest)
//	+ size / rate
//	+ sum over segments of lost packets (size / MSS x loss) x RTT x
//	  LossRTTFraction
//
// An empty path takes 0 ms.
func (m Model) FetchTime(path []Segment, size int64, rateBps float64) float64 {
	var t, ramp float64
	for _, s := range path {
		if !s.Open {
			t += s.RTT
		}
		t += s.RTT
		ramp = max(ramp, float64(m.segmentRounds(s.Window, size)-1)*s.RTT)
		if s.Loss > 0 {
			t += math.Ceil(float64(size)/float64(m.mss())) * s.Loss * s.RTT * LossRTTFraction
		}
	}
	t += ramp
	if rateBps > 0 {
		t += float64(size) / rateBps * 1e3
	}
	return t
}

// segmentRounds is Rounds with window w for the ICW (0: the model's).
func (m Model) segmentRounds(w int, size int64) int {
	if w == WarmWindow {
		return 1
	}
	if w > 0 {
		m.ICW = w
	}
	return m.Rounds(size)
}

func (m Model) mss() int {
	if m.MSS <= 0 {
		return 1460
	}
	return m.MSS
}

// ChainPath returns the data path of a fetch through chain c as the
// planner models it: the end segments in and out (their Window 0 meaning
// the model's EndICW, or its ICW when the ends are not modelled apart),
// then the chain's hops, pooled and with the model's ICW. The hops are
// given by c.Sum and c.Max only (that is all a table entry keeps): one
// segment of RTT Max and the rest split into equal segments no longer than
// Max, which is exact for FetchTime without loss on the hops (its terms are
// the sum and the largest ramp, and every hop's ramp is at most Max's).
func (m Model) ChainPath(c Chain, in, out Segment) []Segment {
	end := m.EndICW
	if end == 0 {
		end = m.ICW
	}
	if in.Window == 0 {
		in.Window = end
	}
	if out.Window == 0 {
		out.Window = end
	}
	p := []Segment{in}
	if c.Max > 0 {
		p = append(p, Segment{RTT: c.Max, Window: m.ICW, Open: true})
		if rest := c.Sum - c.Max; rest > 0 {
			n := min(math.Ceil(rest/c.Max), MaxLocations)
			for range int(n) {
				p = append(p, Segment{RTT: rest / n, Window: m.ICW, Open: true})
			}
		}
	}
	return append(p, out)
}

// FetchChain is FetchTime over ChainPath(c, in, out): the client's segment
// opened by the fetch, the origin's as given.
func (m Model) FetchChain(c Chain, size int64, in, out Segment, rateBps float64) float64 {
	return m.FetchTime(m.ChainPath(c, in, out), size, rateBps)
}

// CheckSegment validates a segment's fields.
func CheckSegment(s Segment) error {
	switch {
	case math.IsNaN(s.RTT) || s.RTT < 0 || s.RTT > MaxRTT:
		return fmt.Errorf("pathcomp: segment rtt %v ms: want 0-%v", s.RTT, float64(MaxRTT))
	case s.Window < 0:
		return fmt.Errorf("pathcomp: segment window %d: want >= 0", s.Window)
	case math.IsNaN(s.Loss) || s.Loss < 0 || s.Loss >= 1:
		return fmt.Errorf("pathcomp: segment loss %v: want 0 <= loss < 1", s.Loss)
	}
	return nil
}

// BestFetch returns the chain from i to j of least FetchChain for a fetch
// of size bytes with end segments in and out: the cheapest point of the
// pair's front (exact: FetchTime without loss on the hops is nondecreasing
// in the chain's sum and max). Ties go to the smaller sum. Unlike
// CostEnds, which counts the response's one-way trip only (the paper's
// model), the fetch counts the request's trip through the chain too, so a
// chain's sum weighs twice as much against its ramp.
func (f *Fronts) BestFetch(i, j int, size int64, in, out Segment, rateBps float64) (Chain, bool) {
	front := f.Front(i, j)
	if len(front) == 0 {
		return Chain{}, false
	}
	best, bestCost := 0, 0.0
	for k, c := range front {
		cost := f.model.FetchChain(c, size, in, out, rateBps)
		if k == 0 || cost < bestCost {
			best, bestCost = k, cost
		}
	}
	return front[best], true
}
