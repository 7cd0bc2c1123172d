package controller

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pki"
	"io"
	"maps"
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

// Matrix is the symmetric RTT matrix the controller plans with, from the
// RTTs both ends of a pair measured (see BuildMatrix); +Inf where neither
// did. Names are the FEP ids, sorted.
type Matrix struct {
	Names []string
	RTT   [][]float64
	index map[string]int
	down  map[[2]int]bool // pairs (i < j) +Inf because an end reported the other unreachable
}

// Down reports whether the pair i, j is +Inf because one end reported the
// other unreachable (rather than never measured).
func (m *Matrix) Down(i, j int) bool { return m.down[[2]int{min(i, j), max(i, j)}] }

// BuildMatrix makes the planning matrix of feps (sorted by id) from rtts;
// samples naming an unknown FEP are ignored. A pair measured from one end
// takes that value, one measured from both ends the mean of the two (when
// one end already saw a change the other has not reported yet, the mean
// moves half-way, which is enough to be significant: the change is computed
// at once and again when the other end reports). A pair whose newest sample
// from either end says unreachable is +Inf, like a pair never measured:
// unreachable wins over the other end's RTT, since a hop that one end cannot
// probe is not trusted to carry flows.
func BuildMatrix(feps []api.FEP, rtts []store.RTT) *Matrix {
	n := len(feps)
	m := &Matrix{Names: make([]string, n), RTT: make([][]float64, n), index: make(map[string]int, n)}
	for i, f := range feps {
		m.Names[i] = f.ID
		m.index[f.ID] = i
	}
	// dir[i][j] is 1 + the index in rtts of the sample from i to j (the
	// store keeps one per direction; with several, the newest counts).
	dir := make([][]int32, n)
	for i := range dir {
		dir[i] = make([]int32, n)
	}
	for k, r := range rtts {
		i, ok1 := m.index[r.From]
		j, ok2 := m.index[r.To]
		if !ok1 || !ok2 || i == j {
			continue
		}
		if o := dir[i][j]; o == 0 || !rtts[o-1].At.After(r.At) {
			dir[i][j] = int32(k + 1)
		}
	}
	for i := range m.RTT {
		m.RTT[i] = make([]float64, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			v := math.Inf(1)
			a, b := dir[i][j], dir[j][i]
			switch {
			case a != 0 && rtts[a-1].Unreachable, b != 0 && rtts[b-1].Unreachable:
				if m.down == nil {
					m.down = make(map[[2]int]bool)
				}
				m.down[[2]int{i, j}] = true
			case a != 0 && b != 0:
				v = (rtts[a-1].MS + rtts[b-1].MS) / 2
			case a != 0:
				v = rtts[a-1].MS
			case b != 0:
				v = rtts[b-1].MS
			}
			m.RTT[i][j], m.RTT[j][i] = v, v
		}
	}
	return m
}

// Significant reports whether next differs from prev enough to recompute at
// once: another set of FEPs, a pair measured or no longer measured, or an
// RTT that moved by more than rel of its old value and more than abs ms.
func Significant(prev, next *Matrix, rel, abs float64) bool {
	if prev == nil || !slices.Equal(prev.Names, next.Names) || !maps.Equal(prev.down, next.down) {
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
	keys    []planKey // current, previous, next (those set)
	epoch   string
	egress  []api.Egress
	// intercept: the on-path relays' decisions (onpath.go), in every table
	intercept []api.Intercept
	rounds    []int    // rounds of each class
	qnames    [][]byte // JSON string of each FEP id
	keep      []int    // FEPs (draining) kept in every table's members though no chain uses them
	// memberAllow is the encoded `,"member_allow":[...]` (empty: none).
	memberAllow []byte
}

type sizeClass struct {
	size   int64
	rounds int
	// endRounds: the end segments' rounds (a model with EndICW), else 0.
	endRounds int
}

func sizeClasses(model pathcomp.Model, sizes []int64) []sizeClass {
	var out []sizeClass
	seen := map[[2]int]bool{}
	for _, s := range sizes {
		k := [2]int{model.Rounds(s), 0}
		if model.EndICW > 0 {
			k[1] = model.EndRounds(s)
		}
		if !seen[k] {
			seen[k] = true
			out = append(out, sizeClass{s, k[0], k[1]})
		}
	}
	slices.SortFunc(out, func(a, b sizeClass) int { return cmp.Or(a.rounds-b.rounds, a.endRounds-b.endRounds) })
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
	}
	for _, k := range []struct {
		name   string
		secret []byte
	}{{"current", keys.Current}, {"previous", keys.Previous}, {"next", keys.Next}} {
		if len(k.secret) > 0 {
			p.keys = append(p.keys, newPlanKey(k.name, k.secret, m.Names))
		}
	}
	p.epoch = keys.Epoch
	if ma := cfg.Members.Relay(); len(ma) > 0 {
		b, err := json.Marshal(ma)
		if err != nil {
			return nil, fmt.Errorf("encode member policy: %w", err)
		}
		p.memberAllow = append([]byte(`,"member_allow":`), b...)
	}
	for _, cl := range p.classes {
		p.rounds = append(p.rounds, cl.rounds)
	}
	p.qnames = make([][]byte, len(m.Names))
	for i, id := range m.Names {
		p.qnames[i] = appendJSONString(nil, id)
	}
	// p.egress is set by the caller (chooseEgress: it needs the RTTs to
	// the destinations).
	return p, nil
}

// tableEntry is one chain of a LoP's table by location and class index;
// its path is the span [off, off+n) of the table's path buffer, its costs
// are in whole microseconds.
type tableEntry struct {
	from, to, class int32
	off, n          int32
	cost, sum, max  int64
}

// tableRows are the entries of one LoP's table and their paths.
type tableRows struct {
	entries []tableEntry
	paths   []int32
}

// chainScratch is the reusable memory of plan.chains.
type chainScratch struct {
	picks []int
	ids   []int   // the pick chosen for each class, -1: the direct connection
	best  []chain // the chain chosen for each class
	bufs  [][]int // path memory of each class
}

// chain is a chain's path and measures, costs in microseconds.
type chain struct {
	path     []int
	sum, max int64
}

func (p *plan) newScratch() *chainScratch {
	nc := len(p.classes)
	return &chainScratch{picks: make([]int, nc), ids: make([]int, nc), best: make([]chain, nc), bufs: make([][]int, nc)}
}

// chains appends to rows the entries from InP i to every EgP. For each pair
// it keeps one entry per run of size classes with the same chain (the
// largest class of the run), which Index.Lookup resolves to the same path.
// One scan of the pair's front chooses the chain of every class
// (Fronts.BestEach) and each distinct chain's path is rebuilt once. A direct
// connection that was never measured is estimated from the coordinates
// (EstimateRTTms) and chosen when not worse than every measured chain; one
// that an end reported unreachable only when there is no measured chain.
func (p *plan) chains(i int, rows *tableRows, sc *chainScratch) {
	fi := p.feps[i]
	direct := [2]int{i, 0}
	for j := range p.feps {
		if j == i {
			continue
		}
		d := p.m.RTT[i][j]
		estimated := math.IsInf(d, 1)
		down := estimated && p.m.Down(i, j)
		if estimated {
			fj := p.feps[j]
			d = EstimateRTTms(fi.Lat, fi.Lon, fj.Lat, fj.Lon)
		}
		direct[1] = j
		dc := chain{path: direct[:], sum: micros(d), max: micros(d)}
		if p.model.EndICW > 0 {
			p.chainsEnds(i, j, dc, estimated && !down, rows)
			continue
		}
		ok := p.fronts.BestEach(i, j, p.rounds, sc.picks)
		for k, r := range p.rounds {
			var c chain
			switch {
			case !ok:
			case k > 0 && sc.ids[k-1] == sc.picks[k]:
				c = sc.best[k-1]
			default:
				pc := p.fronts.AppendPick(sc.bufs[k], i, j, sc.picks[k])
				sc.bufs[k] = pc.Path
				c = chain{path: pc.Path, sum: micros(pc.Sum), max: micros(pc.Max)}
			}
			if !ok || estimated && !down && twiceCost(dc, r) <= twiceCost(c, r) {
				sc.best[k], sc.ids[k] = dc, -1
				continue
			}
			sc.best[k], sc.ids[k] = c, sc.picks[k]
		}
		for k, r := range p.rounds {
			if k+1 < len(p.rounds) && sc.ids[k] == sc.ids[k+1] {
				continue // the next (larger) class has the same path
			}
			c := sc.best[k]
			rows.entries = append(rows.entries, tableEntry{
				from: int32(i), to: int32(j), class: int32(k), off: int32(len(rows.paths)), n: int32(len(c.path)),
				cost: (twiceCost(c, r) + 1) / 2, sum: c.sum, max: c.max,
			})
			for _, x := range c.path {
				rows.paths = append(rows.paths, int32(x))
			}
		}
	}
}

// chainsEnds appends the entries from InP i to EgP j for a model with end
// segments (pathcomp.Model.EndICW): per class, the front point of least
// cost with the model's end RTT at both ends (Fronts.BestEnds), or the
// direct connection dc when orDirect and it is not worse. One entry per
// class: unlike the plain model, runs of classes are not merged.
func (p *plan) chainsEnds(i, j int, dc chain, orDirect bool, rows *tableRows) {
	for k, cl := range p.classes {
		pc, ok := p.fronts.BestEnds(i, j, cl.size, p.model.EndRTT, p.model.EndRTT)
		c := chain{path: pc.Path, sum: micros(pc.Sum), max: micros(pc.Max)}
		if !ok || orDirect && p.twiceCostEnds(dc, cl) <= p.twiceCostEnds(c, cl) {
			c = dc
		}
		rows.entries = append(rows.entries, tableEntry{
			from: int32(i), to: int32(j), class: int32(k), off: int32(len(rows.paths)), n: int32(len(c.path)),
			cost: (p.twiceCostEnds(c, cl) + 1) / 2, sum: c.sum, max: c.max,
		})
		for _, x := range c.path {
			rows.paths = append(rows.paths, int32(x))
		}
	}
}

// twiceCostEnds is twice pathcomp.Model.CostEnds of c for class cl with
// the model's end RTT at both ends, in microseconds.
func (p *plan) twiceCostEnds(c chain, cl sizeClass) int64 {
	e := micros(p.model.EndRTT)
	return c.sum + 2*e + 2*max(int64(cl.endRounds-1)*e, int64(cl.rounds-1)*c.max)
}

// twiceCost is twice Model.Cost of c for r rounds, in microseconds.
func twiceCost(c chain, r int) int64 { return c.sum + int64(2*(r-1))*c.max }

// micros rounds milliseconds to whole microseconds.
func micros(ms float64) int64 { return int64(math.Round(ms * 1000)) }

// planKey is one overlay secret as a computation hands it out: each FEP's
// receive key, derived once per computation (per-FEP signing, hop.RecvKey).
type planKey struct {
	name  string // "current", "previous", "next": its field in api.Keys
	id    uint8
	probe string   // hex of the overlay's probe key
	recv  [][]byte // R(fep) by FEP index
}

func newPlanKey(name string, secret []byte, ids []string) planKey {
	pk := planKey{name: name, id: pki.KeyID(secret), probe: hex.EncodeToString(pki.ProbeSecret(secret)), recv: make([][]byte, len(ids))}
	for i, id := range ids {
		pk.recv[i] = hop.RecvKey(secret, id)
	}
	return pk
}

// appendFEP appends `"name":{api.FEPKey}` of FEP l: its receive key and
// its send key to every other member of its table (locs).
func (pk *planKey) appendFEP(b []byte, l int, locs []int, ids []string) []byte {
	b = append(b, '"')
	b = append(b, pk.name...)
	b = append(b, `":{"id":`...)
	b = strconv.AppendUint(b, uint64(pk.id), 10)
	b = append(b, `,"recv":"`...)
	b = hex.AppendEncode(b, pk.recv[l])
	b = append(b, `","send":{`...)
	first := true
	for _, x := range locs {
		if x == l {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, ids[x])
		b = append(b, `:"`...)
		b = hex.AppendEncode(b, hop.SendKey(pk.recv[x], ids[l]))
		b = append(b, '"')
	}
	b = append(b, `},"probe":"`...)
	b = append(b, pk.probe...)
	return append(b, `"}`...)
}

// lopContent is the version-independent part of one LoP's table, encoded.
type lopContent struct {
	lop  string
	body []byte // `"keys":...,"members":...,"egress":...,"table":...`
	hash [32]byte
}

// content builds the encoded content of LoP l's table, appending to b[:0].
func (p *plan) content(b []byte, l int, inps []int, sc *chainScratch) (lopContent, error) {
	var rows tableRows
	for _, i := range inps {
		p.chains(i, &rows, sc)
	}
	used := make([]bool, len(p.feps))
	used[l] = true
	for _, i := range inps {
		used[i] = true
	}
	for _, x := range rows.paths {
		used[x] = true
	}
	for _, e := range p.egress {
		used[p.m.index[e.FEP]] = true
	}
	for _, x := range p.keep {
		used[x] = true
	}
	// FEPs (so m.Names) are sorted by id: index order is id order.
	var locs []int
	for x, u := range used {
		if u {
			locs = append(locs, x)
		}
	}
	b = slices.Grow(b[:0], 64+len(rows.entries)*120+len(p.keys)*len(locs)*(100+hex.EncodedLen(32)))
	if p.epoch != "" {
		b = append(b, `"epoch":`...)
		b = appendJSONString(b, p.epoch)
		b = append(b, ',')
	}
	b = append(b, `"keys":{`...)
	for k, pk := range p.keys {
		if k > 0 {
			b = append(b, ',')
		}
		b = pk.appendFEP(b, l, locs, p.m.Names)
	}
	b = append(b, `},"members":{`...)
	for k, x := range locs {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, p.qnames[x]...)
		b = append(b, ':')
		b = appendJSONString(b, p.feps[x].HopAddr)
	}
	b = append(b, '}')
	b = append(b, p.memberAllow...)
	if len(p.egress) > 0 {
		eg, err := json.Marshal(p.egress)
		if err != nil {
			return lopContent{}, fmt.Errorf("encode egress: %w", err)
		}
		b = append(b, `,"egress":`...)
		b = append(b, eg...)
	}
	if len(p.intercept) > 0 {
		in, err := json.Marshal(p.intercept)
		if err != nil {
			return lopContent{}, fmt.Errorf("encode intercept: %w", err)
		}
		b = append(b, `,"intercept":`...)
		b = append(b, in...)
	}
	b = append(b, `,"table":`...)
	b = appendTableFile(b, p.model, p.qnames, p.classes, locs, rows)
	return lopContent{lop: p.m.Names[l], body: b, hash: sha256.Sum256(b)}, nil
}

// writeTable writes the full JSON of an api.Table from its content.
func writeTable(w io.Writer, c lopContent, version uint64, computed time.Time) error {
	h := make([]byte, 0, 128)
	h = append(h, `{"lop":`...)
	h = appendJSONString(h, c.lop)
	h = append(h, `,"version":`...)
	h = strconv.AppendUint(h, version, 10)
	h = append(h, `,"computed":`...)
	t, err := computed.UTC().MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode time: %w", err)
	}
	h = append(h, t...)
	h = append(h, ',')
	if _, err := w.Write(h); err != nil {
		return err
	}
	if _, err := w.Write(c.body); err != nil {
		return err
	}
	_, err = io.WriteString(w, "}\n")
	return err
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
			// Per worker: one compressor, reset per table, and the
			// memory of the JSON body and of the chain search.
			var zbuf bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&zbuf, gzip.BestSpeed)
			var body []byte
			sc := p.newScratch()
			for l := range next {
				lc, err := p.content(body, l, inps[l], sc)
				if err != nil {
					errs[l] = err
					continue
				}
				body = lc.body
				if h, ok := prev[lc.lop]; ok && h == lc.hash {
					continue
				}
				zbuf.Reset()
				zw.Reset(&zbuf)
				err = writeTable(zw, lc, version, computed)
				if err == nil {
					err = zw.Close()
				}
				if err != nil {
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
// model), Locations: locs, Chains: rows} (without version), as encoding/json
// would for the rows' values rounded to whole microseconds, but several
// times faster: tables of 1000 FEPs hold millions of entries. qnames are
// the JSON strings of the location names.
func appendTableFile(b []byte, model pathcomp.Model, qnames [][]byte, classes []sizeClass, locs []int, rows tableRows) []byte {
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
	if model.EndICW != 0 {
		b = append(b, `"end_icw":`...)
		b = strconv.AppendInt(b, int64(model.EndICW), 10)
		b = append(b, `,"end_rtt_ms":`...)
		b = appendJSONFloat(b, model.EndRTT)
		b = append(b, ',')
	}
	b = append(b, `"locations":[`...)
	for k, x := range locs {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, qnames[x]...)
	}
	b = append(b, `],"chains":[`...)
	for k, e := range rows.entries {
		if k > 0 {
			b = append(b, ',')
		}
		cl := classes[e.class]
		b = append(b, `{"from":`...)
		b = append(b, qnames[e.from]...)
		b = append(b, `,"to":`...)
		b = append(b, qnames[e.to]...)
		b = append(b, `,"size":`...)
		b = strconv.AppendInt(b, cl.size, 10)
		b = append(b, `,"rounds":`...)
		b = strconv.AppendInt(b, int64(cl.rounds), 10)
		if cl.endRounds != 0 {
			b = append(b, `,"end_rounds":`...)
			b = strconv.AppendInt(b, int64(cl.endRounds), 10)
		}
		b = append(b, `,"path":[`...)
		for x, id := range rows.paths[e.off : e.off+e.n] {
			if x > 0 {
				b = append(b, ',')
			}
			b = append(b, qnames[id]...)
		}
		b = append(b, `],"cost_ms":`...)
		b = appendMillis(b, e.cost)
		b = append(b, `,"sum_ms":`...)
		b = appendMillis(b, e.sum)
		b = append(b, `,"max_ms":`...)
		b = appendMillis(b, e.max)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendMillis appends us microseconds (>= 0) as milliseconds the way
// encoding/json writes the float64 nearest to us/1000: shortest form, no
// trailing zeros (exact below 2^53/1000 us, far above MaxRTT sums).
func appendMillis(b []byte, us int64) []byte {
	if us < 0 {
		return appendJSONFloat(b, float64(us)/1000)
	}
	b = strconv.AppendInt(b, us/1000, 10)
	frac := us % 1000
	if frac == 0 {
		return b
	}
	b = append(b, '.', byte('0'+frac/100))
	if frac%100 != 0 {
		b = append(b, byte('0'+frac/10%10))
		if frac%10 != 0 {
			b = append(b, byte('0'+frac%10))
		}
	}
	return b
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

// FEPKeyOf returns FEP fep's share of the overlay secret (what its table's
// api.Keys carry): its receive key, its send keys to members (fep itself
// skipped) and the probe key. Tables are built by the same derivation.
func FEPKeyOf(secret []byte, fep string, members []string) *api.FEPKey {
	k := &api.FEPKey{ID: pki.KeyID(secret), Recv: hex.EncodeToString(hop.RecvKey(secret, fep)),
		Send: map[string]string{}, Probe: hex.EncodeToString(pki.ProbeSecret(secret))}
	for _, m := range members {
		if m != fep {
			k.Send[m] = hex.EncodeToString(hop.SendKey(hop.RecvKey(secret, m), fep))
		}
	}
	return k
}
