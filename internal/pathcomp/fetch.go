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
	// RecvWindow is the receiver's initial receive window in segments
	// when it may bind (0: never). Linux grows it by twice every segment
	// received (tcp_grow_window: rcv_ssthresh += 2 x skb->len), so it
	// triples per round (RecvGrowth) where the sender's window doubles:
	// round k carries min(Window x 2^(k-1), RecvWindow x 3^(k-1)).
	RecvWindow int
	// PaceBps is the sender's pacing rate in bytes per second on a warm
	// connection (WarmWindow) whose congestion control paces instead of
	// bursting its window (BBR: 2/ln 2 times its bandwidth estimate in
	// STARTUP); 0: not paced. The segment then takes size / PaceBps
	// after its first byte.
	PaceBps float64
	// Open: the connection exists before the fetch (pooled, kept alive),
	// so the fetch does not wait for its handshake.
	Open bool
	// Loss is the probability that a data packet is lost on the segment.
	Loss float64
	// RateBps is the segment's bottleneck rate in bytes per second (0:
	// none): once its window reaches the bandwidth-delay product the rest
	// of the response goes at this rate.
	RateBps float64
}

// WarmWindow as a Segment.Window: the segment sends the whole response in
// its first round.
const WarmWindow = math.MaxInt32

// RecvGrowth is the factor by which a receive window grows per round
// (Segment.RecvWindow).
const RecvGrowth = 3

// BBRStartupGain is BBR's pacing gain in STARTUP, 2/ln 2.
const BBRStartupGain = 2 / math.Ln2

// LossRTTFraction is the delay of in-order delivery per lost packet, as a
// fraction of the segment's RTT, for a segment whose congestion control
// does not slow down for random loss (BBR) and whose fetch is not bound by
// its rounds: an empirical constant. Fitted on the 1%-loss access world
// (11.7 ms, docs/bench.md): 25 fetches each at 5 and 15 MB in quiet windows
// gave 0.19 and 0.15 (session 9); session 6, at load 13-24, 0.16-0.33 (it
// used RACK's reordering window, min RTT / 4). A segment in slow start for
// most of its fetch pays per lossy round instead (docs/bench.md), and a
// loss-based congestion control needs LossModel's rate bound.
const LossRTTFraction = 1.0 / 6

// FetchTime returns the predicted time in milliseconds from the client's
// connect to the last byte of a response of size bytes over path (the
// client's segment first, the origin's last):
//
//	sum of the RTTs of the segments the fetch opens (each handshake
//	  waits for the request to reach its proxy: serial)
//	+ sum of every RTT (the request goes out, the first byte comes back)
//	+ max over segments of the segment's own time after its first byte
//	  (relays forward as they receive: the slowest segment bounds the
//	  rest): (rounds - 1) x RTT while its window (Window doubling,
//	  RecvWindow tripling, per round) is below the bandwidth-delay
//	  product of RateBps, the rest of the bytes at RateBps; size / PaceBps
//	  for a paced warm segment; and for a segment with a rate, the rounds
//	  of each segment behind it in series with that rate (tandemTime)
//	+ sum over segments of lost packets (size / MSS x loss) x RTT x
//	  LossRTTFraction
//
// An empty path takes 0 ms.
func (m Model) FetchTime(path []Segment, size int64) float64 {
	var t, slowest float64
	for i, s := range path {
		if !s.Open {
			t += s.RTT
		}
		t += s.RTT
		slowest = max(slowest, m.segmentTime(s, size))
		if s.RateBps > 0 {
			// The segments behind s (towards the origin) feed it in
			// rounds; what a round brings queues at s's rate.
			for _, u := range path[i+1:] {
				slowest = max(slowest, m.tandemTime(u, size, s.RateBps))
			}
		}
		if s.Loss > 0 {
			t += math.Ceil(float64(size)/float64(m.mss())) * s.Loss * s.RTT * LossRTTFraction
		}
	}
	return t + slowest
}

// segmentTime is the time in milliseconds segment s needs after its first
// byte to deliver size bytes (FetchTime).
func (m Model) segmentTime(s Segment, size int64) float64 {
	bytes := float64(size)
	if s.Window == WarmWindow {
		var t float64
		if s.PaceBps > 0 {
			t = bytes / s.PaceBps * 1e3
		}
		if s.RateBps > 0 {
			t = max(t, bytes/s.RateBps*1e3)
		}
		return t
	}
	if s.RateBps <= 0 {
		return float64(m.segmentRounds(s, size)-1) * s.RTT
	}
	mss := float64(m.mss())
	cw, rw := m.windows(s)
	bdp := s.RateBps * s.RTT / 1e3
	sent := 0.0
	for k := 0; ; k++ {
		w := min(cw, rw) * mss
		if w >= bdp || sent+w >= bytes || k >= 62 {
			// Rate-limited from here on, or the last round: the rest
			// arrives at the rate after k full rounds.
			return float64(k)*s.RTT + (bytes-sent)/s.RateBps*1e3
		}
		sent += w
		cw, rw = 2*cw, RecvGrowth*rw
	}
}

// windows returns segment s's first-round sender and receiver windows in
// segments: its own Window (else the model's ICW, else 10) and its
// RecvWindow (else unlimited).
func (m Model) windows(s Segment) (cw, rw float64) {
	cw, rw = float64(s.Window), float64(s.RecvWindow)
	if cw <= 0 {
		cw = float64(m.ICW)
	}
	if cw <= 0 {
		cw = 10
	}
	if rw <= 0 {
		rw = math.Inf(1)
	}
	return cw, rw
}

// tandemTime is the time after the first byte at which a segment of rate
// rateBps delivers the last of size bytes that reach it from segment u in
// u's rounds: the largest, over u's rounds k, of the start of round k plus
// the bytes from round k on at the rate (the bytes of the earlier rounds
// may have left before). u's own rate and pacing are left out (a warm or
// paced u brings the bytes at once or at a steady rate: size / rate).
func (m Model) tandemTime(u Segment, size int64, rateBps float64) float64 {
	bytes := float64(size)
	if u.Window == WarmWindow || u.RTT <= 0 {
		return bytes / rateBps * 1e3
	}
	mss := float64(m.mss())
	cw, rw := m.windows(u)
	var t, sent float64
	for k := 0; k < 62; k++ {
		t = max(t, float64(k)*u.RTT+(bytes-sent)/rateBps*1e3)
		w := min(cw, rw) * mss
		if sent+w >= bytes {
			break
		}
		sent += w
		cw, rw = 2*cw, RecvGrowth*rw
	}
	return t
}

// segmentRounds is the rounds of size bytes over segment s: Rounds with
// the segment's window for the ICW (0: the model's), each round limited by
// the receive window when one is given.
func (m Model) segmentRounds(s Segment, size int64) int {
	if s.Window == WarmWindow {
		return 1
	}
	if s.Window > 0 {
		m.ICW = s.Window
	}
	if s.RecvWindow <= 0 {
		return m.Rounds(size)
	}
	cw, rw := float64(m.ICW), float64(s.RecvWindow)
	if cw <= 0 {
		cw = 10
	}
	pkts := math.Ceil(float64(size) / float64(m.mss()))
	r := 1
	for sent := min(cw, rw); sent < pkts && r < 62; r++ {
		cw, rw = 2*cw, RecvGrowth*rw
		sent += min(cw, rw)
	}
	return r
}

// SlowStartPeak is the largest number of bytes one round of a slow start
// from window segments carries in a transfer of size bytes: what BBR's
// bandwidth filter holds, per RTT, after that transfer.
func (m Model) SlowStartPeak(window int, size int64) int64 {
	if window <= 0 {
		window = 10
	}
	w := int64(window) * int64(m.mss())
	var sent, peak int64
	for sent < size {
		n := min(w, size-sent)
		peak = max(peak, n)
		sent += n
		w *= 2
	}
	return peak
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

// FetchChain is FetchTime over ChainPath(c, in, out).
func (m Model) FetchChain(c Chain, size int64, in, out Segment) float64 {
	return m.FetchTime(m.ChainPath(c, in, out), size)
}

// CheckSegment validates a segment's fields.
func CheckSegment(s Segment) error {
	switch {
	case math.IsNaN(s.RTT) || s.RTT < 0 || s.RTT > MaxRTT:
		return fmt.Errorf("pathcomp: segment rtt %v ms: want 0-%v", s.RTT, float64(MaxRTT))
	case s.Window < 0 || s.RecvWindow < 0:
		return fmt.Errorf("pathcomp: segment window %d, receive window %d: want >= 0", s.Window, s.RecvWindow)
	case math.IsNaN(s.PaceBps) || s.PaceBps < 0 || math.IsNaN(s.RateBps) || s.RateBps < 0:
		return fmt.Errorf("pathcomp: segment pacing %v B/s, rate %v B/s: want >= 0", s.PaceBps, s.RateBps)
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
func (f *Fronts) BestFetch(i, j int, size int64, in, out Segment) (Chain, bool) {
	front := f.Front(i, j)
	if len(front) == 0 {
		return Chain{}, false
	}
	best, bestCost := 0, 0.0
	for k, c := range front {
		cost := f.model.FetchChain(c, size, in, out)
		if k == 0 || cost < bestCost {
			best, bestCost = k, cost
		}
	}
	return front[best], true
}
