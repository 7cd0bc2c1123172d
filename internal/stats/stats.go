package stats

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrEmpty is returned when a statistic needs at least one sample.
var ErrEmpty = errors.New("stats: no samples")

// Mean returns the arithmetic mean of xs, or NaN when xs is empty.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// SD returns the sample standard deviation of xs (divisor n-1). It is 0 for a
// single sample and NaN for none.
func SD(xs []float64) float64 {
	switch len(xs) {
	case 0:
		return math.NaN()
	case 1:
		return 0
	}
	m := Mean(xs)
	var s float64
	for _, x := range xs {
		d := x - m
		s += d * d
	}
	return math.Sqrt(s / float64(len(xs)-1))
}

// Percentile returns the p-th percentile (0 <= p <= 100) of xs by linear
// interpolation between closest ranks (the "type 7" definition used by R and
// NumPy by default). It returns NaN when xs is empty or p is out of range.
// xs is not modified.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 || math.IsNaN(p) || p < 0 || p > 100 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []float64, p float64) float64 {
	h := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(h))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[lo] + (h-float64(lo))*(s[lo+1]-s[lo])
}

// Median returns the 50th percentile of xs.
func Median(xs []float64) float64 { return Percentile(xs, 50) }

// Summary describes one sample.
type Summary struct {
	N      int
	Mean   float64
	SD     float64
	Min    float64
	P5     float64
	Median float64
	P95    float64
	Max    float64
}

// Summarize computes a Summary of xs.
func Summarize(xs []float64) (Summary, error) {
	if len(xs) == 0 {
		return Summary{}, ErrEmpty
	}
	for i, x := range xs {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return Summary{}, fmt.Errorf("stats: sample %d is %v", i, x)
		}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Summary{
		N:      len(s),
		Mean:   Mean(s),
		SD:     SD(s),
		Min:    s[0],
		P5:     percentileSorted(s, 5),
		Median: percentileSorted(s, 50),
		P95:    percentileSorted(s, 95),
		Max:    s[len(s)-1],
	}, nil
}

// A12 returns the Vargha-Delaney effect size of x1 against x2: the
// probability that a value drawn from x1 is larger than one drawn from x2,
// ties counting one half. A12 < 0.5 means x1 tends to be smaller (for
// transfer times: faster), 0.5 means no difference, > 0.5 means x2 tends to
// be smaller. It returns NaN when either sample is empty.
func A12(x1, x2 []float64) float64 {
	if len(x1) == 0 || len(x2) == 0 {
		return math.NaN()
	}
	// Rank-sum form: A12 = (R1/n1 - (n1+1)/2) / n2, O((n1+n2) log(n1+n2)).
	n1, n2 := float64(len(x1)), float64(len(x2))
	r1, _ := rankSum(x1, x2)
	return (r1/n1 - (n1+1)/2) / n2
}

// rankSum returns the sum of the mid-ranks of x1 within the pooled sample
// x1 ∪ x2, and the tie term Σ(t³-t) over groups of tied values.
func rankSum(x1, x2 []float64) (r1, ties float64) {
	type obs struct {
		v     float64
		first bool
	}
	all := make([]obs, 0, len(x1)+len(x2))
	for _, v := range x1 {
		all = append(all, obs{v, true})
	}
	for _, v := range x2 {
		all = append(all, obs{v, false})
	}
	slices.SortFunc(all, func(a, b obs) int {
		switch {
		case a.v < b.v:
			return -1
		case a.v > b.v:
			return 1
		}
		return 0
	})
	for i := 0; i < len(all); {
		j := i + 1
		for j < len(all) && all[j].v == all[i].v {
			j++
		}
		// Positions i..j-1 (0-based) share the mid-rank of ranks i+1..j.
		mid := float64(i+1+j) / 2
		for k := i; k < j; k++ {
			if all[k].first {
				r1 += mid
			}
		}
		t := float64(j - i)
		ties += t*t*t - t
		i = j
	}
	return r1, ties
}

// MannWhitney is the result of a two-sided Mann-Whitney U test.
type MannWhitney struct {
	U1, U2 float64 // U statistics of the first and second sample; U1+U2 = n1*n2
	Z      float64 // normal-approximation z (continuity-corrected, tie-corrected); 0 when exact
	P      float64 // two-sided p-value
	Exact  bool    // P comes from the exact distribution of U
}

// maxExact bounds n1*n2 for the exact distribution; larger samples use the
// normal approximation, which is accurate there.
const maxExact = 400

// MannWhitneyU tests whether x1 and x2 come from the same distribution
// against the two-sided alternative that one is stochastically larger. U1
// counts the pairs (a in x1, b in x2) with a > b, ties counting one half.
// Without ties and with n1*n2 <= 400 the p-value is exact; otherwise it is
// the normal approximation with tie correction of the variance and a
// continuity correction of 0.5.
func MannWhitneyU(x1, x2 []float64) (MannWhitney, error) {
	if len(x1) == 0 || len(x2) == 0 {
		return MannWhitney{}, ErrEmpty
	}
	for _, xs := range [][]float64{x1, x2} {
		for i, x := range xs {
			if math.IsNaN(x) {
				return MannWhitney{}, fmt.Errorf("stats: sample %d is NaN", i)
			}
		}
	}
	n1, n2 := len(x1), len(x2)
	r1, ties := rankSum(x1, x2)
	fn1, fn2 := float64(n1), float64(n2)
	u1 := r1 - fn1*(fn1+1)/2
	res := MannWhitney{U1: u1, U2: fn1*fn2 - u1}
	if ties == 0 && n1*n2 <= maxExact {
		res.Exact = true
		res.P = exactP(n1, n2, math.Min(res.U1, res.U2))
		return res, nil
	}
	n := fn1 + fn2
	variance := fn1 * fn2 / 12 * ((n + 1) - ties/(n*(n-1)))
	if variance <= 0 {
		// Every value is the same: no evidence of any difference.
		res.P = 1
		return res, nil
	}
	d := math.Abs(u1-fn1*fn2/2) - 0.5
	if d < 0 {
		d = 0
	}
	res.Z = d / math.Sqrt(variance)
	if u1 < fn1*fn2/2 {
		res.Z = -res.Z
	}
	res.P = math.Min(1, math.Erfc(math.Abs(res.Z)/math.Sqrt2))
	return res, nil
}

// exactP returns the two-sided exact p-value min(1, 2·P(U <= u)) for samples
// of sizes n1 and n2 without ties. It counts, with the recurrence
// c(n1, n2, u) = c(n1-1, n2, u-n2) + c(n1, n2-1, u), the arrangements whose
// U equals each value.
func exactP(n1, n2 int, u float64) float64 {
	maxU := n1 * n2
	// prev[j][k]: number of arrangements of i first-sample and j second-sample
	// values with U = k, built up over i.
	prev := make([][]float64, n2+1)
	for j := range prev {
		prev[j] = make([]float64, maxU+1)
		prev[j][0] = 1 // i = 0: U is always 0
	}
	for i := 1; i <= n1; i++ {
		cur := make([][]float64, n2+1)
		for j := range cur {
			cur[j] = make([]float64, maxU+1)
		}
		cur[0][0] = 1
		for j := 1; j <= n2; j++ {
			for k := 0; k <= i*j; k++ {
				// The largest of the i+j values is from sample 1 (it beats all j
				// values of sample 2) or from sample 2.
				v := cur[j-1][k]
				if k >= j {
					v += prev[j][k-j]
				}
				cur[j][k] = v
			}
		}
		prev = cur
	}
	counts := prev[n2]
	var total, tail float64
	for k, c := range counts {
		total += c
		if float64(k) <= u+1e-9 {
			tail += c
		}
	}
	return math.Min(1, 2*tail/total)
}
