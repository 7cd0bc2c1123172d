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
