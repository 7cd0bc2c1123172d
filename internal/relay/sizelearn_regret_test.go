package relay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// BenchmarkSizeHintRegret prints what each size-hint rule costs in the
// planner's own model: for flows whose sizes follow a per-destination
// distribution (log-normal around a median drawn from 10 KB-20 MB, spread
// sigma, with 5% aborted flows at 1% of the size and 5% large files at 30x),
// the chain picked for the hint is costed at the flow's real rounds and
// compared with the chain the planner would pick knowing the size.
// Reported per rule: the mean extra cost in ms and in % of the ideal, over
// the flows after min_flows. Run:
//
//	go test -run '^$' -bench SizeHintRegret -benchtime 1x ./internal/relay
func BenchmarkSizeHintRegret(b *testing.B) {
	rtt := pathcomp.SyntheticRTT(40, 18)
	for _, icw := range []int{10, 100} {
		model := pathcomp.Model{ICW: icw}
		f, err := pathcomp.Precompute(rtt, pathcomp.Options{Model: model})
		if err != nil {
			b.Fatal(err)
		}
		for _, sigma := range []float64{0.3, 1, 2} {
			b.Run(fmt.Sprintf("icw%d/sigma%v", icw, sigma), func(b *testing.B) {
				for b.Loop() {
					res := hintRegret(f, model, sigma)
					for _, r := range res {
						b.ReportMetric(r.ms, r.name+"-ms")
						b.ReportMetric(r.pct, r.name+"-%")
					}
				}
			})
		}
	}
}

type regret struct {
	name    string
	ms, pct float64
}

// hintRegret simulates 600 destinations of 60 flows each and returns the
// mean regret of the static hint (14.6 KB: one initial window) and of the
// learner at several quantiles.
func hintRegret(f *pathcomp.Fronts, model pathcomp.Model, sigma float64) []regret {
	rng := rand.New(rand.NewPCG(1, uint64(sigma*10)))
	qs := []float64{0.5, 0.75, 0.9, 1}
	names := []string{"static", "q50", "q75", "q90", "max"}
	sumMS := make([]float64, len(names))
	sumPct := make([]float64, len(names))
	n := 0
	best := func(i, j int, size int64) pathcomp.Chain {
		c, _ := f.Best(i, j, model.Rounds(size))
		return c
	}
	for range 600 {
		i, j := rng.IntN(f.N()), rng.IntN(f.N())
		if i == j {
			continue
		}
		median := math.Exp(math.Log(10e3) + rng.Float64()*(math.Log(20e6)-math.Log(10e3)))
		ls := make([]*sizeLearner, len(qs))
		for k, q := range qs {
			ls[k] = newSizeLearner(SizeLearnConfig{Quantile: q})
		}
		key := sizeKeys{base: "k"}
		for flow := range 60 {
			size := int64(median * math.Exp(sigma*rng.NormFloat64()))
			switch u := rng.Float64(); {
			case u < 0.05:
				size /= 100
			case u < 0.10:
				size *= 30
			}
			size = max(size, 1)
			r := model.Rounds(size)
			ideal := model.Cost(best(i, j, size), r)
			hints := []int64{14_600}
			for _, l := range ls {
				h, _ := l.hint(key, 14_600)
				hints = append(hints, h)
				l.observe(key, size)
			}
			if flow < DefaultSizeMinFlows {
				continue
			}
			n++
			for k, h := range hints {
				extra := model.Cost(best(i, j, h), r) - ideal
				sumMS[k] += extra
				sumPct[k] += 100 * extra / ideal
			}
		}
	}
	out := make([]regret, len(names))
	for k := range names {
		out[k] = regret{names[k], sumMS[k] / float64(n), sumPct[k] / float64(n)}
	}
	return out
}
