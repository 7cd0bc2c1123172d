package pathcomp

import (
	"fmt"
	"testing"
)

func BenchmarkPrecompute(b *testing.B) {
	for _, n := range []int{115, 246, 500, 1000} {
		rtt := SyntheticRTT(n, 1)
		for _, plain := range []bool{false, true} {
			if plain && n > 246 {
				continue
			}
			b.Run(fmt.Sprintf("n=%d/plain=%v", n, plain), func(b *testing.B) {
				var f *Fronts
				for b.Loop() {
					var err error
					f, err = Precompute(rtt, Options{Plain: plain})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(f.Entries())/float64(n*(n-1)/2), "entries/pair")
				b.ReportMetric(float64(f.Bytes())/(1<<20), "MiB")
			})
		}
	}
}

// BenchmarkPrecomputeBounded compares, side by side, unlimited chains with
// hop-bounded ones (MaxProxies 4 and 2) on complete synthetic matrices. For
// the bounded runs it reports the mean predicted cost of the best chains
// relative to the unlimited ones (rounds 1, 5 and 10, every pair) and the
// mean proxies per chain:
//
//	go test -run XXX -bench PrecomputeBounded -benchtime 1x ./internal/pathcomp/
func BenchmarkPrecomputeBounded(b *testing.B) {
	for _, n := range []int{246, 500, 1000} {
		rtt := SyntheticRTT(n, 1)
		var free *Fronts
		for _, mp := range []int{0, 4, 2} {
			b.Run(fmt.Sprintf("n=%d/maxproxies=%d", n, mp), func(b *testing.B) {
				var f *Fronts
				for b.Loop() {
					var err error
					f, err = Precompute(rtt, Options{MaxProxies: mp})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(f.Entries())/float64(n*(n-1)/2), "entries/pair")
				b.ReportMetric(float64(f.Bytes())/(1<<20), "MiB")
				if mp == 0 {
					free = f
				}
				var ratio, proxies float64
				count := 0
				for i := 0; i < n; i++ {
					for j := i + 1; j < n; j++ {
						for _, r := range []int{1, 5, 10} {
							c, _ := f.Best(i, j, r)
							proxies += float64(c.Proxies())
							if free != nil {
								fc, _ := free.Best(i, j, r)
								ratio += f.Model().Cost(c, r) / f.Model().Cost(fc, r)
							}
							count++
						}
					}
				}
				b.ReportMetric(proxies/float64(count), "proxies/chain")
				if free != nil {
					b.ReportMetric(ratio/float64(count), "cost/unlimited")
				}
			})
		}
	}
}

func BenchmarkBestAppend(b *testing.B) {
	f, err := Precompute(SyntheticRTT(246, 1), Options{})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]int, 0, 64)
	i := 0
	for b.Loop() {
		i++
		c, _ := f.BestAppend(buf, i%246, (i*7+1)%246, 1+i%12)
		buf = c.Path
	}
}

func BenchmarkIndexLookup(b *testing.B) {
	rtt := JitteredCopies(SyntheticRTT(60, 2), 246, 1)
	names := make([]string, len(rtt))
	for i := range names {
		names[i] = fmt.Sprintf("City%03d", i)
	}
	f, err := Precompute(rtt, Options{})
	if err != nil {
		b.Fatal(err)
	}
	sizes := []int64{14_000, 450_000, 14_935_000}
	ix, err := NewIndex(BuildTable(names, f, sizes))
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	n := 0
	for b.Loop() {
		i++
		e, _ := ix.Lookup(names[i%246], names[(i*7+1)%246], sizes[i%3])
		n += e.Rounds
	}
}
