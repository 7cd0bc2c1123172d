package pathcomp

// runBounded is the dynamic program of Appendix A with a hop dimension: for
// every level k = 1..L (L = f.levels) it keeps D_k, the best (sum, hops) key
// of the walks of at most k links over the links added so far. Adding link
// h = {a, b} of weight w, a new best walk of at most k links from i to j
// runs i .. a - b .. j with p links on i's side and q on j's, p+q+1 <= k,
// and both parts are the best of at most p and q links before h (it uses
// h once: walks using it twice are no better than the shortened walk, which
// has fewer links). The parts' keys are collected before the step writes. The front of a pair is the sequence of improvements of
// D_L; the improvements of the lower levels are logged too, since a path
// is rebuilt from the best parts of a given number of links.
//
// With prune, only i in B_p (the link improves i's best walk of at most
// p+1 links to b: D_p[i][a] + w < D_{p+1}[i][b]) and j in A_q (symmetric)
// are combined: for any other i, the old walk i .. b .. j of at most p+1+q
// links is at least as good as the new one. B_0 is {a} (and A_0 {b}): the
// link is the only walk of one link between a and b. Without prune every
// pair is tried (for tests and benchmarks).
func (f *Fronts) runBounded(prune bool) eventLog {
	n, levels := f.n, f.levels
	lg := newEventLog(n, levels)
	// d[k] is D_k for k = 1..levels; d[0] is one row of D_0 (0 at one
	// index, +Inf elsewhere), shared by rows a and b via zeroA, zeroB.
	d := make([][]int64, levels+1)
	for k := 1; k <= levels; k++ {
		d[k] = newDist(n)
	}
	zeroA := make([]int64, n)
	zeroB := make([]int64, n)
	for x := range zeroA {
		zeroA[x], zeroB[x] = infKey, infKey
	}
	ra := make([][]int64, levels+1) // rows a, b of D_0 .. D_levels
	rb := make([][]int64, levels+1)
	ra[0], rb[0] = zeroA, zeroB
	// adj[x]: the locations linked to x by the links added so far, where
	// row x of D_1 is finite (besides x itself).
	adj := make([][]int32, n)
	linked := newBitMatrix(n)      // the same as a bit matrix
	bs := make([]levelSet, levels) // B_p, p = 0..levels-1, with D_p[x][a]
	as := make([]levelSet, levels) // A_q, with D_q[x][b]
	for h := range f.linkRTT {
		a, b := int(f.linkA[h]), int(f.linkB[h])
		w := f.linkRTT[h]<<hopBits | 1
		zeroA[a], zeroB[b] = 0, 0
		for k := 1; k <= levels; k++ {
			ra[k] = d[k][a*n : (a+1)*n]
			rb[k] = d[k][b*n : (b+1)*n]
		}
		// The sets are collected (with their values) before any write:
		// that is the state before link h.
		for p := range bs {
			bs[p].reset()
			as[p].reset()
			if !prune {
				bs[p].all(ra[p])
				as[p].all(rb[p])
			}
		}
		if prune {
			bs[0].add(a, 0)
			as[0].add(b, 0)
			collect(bs, ra, rb, adj[a], linked.row(b), w)
			collect(as, rb, ra, adj[b], linked.row(a), w)
		}
		adj[a] = append(adj[a], int32(b))
		adj[b] = append(adj[b], int32(a))
		linked.set(a, b)
		linked.set(b, a)
		zeroA[a], zeroB[b] = infKey, infKey
		for p := 0; p < levels; p++ {
			bp := &bs[p]
			for x, i := range bp.idx {
				vi := bp.val[x]
				base := vi + w
				for q := 0; p+q+1 <= levels; q++ {
					aq := &as[q]
					for y, j := range aq.idx {
						if i == j {
							continue
						}
						c := base + aq.val[y]
						for k := p + q + 1; k <= levels; k++ {
							dk := d[k]
							if c >= dk[i*n+j] {
								break // D_k <= D_{k-1}: no higher level improves either
							}
							dk[i*n+j] = c
							dk[j*n+i] = c
							lg.add(n, i, j, k, c, h, true, vi&hopMask)
						}
					}
				}
			}
		}
	}
	return lg
}

// levelSet is a set of locations with the key of each one's walk to an end
// of the current link.
type levelSet struct {
	idx []int
	val []int64
}

func (s *levelSet) reset() { s.idx, s.val = s.idx[:0], s.val[:0] }

func (s *levelSet) add(x int, v int64) {
	s.idx = append(s.idx, x)
	s.val = append(s.val, v)
}

// all adds every x with a finite row[x].
func (s *levelSet) all(row []int64) {
	for x, v := range row {
		if v < infKey {
			s.add(x, v)
		}
	}
}

// collect fills sets[p], p >= 1, with the x such that the new link of
// weight w improves x's best walk of at most p+1 links to the link's far
// end (ra: rows of the near end per level, rb: of the far end) via a walk
// of exactly p links to the near end: ra[p][x] + w < rb[p+1][x] and
// ra[p][x] < ra[p-1][x]. An x with ra[p][x] == ra[p-1][x] is left out: its
// candidates equal those it makes in sets[p-1], which then holds it and
// combines with one more level on the other side. Since the part of such a
// walk k links from the near end is in sets[k] (a suffix of a best walk is a
// best walk, and it improves the far end too, or the whole walk would not),
// an empty level leaves all higher ones empty and ends the scan.
//
// Level 1 holds only neighbours of the near end (nbrs) that are not linked
// to the far end (farLinked, a bit row): links are added by nondecreasing
// RTT, so a link x - far, added before, is no longer than w and has one
// link, which beats x - near - far. On complete matrices most links find
// level 1 empty this way without touching a row of D.
func collect(sets []levelSet, ra, rb [][]int64, nbrs []int32, farLinked []uint64, w int64) {
	r, far := ra[1], rb[2]
	if 8*len(nbrs) < len(r) {
		for _, x := range nbrs {
			if farLinked[x>>6]&(1<<(x&63)) != 0 {
				continue
			}
			if v := r[x]; v+w < far[x] {
				sets[1].add(int(x), v)
			}
		}
	} else {
		// Many neighbours: a sequential pass (which the prefetcher
		// follows) beats jumping around the rows; r is finite exactly
		// at the neighbours and 0 at the near end itself.
		far = far[:len(r)]
		for x, v := range r {
			if v != 0 && farLinked[x>>6]&(1<<(x&63)) == 0 && v+w < far[x] {
				sets[1].add(x, v)
			}
		}
	}
	if len(sets[1].idx) == 0 {
		return
	}
	for p := 2; p < len(sets); p++ {
		r, prev, far := ra[p], ra[p-1], rb[p+1]
		far = far[:len(r)]
		prev = prev[:len(r)]
		for x, v := range r {
			if v < prev[x] && v+w < far[x] {
				sets[p].add(x, v)
			}
		}
		if len(sets[p].idx) == 0 {
			return
		}
	}
}

// bitMatrix is an n x n matrix of bits, row by row.
type bitMatrix struct {
	words int
	bits  []uint64
}

func newBitMatrix(n int) bitMatrix {
	w := (n + 63) / 64
	return bitMatrix{words: w, bits: make([]uint64, n*w)}
}

func (m bitMatrix) row(i int) []uint64 { return m.bits[i*m.words : (i+1)*m.words] }

func (m bitMatrix) set(i, j int) { m.bits[i*m.words+j>>6] |= 1 << (j & 63) }

// BestEach chooses, for every rounds[k], the chain from i to j with the
// smallest Model.Cost (ties: fewer proxies) in one scan of the pair's front,
// and stores in picks[k] (len(picks) >= len(rounds)) an identifier of it for
// AppendPick. It returns false, leaving picks alone, when i == j, an index is
// out of range or j cannot be reached from i. Equal picks mean equal chains.
func (f *Fronts) BestEach(i, j int, rounds []int, picks []int) bool {
	if !f.valid(i, j) || i == j {
		return false
	}
	lo, hi := f.events(i, j)
	if lo == hi {
		return false
	}
	var r2s [16]int64
	var costs [16]int64
	var hopss [16]int64
	for base := 0; base < len(rounds); base += len(r2s) {
		m := min(len(rounds)-base, len(r2s))
		for k := 0; k < m; k++ {
			r := min(max(rounds[base+k], 1), maxRounds)
			r2s[k] = int64(2 * (r - 1))
			picks[base+k] = -1
		}
		for e := lo; e < hi; e++ {
			key := f.key[e]
			sum, hops, mx := key>>hopBits, key&hopMask, int64(f.emax[e])
			for k := 0; k < m; k++ {
				c := sum + r2s[k]*mx
				if picks[base+k] < 0 || c < costs[k] || c == costs[k] && hops < hopss[k] {
					picks[base+k], costs[k], hopss[k] = e, c, hops
				}
			}
		}
	}
	return true
}

// AppendPick returns the chain that BestEach(i, j, ...) identified by pick,
// with its path appended to dst[:0].
func (f *Fronts) AppendPick(dst []int, i, j, pick int) Chain {
	return f.chain(dst[:0], i, j, pick)
}
