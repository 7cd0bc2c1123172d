package controller

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/store"
)

// Matrix is the symmetric RTT matrix the controller plans with: the mean of
// the two directions where both were measured, the one measured otherwise,
// +Inf where neither was. Names are the FEP ids, sorted.
type Matrix struct {
	Names []string
	RTT   [][]float64
	index map[string]int
}

// BuildMatrix makes the planning matrix of feps (sorted by id) from rtts;
// samples naming an unknown FEP are ignored.
func BuildMatrix(feps []api.FEP, rtts []store.RTT) *Matrix {
	n := len(feps)
	m := &Matrix{Names: make([]string, n), RTT: make([][]float64, n), index: make(map[string]int, n)}
	for i, f := range feps {
		m.Names[i] = f.ID
		m.index[f.ID] = i
	}
	sum := make([][]float64, n)
	cnt := make([][]uint8, n)
	for i := range sum {
		sum[i] = make([]float64, n)
		cnt[i] = make([]uint8, n)
	}
	for _, r := range rtts {
		i, ok1 := m.index[r.From]
		j, ok2 := m.index[r.To]
		if !ok1 || !ok2 || i == j {
			continue
		}
		sum[i][j] += r.MS
		cnt[i][j]++
		sum[j][i] += r.MS
		cnt[j][i]++
	}
	for i := range m.RTT {
		row := make([]float64, n)
		for j := range row {
			switch {
			case i == j:
				row[j] = 0
			case cnt[i][j] == 0:
				row[j] = math.Inf(1)
			default:
				row[j] = sum[i][j] / float64(cnt[i][j])
			}
		}
		m.RTT[i] = row
	}
	return m
}

// Significant reports whether next differs from prev enough to recompute at
// once: another set of FEPs, a pair measured or no longer measured, or an
// RTT that moved by more than rel of its old value and more than abs ms.
func Significant(prev, next *Matrix, rel, abs float64) bool {
	if prev == nil || !slices.Equal(prev.Names, next.Names) {
		return true
	}
	for i, row := range next.RTT {
		for j, v := range row {
			o := prev.RTT[i][j]
			if math.IsInf(o, 1) != math.IsInf(v, 1) {
				return true
			}
			if !math.IsInf(v, 1) && SignificantChange(o, v, rel, abs) {
				return true
			}
		}
	}
	return false
}

// SignificantChange reports whether an RTT moving from old to next ms
// changed by more than rel*old and more than abs.
func SignificantChange(old, next, rel, abs float64) bool {
	d := math.Abs(next - old)
	return d > rel*old && d > abs
}

// assignLoPs returns, for every FEP index, the index of its LoP.
func assignLoPs(topo Topology, feps []api.FEP, m *Matrix) []int {
	n := len(feps)
	out := make([]int, n)
	if len(topo.LoPs) == 0 {
		for i := range out {
			out[i] = i
		}
		for inp, lop := range topo.InP {
			i, ok1 := m.index[inp]
			l, ok2 := m.index[lop]
			if ok1 && ok2 {
				out[i] = l
			}
		}
		return out
	}
	var lops []int
	isLoP := make([]bool, n)
	for _, id := range topo.LoPs {
		if l, ok := m.index[id]; ok {
			lops = append(lops, l)
			isLoP[l] = true
		}
	}
	lopFEPs := make([]api.FEP, len(lops))
	for k, l := range lops {
		lopFEPs[k] = feps[l]
	}
	for i, f := range feps {
		switch {
		case isLoP[i]:
			out[i] = i
		case topo.InP[f.ID] != "" && isLoP[indexOr(m, topo.InP[f.ID])]:
			out[i] = m.index[topo.InP[f.ID]]
		case len(lops) == 0:
			out[i] = i // no configured LoP is registered: serve itself
		default:
			k := Closest(f.Lat, f.Lon, lopFEPs, func(k int) (float64, bool) {
				v := m.RTT[i][lops[k]]
				return v, !math.IsInf(v, 1)
			})
			out[i] = lops[k]
		}
	}
	return out
}

func indexOr(m *Matrix, id string) int {
	if i, ok := m.index[id]; ok {
		return i
	}
	return 0
}

// plan is everything a computation needs, immutable while tables are built.
type plan struct {
	feps    []api.FEP
	m       *Matrix
	fronts  *pathcomp.Fronts
	model   pathcomp.Model
	classes []sizeClass
	lopOf   []int
	keys    api.Keys
	egress  []api.Egress
}

type sizeClass struct {
	size   int64
	rounds int
}

func sizeClasses(model pathcomp.Model, sizes []int64) []sizeClass {
	var out []sizeClass
	seen := map[int]bool{}
	for _, s := range sizes {
		r := model.Rounds(s)
		if !seen[r] {
			seen[r] = true
			out = append(out, sizeClass{s, r})
		}
	}
	slices.SortFunc(out, func(a, b sizeClass) int { return a.rounds - b.rounds })
	return out
}

func newPlan(cfg Config, feps []api.FEP, m *Matrix, keys store.Keys) (*plan, error) {
	fronts, err := pathcomp.Precompute(m.RTT, pathcomp.Options{Model: cfg.Model, MaxProxies: max(cfg.MaxProxies, 0)})
	if err != nil {
		return nil, fmt.Errorf("precompute chains: %w", err)
	}
	p := &plan{
		feps:    feps,
		m:       m,
		fronts:  fronts,
		model:   cfg.Model,
		classes: sizeClasses(cfg.Model, cfg.Sizes),
		lopOf:   assignLoPs(cfg.Topology, feps, m),
		keys:    api.Keys{Current: hex.EncodeToString(keys.Current)},
	}
	if len(keys.Previous) > 0 {
		p.keys.Previous = hex.EncodeToString(keys.Previous)
	}
	for _, d := range cfg.Topology.Egress {
		if k := Closest(d.Lat, d.Lon, feps, nil); k >= 0 {
			p.egress = append(p.egress, api.Egress{Prefix: d.Prefix, FEP: feps[k].ID})
		}
	}
	return p, nil
}

// chains appends the entries from InP i to every EgP. For each pair it keeps
// one entry per run of size classes with the same chain (the largest class
// of the run), which Index.Lookup resolves to the same path. One scan of the
// pair's front chooses the chain of every class (Fronts.BestEach) and each
// distinct chain's path is rebuilt once. A direct connection that was never
// measured is estimated from the coordinates (EstimateRTTms) and chosen when
// not worse than every measured chain.
func (p *plan) chains(i int, dst []pathcomp.ChainEntry, buf []int) ([]pathcomp.ChainEntry, []int) {
	fi := p.feps[i]
	nc := len(p.classes)
	rounds := make([]int, nc)
	for k, cl := range p.classes {
		rounds[k] = cl.rounds
	}
	picks := make([]int, nc)
	best := make([]pathcomp.Chain, nc)
	ids := make([]int, nc) // the pick of best[k], -1 for the direct connection
	for j := range p.feps {
		if j == i {
			continue
		}
		direct := p.m.RTT[i][j]
		estimated := math.IsInf(direct, 1)
		if estimated {
			fj := p.feps[j]
			direct = EstimateRTTms(fi.Lat, fi.Lon, fj.Lat, fj.Lon)
		}
		dc := pathcomp.Chain{Sum: direct, Max: direct}
		ok := p.fronts.BestEach(i, j, rounds, picks)
		for k, cl := range p.classes {
			var c pathcomp.Chain
			switch {
			case !ok:
			case k > 0 && ids[k-1] == picks[k]:
				c = best[k-1]
			default:
				c = p.fronts.AppendPick(buf, i, j, picks[k])
				buf = c.Path
				c.Path = slices.Clone(c.Path)
			}
			if !ok || estimated && p.model.Cost(dc, cl.rounds) <= p.model.Cost(c, cl.rounds) {
				if dc.Path == nil {
					dc.Path = []int{i, j}
				}
				best[k], ids[k] = dc, -1
				continue
			}
			best[k], ids[k] = c, picks[k]
		}
		for k, cl := range p.classes {
			if k+1 < nc && ids[k] == ids[k+1] {
				continue // the next (larger) class has the same path
			}
			c := best[k]
			path := make([]string, len(c.Path))
			for x, y := range c.Path {
				path[x] = p.m.Names[y]
			}
			dst = append(dst, pathcomp.ChainEntry{
				From: p.m.Names[i], To: p.m.Names[j], Size: cl.size, Rounds: cl.rounds, Path: path,
				CostMS: round3(p.model.Cost(c, cl.rounds)), SumMS: round3(c.Sum), MaxMS: round3(c.Max),
			})
		}
	}
	return dst, buf
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// lopContent is the version-independent part of one LoP's table, encoded.
type lopContent struct {
	lop  string
	body []byte // `"keys":...,"members":...,"egress":...,"table":...`
	hash [32]byte
}

// content builds the encoded content of LoP l's table.
func (p *plan) content(l int, inps []int) (lopContent, error) {
	var entries []pathcomp.ChainEntry
	var buf []int
	for _, i := range inps {
		entries, buf = p.chains(i, entries, buf)
	}
	used := map[string]bool{p.m.Names[l]: true}
	for _, i := range inps {
		used[p.m.Names[i]] = true
	}
	for _, e := range entries {
		for _, id := range e.Path {
			used[id] = true
		}
	}
	for _, e := range p.egress {
		used[e.FEP] = true
	}
	members := make(map[string]string, len(used))
	locs := make([]string, 0, len(used))
	for id := range used {
		locs = append(locs, id)
		members[id] = p.feps[p.m.index[id]].HopAddr
	}
	slices.Sort(locs)
	b := make([]byte, 0, 64+len(entries)*160)
	keys, err := json.Marshal(p.keys)
	if err != nil {
		return lopContent{}, fmt.Errorf("encode keys: %w", err)
	}
	b = append(b, `"keys":`...)
	b = append(b, keys...)
	b = append(b, `,"members":{`...)
	for k, id := range locs {
		if k > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, id)
		b = append(b, ':')
		b = appendJSONString(b, members[id])
	}
	b = append(b, '}')
	if len(p.egress) > 0 {
		eg, err := json.Marshal(p.egress)
		if err != nil {
			return lopContent{}, fmt.Errorf("encode egress: %w", err)
		}
		b = append(b, `,"egress":`...)
		b = append(b, eg...)
	}
	b = append(b, `,"table":`...)
	b = appendTableFile(b, p.model, locs, entries)
	return lopContent{lop: p.m.Names[l], body: b, hash: sha256.Sum256(b)}, nil
}

// assemble returns the full JSON of an api.Table from its content.
func assemble(c lopContent, version uint64, computed time.Time) []byte {
	var b bytes.Buffer
	b.Grow(len(c.body) + 128)
	b.WriteString(`{"lop":`)
	q, _ := json.Marshal(c.lop)
	b.Write(q)
	b.WriteString(`,"version":`)
	b.WriteString(strconv.FormatUint(version, 10))
	b.WriteString(`,"computed":`)
	t, _ := computed.UTC().MarshalJSON()
	b.Write(t)
	b.WriteByte(',')
	b.Write(c.body)
	b.WriteString("}\n")
	return b.Bytes()
}

// builtTable is one LoP's table, ready to store.
type builtTable struct {
	lop  string
	hash [32]byte
	gz   []byte // gzip of the full api.Table JSON
}

// tables builds the table of every FEP in parallel (a FEP that serves no
// InP gets keys and members only) and returns, encoded at version and
// gzip-compressed, those whose content hash differs from prev. Each worker
// compresses as it goes, so the uncompressed JSON (hundreds of MB for 1000
// FEPs) is never held at once.
func (p *plan) tables(prev map[string][32]byte, version uint64, computed time.Time) ([]builtTable, error) {
	inps := make([][]int, len(p.feps))
	for i, l := range p.lopOf {
		inps[l] = append(inps[l], i)
	}
	out := make([]*builtTable, len(p.feps))
	errs := make([]error, len(p.feps))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var zbuf bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&zbuf, gzip.BestSpeed) // one compressor per worker, reset per table
			for l := range next {
				lc, err := p.content(l, inps[l])
				if err != nil {
					errs[l] = err
					continue
				}
				if h, ok := prev[lc.lop]; ok && h == lc.hash {
					continue
				}
				zbuf.Reset()
				zw.Reset(&zbuf)
				zw.Write(assemble(lc, version, computed))
				if err := zw.Close(); err != nil {
					errs[l] = fmt.Errorf("compress table %s: %w", lc.lop, err)
					continue
				}
				out[l] = &builtTable{lop: lc.lop, hash: lc.hash, gz: bytes.Clone(zbuf.Bytes())}
			}
		}()
	}
	for l := range p.feps {
		next <- l
	}
	close(next)
	wg.Wait()
	var changed []builtTable
	for l, t := range out {
		if errs[l] != nil {
			return nil, errs[l]
		}
		if t != nil {
			changed = append(changed, *t)
		}
	}
	return changed, nil
}

// appendTableFile appends the JSON of pathcomp.TableFile{ICW, MSS (of
// model), Locations: locs, Chains: entries} (without version), as encoding/json would, but several
// times faster: tables of 1000 FEPs hold millions of entries.
func appendTableFile(b []byte, model pathcomp.Model, locs []string, entries []pathcomp.ChainEntry) []byte {
	b = append(b, '{')
	if model.ICW != 0 {
		b = append(b, `"icw":`...)
		b = strconv.AppendInt(b, int64(model.ICW), 10)
		b = append(b, ',')
	}
	if model.MSS != 0 {
		b = append(b, `"mss":`...)
		b = strconv.AppendInt(b, int64(model.MSS), 10)
		b = append(b, ',')
	}
	b = append(b, `"locations":[`...)
	for k, l := range locs {
		if k > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, l)
	}
	b = append(b, `],"chains":[`...)
	for k, e := range entries {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"from":`...)
		b = appendJSONString(b, e.From)
		b = append(b, `,"to":`...)
		b = appendJSONString(b, e.To)
		b = append(b, `,"size":`...)
		b = strconv.AppendInt(b, e.Size, 10)
		b = append(b, `,"rounds":`...)
		b = strconv.AppendInt(b, int64(e.Rounds), 10)
		b = append(b, `,"path":[`...)
		for x, id := range e.Path {
			if x > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, id)
		}
		b = append(b, `],"cost_ms":`...)
		b = appendJSONFloat(b, e.CostMS)
		b = append(b, `,"sum_ms":`...)
		b = appendJSONFloat(b, e.SumMS)
		b = append(b, `,"max_ms":`...)
		b = appendJSONFloat(b, e.MaxMS)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendJSONString appends s as a JSON string; ids and addresses are plain
// ASCII, anything else goes through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for k := 0; k < len(s); k++ {
		if c := s[k]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendJSONFloat appends a finite float as encoding/json would for the
// values tables hold (non-negative, below 1e21); non-finite values become 0.
func appendJSONFloat(b []byte, v float64) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(b, '0')
	}
	if v != 0 && (math.Abs(v) < 1e-6 || math.Abs(v) >= 1e21) {
		q, _ := json.Marshal(v)
		return append(b, q...)
	}
	return strconv.AppendFloat(b, v, 'f', -1, 64)
}
