package pathcomp

import (
	"fmt"
	"math"
)

// Chain is a chain of proxies from one location to another: the locations it
// visits, the sum and the maximum of the RTTs of its links, in milliseconds.
type Chain struct {
	Path []int // location indices, From .. To inclusive
	Sum  float64
	Max  float64
}

// Proxies returns the number of intermediate locations of c (0 for a direct
// connection or an empty chain).
func (c Chain) Proxies() int {
	if len(c.Path) < 2 {
		return 0
	}
	return len(c.Path) - 2
}

// Cost returns the predicted transfer time in milliseconds of a transfer of
// rounds slow-start rounds over c: 1/2*Sum + (rounds-1)*Max. A rounds value
// below 1 counts as 1.
func (m Model) Cost(c Chain, rounds int) float64 {
	if rounds < 1 {
		rounds = 1
	}
	return 0.5*c.Sum + float64(rounds-1)*c.Max
}

// Options configures Precompute.
type Options struct {
	Model Model // used by BuildTable to map sizes to rounds
	// Plain selects the Theta(n^2 m) dynamic program that updates every pair
	// for every link, without the A_h/B_h pruning. It computes the same
	// fronts; it exists for tests and benchmarks.
	Plain bool
	// MaxProxies bounds the intermediate locations of every chain (at most
	// MaxProxies+1 links); 0 means unlimited. The fronts are then the exact
	// hop-bounded Pareto fronts (see Precompute). At most MaxProxiesLimit.
	MaxProxies int
}

// Limits of the precomputation. RTTs are quantised to whole microseconds and
// a path's (sum, hops) is packed into one int64 key, which bounds both.
const (
	// MaxLocations is the largest number of locations Precompute accepts.
	MaxLocations = 4096
	// MaxRTT is the largest finite RTT, in milliseconds, Precompute accepts
	// (about 66 minutes: in microseconds it fits a uint32).
	MaxRTT = 4e6
	// MaxProxiesLimit is the largest Options.MaxProxies Precompute accepts.
	MaxProxiesLimit = 14
)

const (
	hopBits       = 13 // hop counts of candidate walks stay below 2*MaxLocations
	hopMask       = 1<<hopBits - 1
	infKey  int64 = 1 << 61
	// plPairShift places the pair index above 24 bits of link index and
	// orientation and hopBits of hop count in an event log word.
	plPairShift = 24 + hopBits
)

// micros quantises an RTT in milliseconds to whole microseconds.
func micros(ms float64) int64 { return int64(math.Round(ms * 1000)) }

// millis converts microseconds back to milliseconds.
func millis(us int64) float64 { return float64(us) / 1000 }

// checkMatrix validates rtt for the planner: square, at most MaxLocations,
// entries >= 0 and <= MaxRTT or +Inf, symmetric. The diagonal is ignored.
func checkMatrix(rtt [][]float64) error {
	n := len(rtt)
	if n > MaxLocations {
		return fmt.Errorf("pathcomp: %d locations; at most %d are supported", n, MaxLocations)
	}
	for i, row := range rtt {
		if len(row) != n {
			return fmt.Errorf("pathcomp: rtt row %d has %d entries, want %d", i, len(row), n)
		}
	}
	for i, row := range rtt {
		for j, v := range row {
			if i == j {
				continue
			}
			switch {
			case math.IsNaN(v) || v < 0:
				return fmt.Errorf("pathcomp: rtt[%d][%d] = %v; want >= 0 or +Inf", i, j, v)
			case v > MaxRTT && !math.IsInf(v, 1):
				return fmt.Errorf("pathcomp: rtt[%d][%d] = %v ms exceeds the maximum %v ms", i, j, v, float64(MaxRTT))
			case v != rtt[j][i] && !(math.IsNaN(rtt[j][i])):
				return fmt.Errorf("pathcomp: rtt is not symmetric: rtt[%d][%d] = %v, rtt[%d][%d] = %v", i, j, v, j, i, rtt[j][i])
			}
		}
	}
	return nil
}
