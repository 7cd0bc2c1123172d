package pathcomp

// runBounded is the dynamic program of Appendix A with a hop dimension: for
// every level k = 1..L (L = f.levels) it keeps D_k, the best (sum, hops) key
// of the walks of at most k links over the links added so far. Adding link
// h = {a, b} of weight w, a new best walk of at most k links from i to j
// runs i .. a - b .. j with p links on i's side and q on j's, p+q+1 <= k,
// and both parts are the best of at most p and q links before h (it uses
// h once: walks using it twice are no better than the shortened walk, which
// has fewer links). Each part is read from a snapshot of rows a and b taken
// before the step. The front of a pair is the sequence of improvements of
// D_L; the improvements of the lower levels are logged too, since a path
// is rebuilt from the best parts of a given number of links.
//
// With prune, only i in B_p (the link improves i's best walk of at most
// p+1 links to b: D_p[i][a] + w < D_{p+1}[i][b]) and j in A_q (symmetric)
// are combined: for any other i, the old walk i .. b .. j of at most p+1+q
// links is at least as good as the new one. Without prune every pair is
// tried (for tests and benchmarks).
func (f *Fronts) runBounded(prune bool) eventLog {
	n, levels := f.n, f.levels
	lg := newEventLog(n, levels)
	// d[k] is D_k for k = 1..levels (d[0] unused: D_0 is 0 on the diagonal,
	// +Inf elsewhere, and is read through at()).
	d := make([][]int64, levels+1)
	for k := 1; k <= levels; k++ {
		d[k] = newDist(n)
	}
	// Snapshots of rows a and b per level (index 0: D_0).
	sa := make([][]int64, levels+1)
	sb := make([][]int64, levels+1)
	for k := range sa {
		sa[k] = make([]int64, n)
		sb[k] = make([]int64, n)
	}
	bs := make([][]int, levels) // B_p, p = 0..levels-1
	as := make([][]int, levels) // A_q
	for h := range f.linkRTT {
		a, b := int(f.linkA[h]), int(f.linkB[h])
		w := f.linkRTT[h]<<hopBits | 1
		for k := range sa[0] {
			sa[0][k], sb[0][k] = infKey, infKey
		}
		sa[0][a], sb[0][b] = 0, 0
		for k := 1; k <= levels; k++ {
			copy(sa[k], d[k][a*n:(a+1)*n])
			copy(sb[k], d[k][b*n:(b+1)*n])
		}
		for p := 0; p < levels; p++ {
			bs[p], as[p] = bs[p][:0], as[p][:0]
			for x := 0; x < n; x++ {
				if !prune || sa[p][x]+w < sb[p+1][x] {
					bs[p] = append(bs[p], x)
				}
				if !prune || sb[p][x]+w < sa[p+1][x] {
					as[p] = append(as[p], x)
				}
			}
		}
		for p := 0; p < levels; p++ {
			for _, i := range bs[p] {
				if sa[p][i] >= infKey {
					continue
				}
				base := sa[p][i] + w
				for q := 0; p+q+1 <= levels; q++ {
					for _, j := range as[q] {
						if sb[q][j] >= infKey || i == j {
							continue
						}
						c := base + sb[q][j]
						for k := p + q + 1; k <= levels; k++ {
							dk := d[k]
							if c >= dk[i*n+j] {
								break // D_k <= D_{k-1}: no higher level improves either
							}
							dk[i*n+j] = c
							dk[j*n+i] = c
							lg.add(n, i, j, k, c, h, true, sa[p][i]&hopMask)
						}
					}
				}
			}
		}
	}
	return lg
}

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
