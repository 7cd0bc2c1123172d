package controller

import (
	"cmp"
	"hash/fnv"
	"math"
	"slices"

	"github.com/mosto-net/mosto/internal/api"
)

// DistanceKm returns the great-circle distance between two points given in
// degrees (haversine, mean Earth radius).
func DistanceKm(lat1, lon1, lat2, lon2 float64) float64 {
	const r = 6371.0
	rad := math.Pi / 180
	dlat := (lat2 - lat1) * rad
	dlon := (lon2 - lon1) * rad
	a := math.Sin(dlat/2)*math.Sin(dlat/2) + math.Cos(lat1*rad)*math.Cos(lat2*rad)*math.Sin(dlon/2)*math.Sin(dlon/2)
	return 2 * r * math.Asin(math.Min(1, math.Sqrt(a)))
}

// FibreKmPerMs is the speed of light in fibre (2/3 c) in km per ms.
const FibreKmPerMs = 299792.458 * 2 / 3 / 1000

// MinRTTms is the lowest physically possible RTT between two points: the
// great-circle distance there and back at the speed of light in fibre.
func MinRTTms(lat1, lon1, lat2, lon2 float64) float64 {
	return 2 * DistanceKm(lat1, lon1, lat2, lon2) / FibreKmPerMs
}

// EstimateRTTms is the RTT the controller assumes between two points nobody
// measured: light in fibre (200 km/ms) there and back over the great circle,
// times 1.5 for route inflation, plus 1 ms. It is only used for direct
// connections that were not measured and to rank candidates without
// measurements.
func EstimateRTTms(lat1, lon1, lat2, lon2 float64) float64 {
	return 1 + 1.5*2*DistanceKm(lat1, lon1, lat2, lon2)/200
}

// Closest returns the index in cands of the candidate closest to the point
// (lat, lon): by measured RTT where measured(i) reports one, else by
// EstimateRTTms. It returns -1 for no candidates. Ties go to the lower id.
func Closest(lat, lon float64, cands []api.FEP, measured func(i int) (float64, bool)) int {
	best, bestRTT := -1, math.Inf(1)
	for i, c := range cands {
		rtt, ok := 0.0, false
		if measured != nil {
			rtt, ok = measured(i)
		}
		if !ok {
			rtt = EstimateRTTms(lat, lon, c.Lat, c.Lon)
		}
		if best < 0 || rtt < bestRTT || rtt == bestRTT && c.ID < cands[best].ID {
			best, bestRTT = i, rtt
		}
	}
	return best
}

// TargetPolicy chooses which pairs of FEPs are measured.
type TargetPolicy struct {
	Near int    // each FEP measures its Near nearest FEPs by distance; default 8, negative: none
	Far  int    // plus Far others chosen by a stable hash; default 2, negative: none
	Seed uint64 // changes which far pairs are chosen
	// Dests is how many FEPs, the nearest by distance, measure each
	// destination that has a probe address; default 8.
	Dests int
}

func (p TargetPolicy) withDefaults() TargetPolicy {
	if p.Near == 0 {
		p.Near = 8
	}
	if p.Far == 0 {
		p.Far = 2
	}
	if p.Dests == 0 {
		p.Dests = 8
	}
	// Negative values (none) stay negative, so that defaults applied twice
	// (Config and ChooseTargets) keep meaning none; users clamp at 0.
	return p
}

func pairHash(seed uint64, a, b string) uint64 {
	if a > b {
		a, b = b, a
	}
	h := fnv.New64a()
	var s [8]byte
	for i := range s {
		s[i] = byte(seed >> (8 * i))
	}
	h.Write(s[:])
	h.Write([]byte(a))
	h.Write([]byte{0})
	h.Write([]byte(b))
	return h.Sum64()
}

// ChooseTargets returns, for every FEP (by index in feps), the peers it must
// measure: its Near nearest FEPs, Far far ones (the lowest pair hashes among
// the rest), and every FEP that chose it, so that the measurement graph is
// symmetric. Far pairs keep the graph connected across continents. Lists are
// sorted by distance.
func ChooseTargets(feps []api.FEP, p TargetPolicy) [][]api.Target {
	p = p.withDefaults()
	n := len(feps)
	reason := make([]map[int]string, n)
	for i := range reason {
		reason[i] = make(map[int]string)
	}
	type cand struct {
		j    int
		d    float64
		hash uint64
	}
	cands := make([]cand, 0, n)
	for i, f := range feps {
		cands = cands[:0]
		for j, g := range feps {
			if j != i {
				cands = append(cands, cand{j: j, d: DistanceKm(f.Lat, f.Lon, g.Lat, g.Lon), hash: pairHash(p.Seed, f.ID, g.ID)})
			}
		}
		slices.SortFunc(cands, func(a, b cand) int {
			if c := cmp.Compare(a.d, b.d); c != 0 {
				return c
			}
			return cmp.Compare(feps[a.j].ID, feps[b.j].ID)
		})
		k := max(0, min(p.Near, len(cands)))
		for _, c := range cands[:k] {
			reason[i][c.j] = "near"
			if _, ok := reason[c.j][i]; !ok {
				reason[c.j][i] = "near"
			}
		}
		rest := cands[k:]
		slices.SortFunc(rest, func(a, b cand) int { return cmp.Compare(a.hash, b.hash) })
		for _, c := range rest[:max(0, min(p.Far, len(rest)))] {
			if _, ok := reason[i][c.j]; !ok {
				reason[i][c.j] = "far"
			}
			if _, ok := reason[c.j][i]; !ok {
				reason[c.j][i] = "far"
			}
		}
	}
	out := make([][]api.Target, n)
	for i, f := range feps {
		ts := make([]api.Target, 0, len(reason[i]))
		for j, r := range reason[i] {
			ts = append(ts, api.Target{ID: feps[j].ID, ProbeAddr: feps[j].ProbeAddr, Reason: r})
		}
		slices.SortFunc(ts, func(a, b api.Target) int {
			da := distID(f, feps, a.ID)
			db := distID(f, feps, b.ID)
			if c := cmp.Compare(da, db); c != 0 {
				return c
			}
			return cmp.Compare(a.ID, b.ID)
		})
		out[i] = ts
	}
	return out
}

func distID(f api.FEP, feps []api.FEP, id string) float64 {
	j, ok := slices.BinarySearchFunc(feps, id, func(g api.FEP, id string) int { return cmp.Compare(g.ID, id) })
	if !ok {
		return math.Inf(1)
	}
	return DistanceKm(f.Lat, f.Lon, feps[j].Lat, feps[j].Lon)
}
