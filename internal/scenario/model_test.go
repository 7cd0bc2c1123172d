package scenario

import (
	"math"
	"testing"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// TestFetchTimeClientWindow: the client's segment ramps from its default
// receive window (10 segments), so past the first round a fetch over a
// one-round chain pays the client's rounds on the client-InP RTT; a client
// next to the InP pays nothing, and the chain's own rounds win when they
// are slower.
func TestFetchTimeClientWindow(t *testing.T) {
	chain := pathcomp.ChainEntry{Rounds: 1, SumMS: 100, MaxMS: 60}
	for _, tc := range []struct {
		name      string
		e         pathcomp.ChainEntry
		size      int64
		in, out   float64
		rate, wnt float64
		loss      float64
	}{
		// 10 KB fits the first window: handshake + path RTT only.
		{"one round", chain, 10_000, 11.7, 3, 0, 11.7 + 11.7 + 100 + 3, 0},
		// 500 KB: 6 rounds from 10 x 1460 bytes (14.6, 43.8, 102, 219, 453, 920 KB).
		{"client rounds", chain, 500_000, 11.7, 3, 0, 11.7 + 11.7 + 100 + 3 + 5*11.7, 0},
		{"client at the InP", chain, 500_000, 0, 3, 0, 100 + 3, 0},
		{"chain rounds slower", pathcomp.ChainEntry{Rounds: 3, SumMS: 100, MaxMS: 60}, 500_000, 11.7, 3, 0, 11.7 + 11.7 + 100 + 3 + 2*60, 0},
		{"rate", chain, 1_000_000, 0, 0, 125e6, 100 + 8, 0},
		// 1% loss: 343 packets of 500 KB, 3.43 lost, each 11.7 / 4 ms.
		{"loss", chain, 500_000, 11.7, 3, 0, 11.7 + 11.7 + 100 + 3 + 5*11.7 + 343*0.01*11.7/4, 0.01},
	} {
		if got := fetchTime(tc.e, tc.size, tc.in, tc.out, tc.rate, tc.loss); math.Abs(got-tc.wnt) > 1e-9 {
			t.Errorf("%s: fetchTime = %v ms; want %v", tc.name, got, tc.wnt)
		}
	}
}
