package pathcomp

// BuildTable returns the table of chosen chains for every ordered pair of
// distinct, connected locations and every size in sizes (bytes), using the
// model f was computed with. names[i] names location i. Sizes that fall in
// the same rounds class as an earlier size are skipped, since a table holds
// one chain per pair and rounds class. Disconnected pairs get no entry. A
// model other than the default is recorded in the table (icw, mss), so that
// Index.Lookup maps sizes to the same rounds classes.
func BuildTable(names []string, f *Fronts, sizes []int64) *TableFile {
	tf := &TableFile{Locations: append([]string(nil), names...), Chains: []ChainEntry{}}
	if f.model.endsOn() {
		return buildTableEnds(tf, names, f, sizes)
	}
	if f.model != (Model{}) && f.model != (Model{ICW: 10, MSS: 1460}) {
		tf.ICW, tf.MSS = f.model.ICW, f.model.MSS
	}
	type class struct {
		size   int64
		rounds int
	}
	var classes []class
	seen := make(map[int]bool)
	for _, s := range sizes {
		r := f.model.Rounds(s)
		if !seen[r] {
			seen[r] = true
			classes = append(classes, class{s, r})
		}
	}
	n := min(f.N(), len(names))
	var buf []int
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			for _, cl := range classes {
				c, ok := f.BestAppend(buf, i, j, cl.rounds)
				if !ok {
					continue
				}
				buf = c.Path
				path := make([]string, len(c.Path))
				for k, p := range c.Path {
					path[k] = names[p]
				}
				tf.Chains = append(tf.Chains, ChainEntry{
					From:   names[i],
					To:     names[j],
					Size:   cl.size,
					Rounds: cl.rounds,
					Path:   path,
					CostMS: exactCost(c, cl.rounds),
					SumMS:  c.Sum,
					MaxMS:  c.Max,
				})
			}
		}
	}
	return tf
}

// exactCost is Model.Cost computed on the whole microseconds the fronts hold,
// so that it prints without floating-point noise.
func exactCost(c Chain, rounds int) float64 {
	return float64(micros(c.Sum)+int64(2*(rounds-1))*micros(c.Max)) / 2000
}

// buildTableEnds is BuildTable for a model with end segments (ends.go):
// one entry per pair and distinct (chain rounds, end rounds) class of the
// sizes, the pair's front point of least CostEnds with the model's EndRTT
// at both ends.
func buildTableEnds(tf *TableFile, names []string, f *Fronts, sizes []int64) *TableFile {
	m := f.model
	tf.ICW, tf.MSS, tf.EndICW, tf.EndRTTMS = m.ICW, m.MSS, m.EndICW, m.EndRTT
	type class struct {
		size      int64
		rounds    int
		endRounds int
	}
	var classes []class
	seen := make(map[[2]int]bool)
	for _, s := range sizes {
		k := [2]int{m.Rounds(s), m.EndRounds(s)}
		if !seen[k] {
			seen[k] = true
			classes = append(classes, class{s, k[0], k[1]})
		}
	}
	e := micros(m.EndRTT)
	n := min(f.N(), len(names))
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			for _, cl := range classes {
				c, ok := f.BestEnds(i, j, cl.size, m.EndRTT, m.EndRTT)
				if !ok {
					continue
				}
				path := make([]string, len(c.Path))
				for k, p := range c.Path {
					path[k] = names[p]
				}
				tf.Chains = append(tf.Chains, ChainEntry{
					From: names[i], To: names[j], Size: cl.size,
					Rounds: cl.rounds, EndRounds: cl.endRounds, Path: path,
					CostMS: float64(m.twiceEnds(micros(c.Sum), micros(c.Max), cl.rounds, cl.endRounds, e, e)) / 2000,
					SumMS:  c.Sum, MaxMS: c.Max,
				})
			}
		}
	}
	return tf
}
