package controller

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/store"
)

// syntheticWorld places n FEPs at random coordinates and measures, like the
// agents would, each FEP's targets with an RTT from the distance.
func syntheticWorld(n int) ([]api.FEP, []store.RTT) {
	rng := rand.New(rand.NewPCG(1, 2))
	feps := make([]api.FEP, n)
	for i := range feps {
		feps[i] = api.FEP{ID: fmt.Sprintf("fep%04d", i), HopAddr: fmt.Sprintf("10.%d.%d.1:7000", i/250, i%250),
			ProbeAddr: fmt.Sprintf("10.%d.%d.1:7001", i/250, i%250), Lat: rng.Float64()*140 - 60, Lon: rng.Float64()*360 - 180}
	}
	slices.SortFunc(feps, func(a, b api.FEP) int { return strings.Compare(a.ID, b.ID) })
	var rtts []store.RTT
	now := time.Now()
	for i, ts := range ChooseTargets(feps, TargetPolicy{}) {
		for _, tg := range ts {
			j, _ := slices.BinarySearchFunc(feps, tg.ID, cmpFEP)
			d := DistanceKm(feps[i].Lat, feps[i].Lon, feps[j].Lat, feps[j].Lon)
			rtts = append(rtts, store.RTT{From: feps[i].ID, To: tg.ID, MS: (2 + 1.3*d/100) * (1 + 0.1*rng.Float64()), At: now})
		}
	}
	return feps, rtts
}

// BenchmarkComputePhases times the phases of one computation for
// MOSTO_BENCH_FEPS FEPs (default 1000), with at most MOSTO_BENCH_MAXPROXIES
// proxies per chain (default DefaultMaxProxies; -1: unlimited):
//
//	MOSTO_BENCH_FEPS=1000 go test -run XXX -bench ComputePhases -benchtime 1x ./internal/controller/
func BenchmarkComputePhases(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("MOSTO_BENCH_FEPS")); err == nil && v > 1 {
		n = v
	}
	mp, _ := strconv.Atoi(os.Getenv("MOSTO_BENCH_MAXPROXIES"))
	feps, rtts := syntheticWorld(n)
	cfg, err := Config{Store: openBolt(b), MaxProxies: mp}.withDefaults()
	if err != nil {
		b.Fatal(err)
	}
	keys := store.Keys{Current: make([]byte, 32)}
	for b.Loop() {
		c0 := cpuTime()
		t0 := time.Now()
		m := BuildMatrix(feps, rtts)
		_ = time.Now()
		p, err := newPlan(cfg, feps, m, keys)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		c2 := cpuTime()
		changed, err := p.tables(nil, 1, t0)
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		c3 := cpuTime()
		total := 0
		for _, bt := range changed {
			total += len(bt.gz)
		}
		lc, err := p.content(nil, 0, []int{0}, p.newScratch())
		if err != nil {
			b.Fatal(err)
		}
		var tab struct {
			Table pathcomp.TableFile `json:"table"`
		}
		if err := json.Unmarshal([]byte("{"+string(lc.body)+"}"), &tab); err != nil {
			b.Fatal(err)
		}
		entries, hops := len(tab.Table.Chains), 0
		for _, e := range tab.Table.Chains {
			hops += len(e.Path) - 1
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.Logf("max proxies %d", cfg.MaxProxies)
		b.Logf("%d FEPs, %d links: matrix+precompute %s (CPU %s), chains+encode+gzip %s (CPU %s, %d MB gzip, %d kB JSON per table), Go heap peak-ish %d MB",
			n, p.fronts.Links(), t2.Sub(t0).Round(time.Millisecond), (c2 - c0).Round(time.Millisecond),
			t3.Sub(t2).Round(time.Millisecond), (c3 - c2).Round(time.Millisecond), total>>20, len(lc.body)>>10, ms.HeapSys>>20)
		b.Logf("table of %s: %d entries for %d EgPs (%.1f per pair), %.1f hops per chain", lc.lop, entries, n-1,
			float64(entries)/float64(n-1), float64(hops)/float64(max(1, entries)))
		if cfg.MaxProxies >= 0 {
			// The price of the bound: predicted costs of the chosen chains
			// against unlimited chains, from the first 20 InPs.
			ucfg := cfg
			ucfg.MaxProxies = -1
			up, err := newPlan(ucfg, feps, m, keys)
			if err != nil {
				b.Fatal(err)
			}
			var ratio, worst float64
			count := 0
			for i := 0; i < min(20, n); i++ {
				bc, uc := classCosts(p, i), classCosts(up, i)
				for x := range bc {
					r := bc[x] / uc[x]
					ratio += r
					worst = max(worst, r)
					count++
				}
			}
			b.Logf("cost of the chosen chains vs unlimited (20 InPs, every EgP and class): mean %.4f, worst %.3f", ratio/float64(count), worst)
		}
	}
}

// classCosts returns the predicted cost (us) of InP i's chain to every EgP
// for every size class, in EgP then class order, from the entries
// plan.chains emits (one per run of classes with the same chain).
func classCosts(p *plan, i int) []float64 {
	var rows tableRows
	p.chains(i, &rows, p.newScratch())
	var out []float64
	next := 0 // the first class of the current EgP not yet covered
	for _, e := range rows.entries {
		for k := next; k <= int(e.class); k++ {
			out = append(out, float64(twiceCost(chain{sum: e.sum, max: e.max}, p.classes[k].rounds)))
		}
		next = int(e.class) + 1
		if next == len(p.classes) {
			next = 0
		}
	}
	return out
}
