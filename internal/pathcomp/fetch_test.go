package pathcomp

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestFetchTimeByHand checks FetchTime's terms on cases worked out by hand.
func TestFetchTimeByHand(t *testing.T) {
	m := Model{}
	for _, tc := range []struct {
		name string
		path []Segment
		size int64
		want float64
	}{
		{"empty", nil, 1000, 0},
		// A fresh direct connection: handshake + request/first byte, 1 round.
		{"direct 10KB", []Segment{{RTT: 100}}, 10_000, 200},
		// 50 KB at 10 x 1460: 14.6, 43.8, 102.2 KB after 1, 2, 3 rounds.
		{"direct 50KB", []Segment{{RTT: 100}}, 50_000, 400},
		{"warm", []Segment{{RTT: 100, Window: WarmWindow, Open: true}}, 50_000_000, 100},
		// A window above the bandwidth-delay product: the rate alone.
		{"rate", []Segment{{RTT: 100, Window: 100000, RateBps: 1e6}}, 1_000_000, 200 + 1000},
		// From 10 segments into 1 MB/s x 100 ms = 100 KB: rounds of 14.6, 29.2, 58.4 KB,
		// then 116.8 KB >= the product: 3 rounds, then the other 897.8 KB at the rate.
		{"slow start into a rate", []Segment{{RTT: 100, Window: 10, RateBps: 1e6}}, 1_000_000, 200 + 300 + 897.8},
		// Round-limited below the product: 50 KB in 3 rounds, the last 20.8 KB at the rate.
		{"rounds below the rate", []Segment{{RTT: 100, Window: 10, RateBps: 1e6}}, 50_000, 200 + 200 + 6.2},
		// A 1 MB/s client segment fed by a 50 ms origin segment in slow start from 10
		// segments: its rounds bring 14.6, 29.2, 58.4 KB at 0, 50, 100 ms; the 456.2 KB
		// from the third round on leave at the rate after 100 ms: 100 + 456.2 ms, more than
		// either segment alone (500 ms at the rate, 250 ms of rounds).
		{"tandem", []Segment{{RTT: 100, Window: 10000, RateBps: 1e6}, {RTT: 50, Window: 10, Open: true}}, 500_000, 100 + 150 + 100 + 456.2},
		// A segment in front of the rate (nearer the client) does not feed it.
		{"tandem order", []Segment{{RTT: 50, Window: 10}, {RTT: 100, Window: 10000, RateBps: 1e6, Open: true}}, 500_000, 50 + 150 + 500},
		// 1% of 35 packets x 100 ms x LossRTTFraction.
		{"loss", []Segment{{RTT: 100, Loss: 0.01}}, 50_000, 400 + 35*0.01*100*LossRTTFraction},
		// Client 10 ms fresh (window 10: 3 rounds), hop 60 ms pooled
		// (window 1000: 1 round), origin 1 ms pooled (window 10).
		{"chain", []Segment{{RTT: 10, Window: 10}, {RTT: 60, Window: 1000, Open: true}, {RTT: 1, Window: 10, Open: true}}, 50_000,
			10 + 71 + max(2*10.0, 0, 2*1.0)},
		// A receive window of 10 triples per round: 35 packets in 10 + 30, 2 rounds, where
		// a congestion window of 10 needs 3; the smaller of the two binds each round.
		{"receive window", []Segment{{RTT: 100, Window: 10000, RecvWindow: 10}}, 50_000, 200 + 100},
		{"congestion window binds", []Segment{{RTT: 100, Window: 10, RecvWindow: 10}}, 50_000, 400},
		// Paced warm connection: 100 KB at 1 MB/s after the first byte.
		{"paced", []Segment{{RTT: 100, Window: WarmWindow, Open: true, PaceBps: 1e6}}, 100_000, 100 + 100},
		// A 200 ms pooled hop at window 10 bounds the ramp instead.
		{"slow hop", []Segment{{RTT: 10, Window: 10}, {RTT: 200, Window: 10, Open: true}}, 50_000, 10 + 210 + 400},
	} {
		if got := m.FetchTime(tc.path, tc.size); !nearFetch(got, tc.want) {
			t.Errorf("%s: %v ms, want %v", tc.name, got, tc.want)
		}
	}
}

// TestChainPathHopsRamp: a chain's hops are rebuilt from sum and max
// only; no rebuilt hop ramps longer than the largest one.
func TestChainPathHopsRamp(t *testing.T) {
	m := Model{ICW: 10}
	c := Chain{Sum: 150, Max: 50} // three hops of 50 ms
	in, out := Segment{RTT: 0}, Segment{RTT: 0, Open: true}
	// 50 KB: 3 rounds at 10 segments: ramp 2 x 50 ms.
	if got, want := m.FetchChain(c, 50_000, in, out), 150+100.0; !nearFetch(got, want) {
		t.Errorf("3 x 50 ms, 3 rounds: %v ms, want %v", got, want)
	}
	for _, p := range m.ChainPath(Chain{Sum: 7, Max: 0.5}, in, out) {
		if p.RTT > 0.5+1e-12 {
			t.Errorf("rebuilt hop of %v ms > max 0.5", p.RTT)
		}
	}
}

// TestFetchChainIsCostEnds ties the fetch model to the planner's: over a
// chain with pooled hops, a fresh client segment and a pooled origin
// segment, FetchChain is CostEnds plus the request's trip (half the whole
// path's RTT) and the client's handshake, at every size class of either
// window.
func TestFetchChainIsCostEnds(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 6))
	for k := range 2000 {
		m := Model{ICW: []int{10, 100, 10000}[k%3], MSS: []int{0, 1000, 1460}[k%3]}
		if k%2 == 0 {
			m.EndICW = []int{4, 10, 64}[k%3]
		}
		mx := rng.Float64() * 100
		c := Chain{Max: mx, Sum: mx * (1 + float64(rng.IntN(5))*rng.Float64())}
		in, out := rng.Float64()*30, rng.Float64()*30
		for _, size := range endSizes(t, Model{ICW: m.ICW, MSS: m.MSS, EndICW: max(m.EndICW, 1)}, 12) {
			got := m.FetchChain(c, size, Segment{RTT: in}, Segment{RTT: out, Open: true})
			want := m.CostEnds(c, size, in, out) + (c.Sum+in+out)/2 + in
			if math.Abs(got-want) > 0.02 { // CostEnds rounds each RTT to a microsecond, times the rounds
				t.Fatalf("model %+v chain %+v ends %v/%v size %d: FetchChain %v, CostEnds + request + handshake %v", m, c, in, out, size, got, want)
			}
		}
	}
}

// TestBestFetchBruteForce: the chain of least fetch time is a point of the
// (sum, max) front, for random matrices at sizes on both sides of every
// class boundary of both windows: BestFetch equals the least FetchChain
// over every simple path.
func TestBestFetchBruteForce(t *testing.T) {
	n := 7
	if testing.Short() {
		n = 6
	}
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 1806))
		rtt := randomMatrix(rng, n, int(seed%3), 0.25)
		m := Model{ICW: []int{10, 100, 1000}[seed%3], MSS: 1000, EndICW: []int{4, 10}[seed%2]}
		f, err := Precompute(rtt, Options{Model: m, MaxProxies: int(seed % 4)})
		if err != nil {
			t.Fatal(err)
		}
		in := Segment{RTT: []float64{0, 7.5, 40}[seed%3], Loss: []float64{0, 0.01}[seed%2], RecvWindow: []int{0, 0, 10, 4}[seed%4]}
		out := Segment{RTT: []float64{0, 3, 90}[seed%3], Open: seed%4 != 1}
		in.RateBps = []float64{0, 1e6}[seed%2]
		for i := range rtt {
			maxHops := 0
			if p := int(seed % 4); p > 0 {
				maxHops = p + 1
			}
			stats := allPathStats(rtt, i, maxHops)
			for j := range rtt {
				if i == j {
					continue
				}
				for _, size := range endSizes(t, m, 8) {
					want := -1.0
					for _, p := range stats[j] {
						c := m.FetchChain(Chain{Sum: millis(p.sum), Max: millis(p.mx)}, size, in, out)
						if want < 0 || c < want {
							want = c
						}
					}
					got, ok := f.BestFetch(i, j, size, in, out)
					if ok != (want >= 0) {
						t.Fatalf("seed %d %d->%d: BestFetch found %v, brute force %v", seed, i, j, ok, want >= 0)
					}
					if !ok {
						continue
					}
					checkPath(t, rtt, i, j, got)
					if c := m.FetchChain(got, size, in, out); !nearFetch(c, want) {
						t.Fatalf("seed %d %d->%d size %d: BestFetch's chain %v fetches in %v ms, brute force over all simple paths %v",
							seed, i, j, size, got.Path, c, want)
					}
				}
			}
		}
	}
}

// TestFetchWeighsTheRequest: the request's trip counts the chain's sum
// twice against its ramp, so the fetch can prefer a chain the paper's
// model (response only) does not: direct 100 ms against 70 + 70 ms at 2
// rounds: response only 150 vs 140 (split); with the request 200 vs 210
// (direct).
func TestFetchWeighsTheRequest(t *testing.T) {
	rtt := [][]float64{{0, 100, 70}, {100, 0, 70}, {70, 70, 0}}
	m := Model{ICW: 10}
	f, err := Precompute(rtt, Options{Model: m})
	if err != nil {
		t.Fatal(err)
	}
	size := int64(20_000) // 2 rounds
	if c, _ := f.Best(0, 1, m.Rounds(size)); len(c.Path) != 3 {
		t.Fatalf("response-only model: %v, want the split", c.Path)
	}
	end := Segment{Window: WarmWindow, Open: true}
	if c, _ := f.BestFetch(0, 1, size, end, end); len(c.Path) != 2 {
		t.Fatalf("fetch model: %v, want direct", c.Path)
	}
}

func TestCheckSegment(t *testing.T) {
	for _, s := range []Segment{{RTT: -1}, {RTT: math.NaN()}, {RTT: 2 * MaxRTT}, {Window: -1}, {RecvWindow: -1}, {PaceBps: -1}, {PaceBps: math.NaN()}, {RateBps: -1}, {Loss: 1}, {Loss: -0.1}, {Loss: math.NaN()}} {
		if CheckSegment(s) == nil {
			t.Errorf("CheckSegment(%+v) = nil", s)
		}
	}
	if err := CheckSegment(Segment{RTT: 10, Window: 10, Loss: 0.01}); err != nil {
		t.Error(err)
	}
}

func nearFetch(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(a), math.Abs(b)) }

// TestSlowStartPeak: the largest round of a slow start from 10 segments of
// 1460 bytes: 500 KB goes 14600, 29200, 58400, 116800, 233600, 47400.
func TestSlowStartPeak(t *testing.T) {
	m := Model{}
	for _, tc := range []struct {
		window int
		size   int64
		want   int64
	}{
		{10, 500_000, 233_600},
		{10, 10_000, 10_000},
		{10, 14_600, 14_600},
		{10, 14_601, 14_600},
		{0, 50_000, 29_200},
		{10, 0, 0},
		// 15 MB: rounds up to 5120 segments carry 14.94 MB, the last round 64 KB.
		{10, 15_000_000, 5120 * 1460},
	} {
		if got := m.SlowStartPeak(tc.window, tc.size); got != tc.want {
			t.Errorf("SlowStartPeak(%d, %d) = %d, want %d", tc.window, tc.size, got, tc.want)
		}
	}
}
