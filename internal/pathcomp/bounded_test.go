package pathcomp

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestBoundedMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	count := 2000
	switch {
	case testing.Short():
		count = 200
	case raceEnabled:
		count = 1000
	}
	for it := 0; it < count; it++ {
		n := 1 + rng.IntN(8)
		if it%50 == 0 {
			n = 9
		}
		rtt := randomMatrix(rng, n, it%3, []float64{0, 0.2, 0.5}[rng.IntN(3)])
		maxProxies := 1 + rng.IntN(4)
		f, err := Precompute(rtt, Options{MaxProxies: maxProxies, Plain: it%2 == 1})
		if err != nil {
			t.Fatal(err)
		}
		if f.MaxProxies() != maxProxies {
			t.Fatalf("MaxProxies() = %d; want %d", f.MaxProxies(), maxProxies)
		}
		checkAgainstBruteForce(t, rtt, f)
	}
}

// TestBoundedLimitsChains checks on a larger matrix that every chosen chain
// respects the bound, that pruned equals plain, and that a bound at least
// the unbounded chains' length changes nothing.
func TestBoundedLimitsChains(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, n := range []int{20, 45} {
		rtt := randomMatrix(rng, n, 2, 0.3)
		free, err := Precompute(rtt, Options{})
		if err != nil {
			t.Fatal(err)
		}
		longest := 0
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				for _, c := range free.Front(i, j) {
					longest = max(longest, c.Proxies())
				}
			}
		}
		for _, mp := range []int{1, 2, 3, longest} {
			if mp == 0 || mp > MaxProxiesLimit {
				continue
			}
			p, err := Precompute(rtt, Options{MaxProxies: mp})
			if err != nil {
				t.Fatal(err)
			}
			q, err := Precompute(rtt, Options{MaxProxies: mp, Plain: true})
			if err != nil {
				t.Fatal(err)
			}
			sameFronts(t, p, q)
			for i := 0; i < n; i++ {
				for j := 0; j < n; j++ {
					for r := 1; r <= 40; r += 3 {
						c, ok := p.Best(i, j, r)
						if !ok {
							continue
						}
						checkPath(t, rtt, i, j, c)
						if c.Proxies() > mp {
							t.Fatalf("n=%d max %d: Best(%d,%d,%d) = %v has %d proxies", n, mp, i, j, r, c, c.Proxies())
						}
						fc, _ := free.Best(i, j, r)
						if twiceCost(c, r) < twiceCost(fc, r) {
							t.Fatalf("bounded chain %v beats unbounded %v", c, fc)
						}
						if mp == longest && (twiceCost(c, r) != twiceCost(fc, r) || len(c.Path) != len(fc.Path)) {
							t.Fatalf("max %d (longest unbounded): Best(%d,%d,%d) = %v; unbounded %v", mp, i, j, r, c, fc)
						}
					}
				}
			}
		}
	}
}

func TestMaxProxiesRange(t *testing.T) {
	rtt := [][]float64{{0, 1}, {1, 0}}
	for _, mp := range []int{-1, MaxProxiesLimit + 1} {
		if _, err := Precompute(rtt, Options{MaxProxies: mp}); err == nil || !strings.Contains(err.Error(), "max proxies") {
			t.Errorf("Precompute(MaxProxies: %d) error = %v; want a max proxies error", mp, err)
		}
	}
	if _, err := Precompute(rtt, Options{MaxProxies: MaxProxiesLimit}); err != nil {
		t.Errorf("Precompute(MaxProxies: %d) = %v", MaxProxiesLimit, err)
	}
}
