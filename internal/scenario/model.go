package scenario

import (
	"math"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// DefaultCoreHour is seed 001's price of a CPU core-hour: an EC2 m4.large
// (2 cores) at $0.108 an hour.
const DefaultCoreHour = 0.108 / 2

// DollarsPerTB is the CPU cost of delivering a terabyte when cpuSeconds
// of processor time delivered size bytes, at price dollars per core-hour.
func DollarsPerTB(cpuSeconds float64, size int64, price float64) float64 {
	if size <= 0 {
		return 0
	}
	return cpuSeconds / float64(size) * 1e12 / 3600 * price
}

// fetchModelDoc describes fetchModel for the report.
const fetchModelDoc = "client-InP RTT (the client's handshake) + the RTT of the whole path (client-InP + the chain's sum + EgP-origin: request out, first byte back; hops and the origin connection pooled) + max((rounds-1) x the chain's largest hop RTT, (client rounds-1) x the client-InP RTT) + size / bottleneck rate; client rounds = slow-start rounds at the client's initial receive window (an untuned client advertises 10 segments: the kernel's TCP_DEFAULT_INIT_RCVWND) + lost packets on the client's access (size/MSS x loss) x client-InP RTT / 4 (each loss holds delivery for about RACK's reordering window, min RTT / 4; BBR keeps its rate)"

// clientRwnd is the initial receive window, in segments, of a client
// host with Linux defaults (no route initrwnd): TCP_DEFAULT_INIT_RCVWND.
// It grows as data arrives, like a congestion window in slow start, so
// the segment from the InP to the client ramps from it whatever window
// the InP's own route allows.
const clientRwnd = 10

// fetchModel predicts the time of a whole fetch of size bytes through the
// chain of e (its Rounds at the planner's model): the client's handshake
// with the InP, one RTT of the whole path for the request and the first
// byte (the hops and the EgP's origin connection come from pools, so no
// other handshake), the slow-start rounds of the slowest segment (the
// chain's largest hop at the table's model, or the client's segment from
// its default receive window: the per-segment model of
// pathcomp.Model.CostEnds), and the serialization at the bottleneck rate.
func (s *Scenario) fetchModel(e pathcomp.ChainEntry, size int64) float64 {
	in := float64(s.w.RTT(s.roles.Client, s.roles.InP)) / 1e6
	out := float64(s.w.RTT(s.roles.EgP, s.roles.Origin)) / 1e6
	_, rate := s.OriginRTT()
	loss := 0.0
	if l, err := s.w.Link(s.roles.InP, s.roles.Client); err == nil {
		loss = l.LossPct / 100
	}
	return fetchTime(e, size, in, out, rate, loss)
}

// fetchTime is fetchModel from the client-InP and EgP-origin RTTs (ms),
// the bottleneck rate (bytes/s, 0: none) and the loss probability of the
// client's access link (data direction).
//
// The loss term was added for the 1%-loss world (docs/bench.md, session
// 6): the chain's time grew with the size beyond what the rounds explain,
// by about a quarter of the access RTT per lost packet (fitted over 500
// KB-15 MB, k = 0.16-0.33; RACK waits min RTT / 4 before it calls a packet
// lost, and BBR, the hosts' congestion control, does not slow down for
// random loss). A loss-based congestion control (CUBIC) would need a rate
// bound instead (pathcomp.LossModel).
func fetchTime(e pathcomp.ChainEntry, size int64, in, out, rate, loss float64) float64 {
	re := pathcomp.Model{ICW: clientRwnd}.Rounds(size)
	ms := in + in + e.SumMS + out + max(float64(max(e.Rounds-1, 0))*e.MaxMS, float64(re-1)*in)
	if rate > 0 {
		ms += float64(size) / rate * 1e3
	}
	if loss > 0 {
		packets := math.Ceil(float64(size) / 1460)
		ms += packets * loss * in / 4
	}
	return ms
}
