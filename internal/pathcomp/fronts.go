package pathcomp

import (
	"fmt"
	"math"
	"slices"
)

// Fronts holds the Pareto fronts of chains over (Sum, Max) for every pair of
// locations, computed by Precompute. Paths are not stored: each front entry
// keeps the link that created it, and a path is rebuilt on demand from the
// entries of its sub-pairs. A Fronts is immutable and safe for concurrent use.
type Fronts struct {
	n     int
	model Model
	// levels is the number of hop levels stored per pair: 1 when chains
	// are unlimited (the events of a pair's best chains), MaxProxies+1 when
	// bounded (level k holds the events of the best chains of at most k
	// links; level levels is the pair's front).
	levels  int
	bounded bool

	// Links sorted by nondecreasing RTT; index h is l_h of Appendix A.
	linkA, linkB []uint16
	linkRTT      []int64 // microseconds

	// Events, grouped per unordered pair and level (CSR over the slot
	// pairIndex*levels + level-1) and, within a slot, in the order they
	// happened (link index increasing, key decreasing).
	start []uint32 // len pairs*levels+1
	key   []int64  // sum<<hopBits | hops
	link  []uint32 // h<<1 | orientation (1: the lower location's side of the link is linkB[h])
	emax  []uint32 // linkRTT[h] (the entry's Max, microseconds), kept beside key for lookups
	// Hops of the part of the path on the lower location's side of the
	// link, so that a path rebuild needs no lookup for parts of 0 or 1 hop.
	loHops []uint16
}

// pairIndex is the triangular index of the unordered pair lo < hi.
func pairIndex(n, lo, hi int) int {
	return lo*(2*n-lo-1)/2 + hi - lo - 1
}

// Precompute computes the Pareto fronts of all pairs of locations of the
// symmetric RTT matrix rtt (milliseconds; +Inf: no direct link; the diagonal
// is ignored) with the dynamic program of Appendix A of the MOSTO paper.
func Precompute(rtt [][]float64, opt Options) (*Fronts, error) {
	if err := checkMatrix(rtt); err != nil {
		return nil, err
	}
	if err := opt.Model.checkEnds(); err != nil {
		return nil, err
	}
	if opt.MaxProxies < 0 || opt.MaxProxies > MaxProxiesLimit {
		return nil, fmt.Errorf("pathcomp: max proxies %d; want 0 (unlimited) to %d", opt.MaxProxies, MaxProxiesLimit)
	}
	n := len(rtt)
	// Sort the links by RTT (then by pair, for determinism) as packed
	// uint64s: rtt (at most 32 bits) << 24 | pair index (at most 23 bits).
	var packed []uint64
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			if v := rtt[i][j]; !math.IsInf(v, 1) {
				packed = append(packed, uint64(micros(v))<<24|uint64(pairIndex(n, i, j)))
			}
		}
	}
	slices.Sort(packed)
	pairLo, pairHi := pairTable(n)
	f := &Fronts{
		n:       n,
		model:   opt.Model,
		levels:  1,
		linkA:   make([]uint16, len(packed)),
		linkB:   make([]uint16, len(packed)),
		linkRTT: make([]int64, len(packed)),
	}
	for h, v := range packed {
		p := v & (1<<24 - 1)
		f.linkA[h], f.linkB[h], f.linkRTT[h] = pairLo[p], pairHi[p], int64(v>>24)
	}
	switch {
	case opt.MaxProxies > 0:
		f.levels, f.bounded = opt.MaxProxies+1, true
		f.compact(f.runBounded(!opt.Plain))
	case opt.Plain:
		f.compact(f.runPlain())
	default:
		f.compact(f.runPruned())
	}
	return f, nil
}

// pairTable returns the two locations of every triangular pair index.
func pairTable(n int) (lo, hi []uint16) {
	lo = make([]uint16, n*(n-1)/2)
	hi = make([]uint16, n*(n-1)/2)
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			p := pairIndex(n, i, j)
			lo[p], hi[p] = uint16(i), uint16(j)
		}
	}
	return lo, hi
}

// eventLog records, in order, every improvement of a pair's best (sum, hops)
// (per hop level when bounded): the new key, and slot << plPairShift | lower
// side's hops << 24 | link index << 1 | orientation, where slot is pair index
// * levels + level-1 (link indices stay below 2^23 since n <= MaxLocations,
// slots below 2^27 since levels <= MaxProxiesLimit+1).
// It grows in fixed chunks, so that growing never copies.
type eventLog struct {
	key    [][]int64
	pl     [][]uint64
	count  int
	chunk  int // entries per chunk
	levels int
}

// newEventLog sizes the chunks for n locations: about four entries per pair,
// between 1<<10 and 1<<18 entries.
func newEventLog(n, levels int) eventLog {
	return eventLog{chunk: min(max(4*n*(n-1)/2, 1<<10), 1<<18), levels: levels}
}

// add logs that the pair {i, j} improved to key at link h (at hop level
// level; 1 when unbounded); iOnA tells whether i's part of the path ends at
// a_h, iHops is that part's hop count.
func (lg *eventLog) add(n, i, j, level int, key int64, h int, iOnA bool, iHops int64) {
	lo, hi := i, j
	orient := uint32(0) // lower location on the a side
	loHops := iHops
	if lo > hi {
		lo, hi = hi, lo
		iOnA = !iOnA
		loHops = key&hopMask - 1 - iHops
	}
	if !iOnA {
		orient = 1
	}
	if lg.count%lg.chunk == 0 {
		lg.key = append(lg.key, make([]int64, 0, lg.chunk))
		lg.pl = append(lg.pl, make([]uint64, 0, lg.chunk))
	}
	c := len(lg.key) - 1
	lg.key[c] = append(lg.key[c], key)
	lg.pl[c] = append(lg.pl[c], uint64(pairIndex(n, lo, hi)*lg.levels+level-1)<<plPairShift|uint64(loHops)<<24|uint64(h)<<1|uint64(orient))
	lg.count++
}

func newDist(n int) []int64 {
	d := make([]int64, n*n)
	for i := range d {
		d[i] = infKey
	}
	for i := 0; i < n; i++ {
		d[i*n+i] = 0
	}
	return d
}

// runPruned is the dynamic program with the A_h/B_h pruning: at step h only
// pairs (i, j) with i in B_h (whose best path to b_h now runs via a_h) and
// j in A_h (whose best path to a_h now runs via b_h) can improve, and only
// along i .. a_h - b_h .. j. D is updated in place: rows a_h and b_h are
// read only at indices the step does not write.
func (f *Fronts) runPruned() eventLog {
	n := f.n
	d := newDist(n)
	lg := newEventLog(n, 1)
	as := make([]int, 0, n)
	bs := make([]int, 0, n)
	for h := range f.linkRTT {
		a, b := int(f.linkA[h]), int(f.linkB[h])
		w := f.linkRTT[h]<<hopBits | 1
		rowA := d[a*n : (a+1)*n]
		rowB := d[b*n : (b+1)*n]
		if rowA[b] <= w {
			continue // the link does not improve its own endpoints: A_h, B_h are empty
		}
		as, bs = as[:0], bs[:0]
		for p := range rowA {
			da, db := rowA[p], rowB[p]
			if db+w < da {
				as = append(as, p)
			} else if da+w < db {
				bs = append(bs, p)
			}
		}
		for _, i := range bs {
			base := rowA[i] + w
			di := d[i*n : (i+1)*n]
			for _, j := range as {
				if c := base + rowB[j]; c < di[j] {
					di[j] = c
					d[j*n+i] = c
					lg.add(n, i, j, 1, c, h, true, rowA[i]&hopMask)
				}
			}
		}
	}
	return lg
}

// runPlain is the Theta(n^2 m) dynamic program: every pair, every link, both
// directions, from a snapshot of rows a_h and b_h.
func (f *Fronts) runPlain() eventLog {
	n := f.n
	d := newDist(n)
	lg := newEventLog(n, 1)
	sa := make([]int64, n)
	sb := make([]int64, n)
	for h := range f.linkRTT {
		a, b := int(f.linkA[h]), int(f.linkB[h])
		w := f.linkRTT[h]<<hopBits | 1
		copy(sa, d[a*n:(a+1)*n])
		copy(sb, d[b*n:(b+1)*n])
		for i := 0; i < n; i++ {
			di := d[i*n : (i+1)*n]
			for j := i + 1; j < n; j++ {
				c1 := sa[i] + w + sb[j] // i .. a - b .. j
				c2 := sb[i] + w + sa[j] // i .. b - a .. j
				switch {
				case c1 < di[j] && c1 <= c2:
					di[j] = c1
					d[j*n+i] = c1
					lg.add(n, i, j, 1, c1, h, true, sa[i]&hopMask)
				case c2 < di[j]:
					di[j] = c2
					d[j*n+i] = c2
					lg.add(n, i, j, 1, c2, h, false, sb[i]&hopMask)
				}
			}
		}
	}
	return lg
}

// compact turns the event log into per-pair arrays.
func (f *Fronts) compact(lg eventLog) {
	pairs := f.n * (f.n - 1) / 2 * f.levels
	f.start = make([]uint32, pairs+1)
	for _, chunk := range lg.pl {
		for _, v := range chunk {
			f.start[v>>plPairShift+1]++
		}
	}
	for p := 0; p < pairs; p++ {
		f.start[p+1] += f.start[p]
	}
	f.key = make([]int64, lg.count)
	f.link = make([]uint32, lg.count)
	f.emax = make([]uint32, lg.count)
	f.loHops = make([]uint16, lg.count)
	next := slices.Clone(f.start[:pairs])
	for c, chunk := range lg.pl {
		keys := lg.key[c]
		for e, v := range chunk {
			p := v >> plPairShift
			k := next[p]
			next[p]++
			f.key[k] = keys[e]
			f.link[k] = uint32(v) & (1<<24 - 1)
			f.loHops[k] = uint16(v>>24) & hopMask
			f.emax[k] = uint32(f.linkRTT[f.link[k]>>1])
		}
		lg.key[c], lg.pl[c] = nil, nil // let the collector take the chunk
	}
}

// N returns the number of locations.
func (f *Fronts) N() int { return f.n }

// Model returns the model of the Options the fronts were computed with.
func (f *Fronts) Model() Model { return f.model }

// Links returns the number of links (finite off-diagonal RTTs, each pair once).
func (f *Fronts) Links() int { return len(f.linkRTT) }

// Entries returns the number of stored front entries over all pairs (each
// unordered pair once, including entries later dominated at equal Max; with
// a hop bound, the entries of every hop level).
func (f *Fronts) Entries() int { return len(f.key) }

// Bytes returns the approximate memory held by f.
func (f *Fronts) Bytes() int {
	return 4*len(f.start) + 8*len(f.key) + 4*len(f.link) + 4*len(f.emax) + 2*len(f.loHops) + 12*len(f.linkRTT)
}

// events returns the event range of the front of the pair {i, j}, i != j.
func (f *Fronts) events(i, j int) (lo, hi int) {
	return f.levelEvents(i, j, f.levels)
}

// levelEvents returns the event range of the pair {i, j}, i != j, at hop
// level level (1 when unbounded).
func (f *Fronts) levelEvents(i, j, level int) (lo, hi int) {
	a, b := i, j
	if a > b {
		a, b = b, a
	}
	p := pairIndex(f.n, a, b)*f.levels + level - 1
	return int(f.start[p]), int(f.start[p+1])
}

// MaxProxies returns the bound on intermediate locations the fronts were
// computed with (0: unlimited).
func (f *Fronts) MaxProxies() int {
	if !f.bounded {
		return 0
	}
	return f.levels - 1
}

func (f *Fronts) valid(i, j int) bool {
	return i >= 0 && j >= 0 && i < f.n && j < f.n
}

// best returns the event of the pair {i, j} with the smallest cost for rounds
// (ties: fewer hops), or -1.
func (f *Fronts) best(i, j, rounds int) int {
	// Keep 2(rounds-1)*Max (Max < 2^32 us) and the sum within int64.
	rounds = min(max(rounds, 1), maxRounds)
	lo, hi := f.events(i, j)
	r2 := int64(2 * (rounds - 1))
	bestE := -1
	var bestCost, bestHops int64
	for e := lo; e < hi; e++ {
		k := f.key[e]
		hops := k & hopMask
		// Twice the cost, in microseconds: Sum + 2(r-1)Max.
		c := k>>hopBits + r2*int64(f.emax[e])
		if bestE < 0 || c < bestCost || (c == bestCost && hops < bestHops) {
			bestE, bestCost, bestHops = e, c, hops
		}
	}
	return bestE
}

// maxRounds bounds the rounds Best distinguishes; larger values count as it.
// (Model.Rounds never exceeds 62.)
const maxRounds = 1 << 26

// Best returns the chain from i to j with the smallest Model.Cost for rounds
// slow-start rounds; ties go to the chain with fewer proxies. It returns false
// when j cannot be reached from i or an index is out of range. The returned
// Path is freshly allocated; BestAppend avoids that.
func (f *Fronts) Best(i, j, rounds int) (Chain, bool) {
	return f.BestAppend(nil, i, j, rounds)
}

// BestAppend is Best with the path appended to dst[:0], so that a caller
// reusing dst performs no allocation.
func (f *Fronts) BestAppend(dst []int, i, j, rounds int) (Chain, bool) {
	if !f.valid(i, j) {
		return Chain{}, false
	}
	if i == j {
		return Chain{Path: append(dst[:0], i)}, true
	}
	e := f.best(i, j, rounds)
	if e < 0 {
		return Chain{}, false
	}
	return f.chain(dst[:0], i, j, e), true
}

// chain builds the Chain of event e of the pair {i, j}, oriented from i.
func (f *Fronts) chain(dst []int, i, j, e int) Chain {
	k := f.key[e]
	c := Chain{Sum: millis(k >> hopBits), Max: millis(int64(f.emax[e]))}
	c.Path = f.appendEvent(dst, i, j, e)
	return c
}

// lastEvent returns the last event of the pair {i, j} at hop level level
// created at a link index <= h, or -1.
func (f *Fronts) lastEvent(i, j, level, h int) int {
	lo, hi := f.levelEvents(i, j, level)
	// Events run in link order: find the first one after h.
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if int(f.link[mid]>>1) <= h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	start, _ := f.levelEvents(i, j, level)
	if lo == start {
		return -1
	}
	return lo - 1
}

// appendEvent appends the path of event e of the pair {i, j}, from i to j.
// The path is i .. x - y .. j where {x, y} is the event's link; both halves
// are the best paths of their pairs just before that link was added.
func (f *Fronts) appendEvent(dst []int, i, j, e int) []int {
	hops := int(f.key[e] & hopMask)
	if hops == 1 {
		return append(dst, i, j) // the direct link
	}
	lv := f.link[e]
	h := int(lv >> 1)
	x, y := int(f.linkA[h]), int(f.linkB[h]) // lower location's side first
	if lv&1 == 1 {
		x, y = y, x
	}
	left := int(f.loHops[e]) // hops of i .. x
	if i > j {
		x, y = y, x
		left = hops - 1 - left
	}
	dst = f.appendPart(dst, i, x, left, h-1)
	return f.appendPart(dst, y, j, hops-1-left, h-1)
}

// appendPart appends the best path from u to v over links 0..h, which has
// the given number of hops.
func (f *Fronts) appendPart(dst []int, u, v, hops, h int) []int {
	switch hops {
	case 0:
		return append(dst, u)
	case 1:
		return append(dst, u, v)
	}
	level := 1
	if f.bounded {
		// The part was the best of at most some k >= hops links; having
		// hops links, it is also the best of at most hops links (keys
		// order by sum, then hops), which level hops holds.
		level = hops
	}
	return f.appendBest(dst, u, v, level, h)
}

// appendBest appends the best path from i to j of at most level links
// (unbounded: level 1) using links 0..h.
func (f *Fronts) appendBest(dst []int, i, j, level, h int) []int {
	if i == j {
		return append(dst, i)
	}
	e := f.lastEvent(i, j, level, h)
	if e < 0 {
		panic(fmt.Sprintf("pathcomp: no path %d -> %d below link %d", i, j, h)) // an internal invariant
	}
	return f.appendEvent(dst, i, j, e)
}

// Front returns the Pareto front of chains from i to j over (Sum, Max),
// sorted by increasing Sum (so by decreasing Max). Among chains with the same
// (Sum, Max) it holds one with the fewest proxies. It is empty when j cannot
// be reached from i; for i == j it is the single chain [i].
func (f *Fronts) Front(i, j int) []Chain {
	if !f.valid(i, j) {
		return nil
	}
	if i == j {
		return []Chain{{Path: []int{i}}}
	}
	lo, hi := f.events(i, j)
	var keep []int
	for e := hi - 1; e >= lo; e-- {
		// Events run with key decreasing and Max nondecreasing. Going
		// backwards (Sum increasing), an event is dominated when the next
		// one has the same Max (smaller Sum, or equal Sum with fewer
		// hops); and an event with the same Sum as the one kept before it
		// has a smaller Max, so it replaces that one.
		if e+1 < hi && f.emax[e+1] == f.emax[e] {
			continue
		}
		if n := len(keep); n > 0 && f.key[keep[n-1]]>>hopBits == f.key[e]>>hopBits {
			keep[n-1] = e
			continue
		}
		keep = append(keep, e)
	}
	out := make([]Chain, len(keep))
	for k, e := range keep {
		out[k] = f.chain(nil, i, j, e)
	}
	return out
}
