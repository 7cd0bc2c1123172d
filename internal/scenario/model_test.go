package scenario

import (
	"math"
	"testing"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// TestFetchTimeLegs checks the fetch model of each mode's data path on a
// hand-made world: the client 11.7 ms from the InP (FEP, tuned to 10000
// segments), a 60 + 40 ms chain of pooled FEP hops, the origin 3 ms from
// the EgP on a pooled connection, and the origin 149 ms from the client.
// An untuned host's window is 10 segments, so the client's segment ramps
// from 10 (its receive window, tripling per round) whatever the InP's
// window; the origin's segment from its congestion window (10, doubling).
func TestFetchTimeLegs(t *testing.T) {
	rtt := map[[2]string]float64{
		{"inp", "client"}: 11.7, {"mid", "inp"}: 60, {"egp", "mid"}: 40, {"origin", "egp"}: 3,
		{"origin", "client"}: 149, {"origin", "inp"}: 140,
	}
	tuned := map[string]bool{"inp": true, "mid": true, "egp": true}
	var loss, rate float64
	link := func(a, b string) linkProps {
		w := func(h string) int {
			if tuned[h] {
				return 10000
			}
			return 10
		}
		return linkProps{rttMS: rtt[[2]string{a, b}], loss: loss, rateBps: rate, send: w(a), recv: w(b)}
	}
	chain := []leg{{server: "inp", client: "client"}, {server: "mid", client: "inp", open: true}, {server: "egp", client: "mid", open: true}, {server: "origin", client: "egp", open: true}}
	direct := []leg{{server: "origin", client: "client"}}
	warm := []leg{{server: "inp", client: "client"}, {server: "origin", client: "inp", open: true, warm: true}}
	restart := []leg{{server: "inp", client: "client"}, {server: "origin", client: "inp", open: true, restart: true}}
	capped := append([]leg{{server: "inp", client: "client", machineBps: 50e6}}, chain[1:]...)
	path := 11.7 + 60 + 40 + 3
	for _, tc := range []struct {
		name       string
		legs       []leg
		size       int64
		loss, rate float64
		paced      bool
		want       float64
	}{
		// 10 KB fits every first window: the client's handshake + the path's RTT.
		{"chain one round", chain, 10_000, 0, 0, false, 11.7 + path},
		// 500 KB = 343 packets: the client's receive window carries 10, 30, 90, 270: 4
		// rounds; the origin's congestion window 10, 20, 40, 80, 160, 33: 6 rounds of 3 ms;
		// the hops' 10000 segments need one.
		{"chain client rounds", chain, 500_000, 0, 0, false, 11.7 + path + 3*11.7},
		// Direct: the origin's congestion window binds (it doubles, the client's tripling
		// receive window stays ahead): 6 rounds.
		{"direct", direct, 500_000, 0, 0, false, 2*149 + 5*149},
		{"warm front-end", warm, 500_000, 0, 0, false, 11.7 + 11.7 + 140 + 3*11.7},
		// A BBR origin paces the warm connection at 2/ln 2 x the largest round of the
		// same-size fetch before: 160 x 1460 bytes per 140 ms.
		{"warm paced", warm, 500_000, 0, 0, true, 11.7 + 11.7 + 140 + max(3*11.7, 500_000/(2/math.Ln2*160*1460/140))},
		// 1 Gbit/s on every link. 1 MB = 685 packets: the client's receive window carries
		// 10, 30, 90, 270 (584 KB), all below the 11.7 ms x 125 MB/s product; the last 416
		// KB at the rate. The hops' windows are above their products: 8 ms at the rate.
		{"rate", chain, 1_000_000, 0, 125e6, false, 11.7 + path + 4*11.7 + (1_000_000-400*1460)/125e3},
		// cdn-default: the kept-alive connection restarts from the origin's 10 segments
		// (doubling: 10 .. 160, then 33 of 343 packets: 6 rounds of 140 ms); nginx's
		// receive window is already grown, so it does not bind.
		{"warm after idle", restart, 500_000, 0, 0, false, 11.7 + 11.7 + 140 + 5*140},
		// A BBR origin does not restart after idle: paced as when warm.
		{"warm after idle, BBR", restart, 500_000, 0, 0, true, 11.7 + 11.7 + 140 + max(3*11.7, 500_000/(2/math.Ln2*160*1460/140))},
		// The machine's rate on the chain's client segment (400 Mbit/s): 10 KB in one
		// round, at that rate; a smaller rate the world states wins.
		{"machine rate", capped, 10_000, 0, 0, false, 11.7 + path + 10_000/50e3},
		{"world rate below the machine's", capped, 10_000, 0, 1e6, false, 11.7 + path + 10_000/1e3},
		// 1% loss on every segment: 343 packets of 500 KB, 3.43 lost on each, a fixed
		// fraction of the segment's RTT each.
		{"loss", chain, 500_000, 0.01, 0, false, 11.7 + path + 3*11.7 + 343*0.01*path*pathcomp.LossRTTFraction},
	} {
		loss, rate = tc.loss, tc.rate
		if got := fetchTime(tc.legs, tc.size, link, tc.paced); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: fetchTime = %v ms; want %v", tc.name, got, tc.want)
		}
	}
}
