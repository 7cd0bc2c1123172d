package scenario

import (
	"math"
	"testing"
)

// TestFetchTimeLegs checks the fetch model of each mode's data path on a
// hand-made world: the client 11.7 ms from the InP (FEP, tuned to 10000
// segments), a 60 + 40 ms chain of pooled FEP hops, the origin 3 ms from
// the EgP on a pooled connection, and the origin 149 ms from the client.
// An untuned host's window is 10 segments, so the client's segment ramps
// from 10 (its receive window) whatever the InP's window.
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
		return linkProps{rttMS: rtt[[2]string{a, b}], loss: loss, rateBps: rate, window: min(w(a), w(b))}
	}
	chain := []leg{{server: "inp", client: "client"}, {server: "mid", client: "inp", open: true}, {server: "egp", client: "mid", open: true}, {server: "origin", client: "egp", open: true}}
	direct := []leg{{server: "origin", client: "client"}}
	warm := []leg{{server: "inp", client: "client"}, {server: "origin", client: "inp", open: true, warm: true}}
	path := 11.7 + 60 + 40 + 3
	for _, tc := range []struct {
		name       string
		legs       []leg
		size       int64
		loss, rate float64
		want       float64
	}{
		// 10 KB fits every first window: the client's handshake + the path's RTT.
		{"chain one round", chain, 10_000, 0, 0, 11.7 + path},
		// 500 KB: 6 rounds from 10 x 1460 bytes (14.6, 43.8, 102, 219, 453, 920 KB) on
		// the client's segment and on the origin's; the hops' 10000 segments need one.
		{"chain client rounds", chain, 500_000, 0, 0, 11.7 + path + 5*11.7},
		{"direct", direct, 500_000, 0, 0, 2*149 + 5*149},
		{"warm front-end", warm, 500_000, 0, 0, 11.7 + 11.7 + 140 + 5*11.7},
		{"rate", chain, 1_000_000, 0, 125e6, 11.7 + path + 6*11.7 + 8},
		// 1% loss on every segment: 343 packets of 500 KB, 3.43 lost on each, RTT / 4 each.
		{"loss", chain, 500_000, 0.01, 0, 11.7 + path + 5*11.7 + 343*0.01*path/4},
	} {
		loss, rate = tc.loss, tc.rate
		if got := fetchTime(tc.legs, tc.size, link); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: fetchTime = %v ms; want %v", tc.name, got, tc.want)
		}
	}
}
