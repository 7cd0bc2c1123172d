package pathcomp

import (
	"encoding/json"
	"fmt"
	"io"
)

// Model holds the slow-start parameters of the transfer-time model.
type Model struct {
	ICW int // initial congestion window in segments; 0 means 10
	MSS int // maximum segment size in bytes; 0 means 1460
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
	Version   uint64       `json:"version,omitempty"`
	Locations []string     `json:"locations"`
	Chains    []ChainEntry `json:"chains"`
}

// ChainEntry is one row of a TableFile.
type ChainEntry struct {
	From   string   `json:"from"`
	To     string   `json:"to"`
	Size   int64    `json:"size"` // bytes
	Rounds int      `json:"rounds"`
	Path   []string `json:"path"` // From ... To, inclusive
	CostMS float64  `json:"cost_ms"`
	SumMS  float64  `json:"sum_ms"`
	MaxMS  float64  `json:"max_ms"`
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
	model Model
	pairs map[[2]string][]ChainEntry // sorted by Rounds
}

// NewIndex validates tf and builds an Index over it.
func NewIndex(tf *TableFile) (*Index, error) {
	known := make(map[string]bool, len(tf.Locations))
	for _, l := range tf.Locations {
		known[l] = true
	}
	ix := &Index{pairs: make(map[[2]string][]ChainEntry)}
	for i, c := range tf.Chains {
		if !known[c.From] || !known[c.To] {
			return nil, fmt.Errorf("pathcomp: table chain %d: unknown location in %q -> %q", i, c.From, c.To)
		}
		if len(c.Path) < 2 || c.Path[0] != c.From || c.Path[len(c.Path)-1] != c.To {
			if !(c.From == c.To && len(c.Path) == 1) {
				return nil, fmt.Errorf("pathcomp: table chain %d: path %v does not run from %q to %q", i, c.Path, c.From, c.To)
			}
		}
		for _, p := range c.Path {
			if !known[p] {
				return nil, fmt.Errorf("pathcomp: table chain %d: unknown location %q in path", i, p)
			}
		}
		if c.Rounds < 1 {
			return nil, fmt.Errorf("pathcomp: table chain %d: rounds %d < 1", i, c.Rounds)
		}
		k := [2]string{c.From, c.To}
		list := ix.pairs[k]
		pos := len(list)
		for j, e := range list {
			if e.Rounds == c.Rounds {
				return nil, fmt.Errorf("pathcomp: table chain %d: duplicate entry %q -> %q for %d rounds", i, c.From, c.To, c.Rounds)
			}
			if e.Rounds > c.Rounds && pos == len(list) {
				pos = j
			}
		}
		list = append(list, ChainEntry{})
		copy(list[pos+1:], list[pos:])
		list[pos] = c
		ix.pairs[k] = list
	}
	return ix, nil
}

// Lookup returns the chain for a transfer of size bytes from one location to
// another: the entry whose rounds class is the smallest one >= the size's
// rounds, or the largest available when the size exceeds them all.
func (ix *Index) Lookup(from, to string, size int64) (ChainEntry, bool) {
	list := ix.pairs[[2]string{from, to}]
	if len(list) == 0 {
		return ChainEntry{}, false
	}
	r := ix.model.Rounds(size)
	for _, e := range list {
		if e.Rounds >= r {
			return e, true
		}
	}
	return list[len(list)-1], true
}
