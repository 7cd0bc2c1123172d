package pathcomp

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// Model holds the slow-start parameters of the transfer-time model.
type Model struct {
	ICW int // initial congestion window in segments; 0 means 10
	MSS int // maximum segment size in bytes; 0 means 1460
	// EndICW is the initial window of the two end segments outside the
	// chain (client - InP, EgP - origin: fresh connections) when the
	// chain's hops are pooled and tuned (ICW); 0: the ends are not
	// modelled apart (ends.go).
	EndICW int
	// EndRTT is the RTT in milliseconds a table assumes for each end
	// segment (with EndICW).
	EndRTT float64
}

// Rounds returns the number of slow-start rounds needed to send size bytes:
// the smallest r >= 1 with ICW*MSS*(2^r - 1) >= size.
func (m Model) Rounds(size int64) int {
	icw, mss := int64(m.ICW), int64(m.MSS)
	if icw <= 0 {
		icw = 10
	}
	if mss <= 0 {
		mss = 1460
	}
	w := icw * mss
	r := 1
	for sent := w; sent < size && r < 62; r++ {
		w *= 2
		sent += w
	}
	return r
}

// TableFile is the JSON document written by `mosto plan table --json` and
// distributed to lookup proxies: the chosen chain for every ordered pair of
// locations and every transfer size.
type TableFile struct {
	Version uint64 `json:"version,omitempty"`
	ICW     int    `json:"icw,omitempty"` // model of the rounds classes; 0: 10 segments
	MSS     int    `json:"mss,omitempty"` // 0: 1460 bytes
	// EndICW and EndRTTMS: the end segments' window and assumed RTT
	// (Model.EndICW, Model.EndRTT); entries then carry end_rounds too.
	EndICW    int          `json:"end_icw,omitempty"`
	EndRTTMS  float64      `json:"end_rtt_ms,omitempty"`
	Locations []string     `json:"locations"`
	Chains    []ChainEntry `json:"chains"`
}

// ChainEntry is one row of a TableFile.
type ChainEntry struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Size   int64  `json:"size"` // bytes
	Rounds int    `json:"rounds"`
	// EndRounds is the rounds of the end segments the entry was chosen
	// for (tables with end_icw only).
	EndRounds int      `json:"end_rounds,omitempty"`
	Path      []string `json:"path"` // From ... To, inclusive
	CostMS    float64  `json:"cost_ms"`
	SumMS     float64  `json:"sum_ms"`
	MaxMS     float64  `json:"max_ms"`
}

// ReadTableFile decodes and checks a TableFile.
func ReadTableFile(r io.Reader) (*TableFile, error) {
	var tf TableFile
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tf); err != nil {
		return nil, fmt.Errorf("pathcomp: decode table: %w", err)
	}
	if _, err := NewIndex(&tf); err != nil {
		return nil, err
	}
	return &tf, nil
}

// Index answers chain lookups from a TableFile without allocating.
type Index struct {
	model   Model
	n       int
	loc     map[string]int32 // location name -> index in TableFile.Locations
	start   []int32          // CSR over from*n+to, len n*n+1
	entries []ChainEntry     // per pair, sorted by Rounds
}

// NewIndex validates tf and builds an Index over it.
func NewIndex(tf *TableFile) (*Index, error) {
	n := len(tf.Locations)
	if tf.ICW < 0 || tf.MSS < 0 {
		return nil, fmt.Errorf("pathcomp: table icw %d, mss %d: want >= 0", tf.ICW, tf.MSS)
	}
	ix := &Index{model: Model{ICW: tf.ICW, MSS: tf.MSS, EndICW: tf.EndICW, EndRTT: tf.EndRTTMS}, n: n, loc: make(map[string]int32, n)}
	if err := ix.model.checkEnds(); err != nil {
		return nil, err
	}
	for i, l := range tf.Locations {
		if _, dup := ix.loc[l]; dup {
			return nil, fmt.Errorf("pathcomp: table location %q listed twice", l)
		}
		ix.loc[l] = int32(i)
	}
	pair := make([]int, len(tf.Chains))
	ix.start = make([]int32, n*n+1)
	for i, c := range tf.Chains {
		from, ok1 := ix.loc[c.From]
		to, ok2 := ix.loc[c.To]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("pathcomp: table chain %d: unknown location in %q -> %q", i, c.From, c.To)
		}
		if len(c.Path) < 2 || c.Path[0] != c.From || c.Path[len(c.Path)-1] != c.To {
			if !(c.From == c.To && len(c.Path) == 1) {
				return nil, fmt.Errorf("pathcomp: table chain %d: path %v does not run from %q to %q", i, c.Path, c.From, c.To)
			}
		}
		for _, p := range c.Path {
			if _, ok := ix.loc[p]; !ok {
				return nil, fmt.Errorf("pathcomp: table chain %d: unknown location %q in path", i, p)
			}
		}
		if c.Rounds < 1 {
			return nil, fmt.Errorf("pathcomp: table chain %d: rounds %d < 1", i, c.Rounds)
		}
		pair[i] = int(from)*n + int(to)
		ix.start[pair[i]+1]++
	}
	for p := 0; p < n*n; p++ {
		ix.start[p+1] += ix.start[p]
	}
	ix.entries = make([]ChainEntry, len(tf.Chains))
	next := slices.Clone(ix.start[:n*n])
	for i, c := range tf.Chains {
		ix.entries[next[pair[i]]] = c
		next[pair[i]]++
	}
	for p := 0; p < n*n; p++ {
		list := ix.entries[ix.start[p]:ix.start[p+1]]
		slices.SortStableFunc(list, func(a, b ChainEntry) int {
			return cmp.Or(cmp.Compare(a.Rounds, b.Rounds), cmp.Compare(a.EndRounds, b.EndRounds))
		})
		for k := 1; k < len(list); k++ {
			if list[k].Rounds == list[k-1].Rounds && list[k].EndRounds == list[k-1].EndRounds {
				c := list[k]
				return nil, fmt.Errorf("pathcomp: table chain %q -> %q: duplicate entry for %d rounds (end rounds %d)", c.From, c.To, c.Rounds, c.EndRounds)
			}
		}
	}
	return ix, nil
}

// Lookup returns the chain for a transfer of size bytes from one location to
// another: of the pair's entries, the one whose cost at the size's own
// rounds r (Model.Cost from the entry's sum and max: 1/2 sum + (r-1) max)
// is lowest, rather than the entry of the next class up. The returned entry
// carries Rounds = r and CostMS at r; ties go to the entry of the smallest
// class >= r (the one built for those rounds), else to the lowest class.
func (ix *Index) Lookup(from, to string, size int64) (ChainEntry, bool) {
	i, ok1 := ix.loc[from]
	j, ok2 := ix.loc[to]
	if !ok1 || !ok2 {
		return ChainEntry{}, false
	}
	p := int(i)*ix.n + int(j)
	list := ix.entries[ix.start[p]:ix.start[p+1]]
	if len(list) == 0 {
		return ChainEntry{}, false
	}
	r := ix.model.Rounds(size)
	if ix.model.endsOn() {
		return ix.lookupEnds(list, r, ix.model.EndRounds(size))
	}
	best, bestCost := -1, int64(0)
	for k := range list {
		c := twiceMicros(list[k].SumMS, list[k].MaxMS, r)
		if best < 0 || c < bestCost || (c == bestCost && list[best].Rounds < r && list[k].Rounds >= r) {
			best, bestCost = k, c
		}
	}
	e := list[best]
	e.Rounds = r
	e.CostMS = float64(bestCost) / 2000
	return e, true
}

// twiceMicros is twice Model.Cost in whole microseconds (sum and max
// quantised as the fronts hold them), so that equal costs compare equal.
func twiceMicros(sumMS, maxMS float64, rounds int) int64 {
	return micros(sumMS) + int64(2*(rounds-1))*micros(maxMS)
}

// lookupEnds is Lookup for a table with end segments: the entry of least
// cost at the size's chain rounds r and end rounds re with the table's end
// RTT; ties go to the entry built for (r, re).
func (ix *Index) lookupEnds(list []ChainEntry, r, re int) (ChainEntry, bool) {
	e := micros(ix.model.EndRTT)
	best, bestCost := -1, int64(0)
	for k := range list {
		c := ix.model.twiceEnds(micros(list[k].SumMS), micros(list[k].MaxMS), r, re, e, e)
		own := list[k].Rounds == r && list[k].EndRounds == re
		if best < 0 || c < bestCost || (c == bestCost && own) {
			best, bestCost = k, c
		}
	}
	out := list[best]
	out.Rounds, out.EndRounds = r, re
	out.CostMS = float64(bestCost) / 2000
	return out, true
}
