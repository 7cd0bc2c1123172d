package getbench

import (
	"math"
	"testing"
	"time"
)

// TestTCPBound: the multisource world (12, 24, 8 Mbit/s; RTTs 38, 55 and
// 44 ms) gives session 8's hand arithmetic: payload 5.31 MB/s, 0.51 MB
// not delivered while waiting 2 RTTs, 0.53 MB in slow start: 2.46 s, 0.89
// of the nominal 2.18 s. One source with a BDP below the initial window
// loses only its waits.
func TestTCPBound(t *testing.T) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	got := TCPBound(12e6, []float64{12, 24, 8}, []time.Duration{ms(38), ms(55), ms(44)})
	if math.Abs(got-2.456) > 0.005 {
		t.Errorf("TCPBound(multisource) = %.3f s; want 2.456", got)
	}
	if r := Ideal(12e6) / got; math.Abs(r-0.888) > 0.003 {
		t.Errorf("nominal / bound = %.3f; want 0.888", r)
	}
	// 1 Mbit/s at 10 ms: BDP 1.2 KB < 10 segments: no slow-start loss.
	r := 1e6 / 8 * 1448 / 1500
	want := (1e6 + r*0.02) / r
	if got := TCPBound(1e6, []float64{1}, []time.Duration{ms(10)}); math.Abs(got-want) > 1e-9 {
		t.Errorf("TCPBound(1 Mbit/s, 10 ms) = %.6f; want %.6f", got, want)
	}
}
