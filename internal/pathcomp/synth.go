package pathcomp

import (
	"math"
	"math/rand/v2"
)

// SyntheticRTT returns a deterministic symmetric RTT matrix (ms) of n
// locations for benchmarks: points drawn uniformly on the sphere, RTT =
// great-circle distance at 2/3 of the speed of light, doubled, times a
// per-pair path inflation drawn from [1.2, 2.2), plus 1 ms. The inflation
// makes the triangle inequality fail for some pairs, as it does in measured
// matrices, so some chains beat the direct link.
func SyntheticRTT(n int, seed uint64) [][]float64 {
	rng := rand.New(rand.NewPCG(seed, 0x6d6f73746f))
	lat := make([]float64, n)
	lon := make([]float64, n)
	for i := range lat {
		lat[i] = math.Asin(2*rng.Float64() - 1)
		lon[i] = 2 * math.Pi * rng.Float64()
	}
	const earthKm = 6371.0
	const kmPerMs = 299792.458 * 2 / 3 / 1000 // fibre: 2/3 c, km per ms
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			km := earthKm * GreatCircle(lat[i], lon[i], lat[j], lon[j])
			v := 2*km/kmPerMs*(1.2+rng.Float64()) + 1
			v = math.Round(v*1000) / 1000
			m[i][j], m[j][i] = v, v
		}
	}
	return m
}

// GreatCircle returns the central angle in radians between two points given
// in radians (haversine formula).
func GreatCircle(lat1, lon1, lat2, lon2 float64) float64 {
	s1 := math.Sin((lat2 - lat1) / 2)
	s2 := math.Sin((lon2 - lon1) / 2)
	a := s1*s1 + math.Cos(lat1)*math.Cos(lat2)*s2*s2
	return 2 * math.Asin(math.Min(1, math.Sqrt(a)))
}

// JitteredCopies returns a deterministic symmetric n x n RTT matrix grown
// from a measured one: the first len(base) locations are base itself; each
// further location is a copy of a random base location with an access delay
// e drawn from [0.5, 5) ms. The RTT of two locations x, y copied from a, b
// is base[a][b] * (1 + u) + e_x + e_y with u drawn from [-0.05, 0.05), or
// e_x + e_y + [0, 2) ms when a == b; a missing base link stays missing. The
// result keeps the structure (and triangle-inequality violations) of the
// measured matrix at a larger scale.
func JitteredCopies(base [][]float64, n int, seed uint64) [][]float64 {
	rng := rand.New(rand.NewPCG(seed, 0x6a6974746572))
	nb := len(base)
	orig := make([]int, n)
	extra := make([]float64, n)
	for x := range orig {
		if x < nb {
			orig[x] = x
			continue
		}
		orig[x] = rng.IntN(nb)
		extra[x] = 0.5 + 4.5*rng.Float64()
	}
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
	}
	for x := 0; x < n; x++ {
		for y := x + 1; y < n; y++ {
			a, b := orig[x], orig[y]
			var v float64
			switch {
			case x < nb && y < nb:
				v = base[x][y]
			case a == b:
				v = extra[x] + extra[y] + 2*rng.Float64()
			default:
				v = base[a][b]*(1+0.1*(rng.Float64()-0.5)) + extra[x] + extra[y]
			}
			if !math.IsInf(v, 1) {
				v = math.Round(v*1000) / 1000
			}
			m[x][y], m[y][x] = v, v
		}
	}
	return m
}
