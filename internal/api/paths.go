package api

import (
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// PathPaths is GET /v1/paths?from=INP&to=EGP&k=K&size=BYTES: k loop-free
// chains between two FEPs for multi-path downloads (`mosto get --paths`).
const PathPaths = "/v1/paths"

// maxPathsK bounds k of GET /v1/paths.
const maxPathsK = 8

// Paths is the body of GET /v1/paths: the chains from From to To ranked by
// pathcomp.KChains on the current RTT matrix (default model, the rounds of
// Size), preferring link-disjoint ones.
type Paths struct {
	From   string      `json:"from"`
	To     string      `json:"to"`
	Size   int64       `json:"size"`
	Rounds int         `json:"rounds"`
	Chains []PathChain `json:"chains"`
}

// PathChain is one chain of Paths: the FEPs it visits (From .. To), its
// predicted time and RTT sum and maximum (ms), and the links (FEP pairs) it
// shares with the chains before it: sub-flows over chains that share links
// should couple their congestion control.
type PathChain struct {
	Path   []string    `json:"path"`
	CostMS float64     `json:"cost_ms"`
	SumMS  float64     `json:"sum_ms"`
	MaxMS  float64     `json:"max_ms"`
	Shared [][2]string `json:"shared"`
}

func (s *server) paths(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	from, to := q.Get("from"), q.Get("to")
	k, err := strconv.Atoi(q.Get("k"))
	if err != nil || k < 1 || k > maxPathsK {
		writeError(w, http.StatusBadRequest, fmt.Errorf("k must be an integer in [1, %d]", maxPathsK))
		return
	}
	size, err := strconv.ParseInt(q.Get("size"), 10, 64)
	if err != nil || size < 0 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("size must be a byte count"))
		return
	}
	m, err := s.cfg.Backend.Matrix(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out, err := rankPaths(m, from, to, k, size)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// rankPaths runs pathcomp.KChains on m, made symmetric (the larger of two
// measured directions; one measured direction counts for both).
func rankPaths(m Matrix, from, to string, k int, size int64) (Paths, error) {
	idx := map[string]int{}
	for i, n := range m.Names {
		idx[n] = i
	}
	i, ok1 := idx[from]
	j, ok2 := idx[to]
	if !ok1 || !ok2 {
		return Paths{}, fmt.Errorf("%w: unknown FEP %q or %q", ErrNotFound, from, to)
	}
	if i == j {
		return Paths{}, fmt.Errorf("%w: from and to are the same FEP", ErrInvalid)
	}
	n := len(m.Names)
	rtt := make([][]float64, n)
	for a := range rtt {
		rtt[a] = make([]float64, n)
		for b := range rtt[a] {
			rtt[a][b] = math.Inf(1)
		}
		rtt[a][a] = 0
	}
	val := func(a, b int) (float64, bool) {
		if a < len(m.RTTMS) && b < len(m.RTTMS[a]) && m.RTTMS[a][b] != nil {
			v := *m.RTTMS[a][b]
			return v, v >= 0 && v <= pathcomp.MaxRTT
		}
		return 0, false
	}
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			x, okx := val(a, b)
			y, oky := val(b, a)
			switch {
			case okx && oky:
				rtt[a][b] = max(x, y)
			case okx:
				rtt[a][b] = x
			case oky:
				rtt[a][b] = y
			}
			rtt[b][a] = rtt[a][b]
		}
	}
	model := pathcomp.Model{}
	rounds := model.Rounds(size)
	out := Paths{From: from, To: to, Size: size, Rounds: rounds, Chains: []PathChain{}}
	for _, c := range pathcomp.KChains(rtt, i, j, k, rounds, model) {
		pc := PathChain{CostMS: c.Cost, SumMS: c.Sum, MaxMS: c.Max, Shared: [][2]string{}}
		for _, v := range c.Path {
			pc.Path = append(pc.Path, m.Names[v])
		}
		for _, l := range c.Shared {
			pc.Shared = append(pc.Shared, [2]string{m.Names[l[0]], m.Names[l[1]]})
		}
		out.Chains = append(out.Chains, pc)
	}
	if len(out.Chains) == 0 {
		return Paths{}, fmt.Errorf("%w: no chain from %s to %s", ErrNotFound, from, to)
	}
	return out, nil
}
