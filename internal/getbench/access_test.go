package getbench

import (
	"math"
	"testing"
)

// TestAccessSpec: the failure-access world is valid, routes every source
// through the gateway, and its sources' paths together exceed the access
// link (headroom: while Paris is silent the others can rise) while the
// others alone do not fill it.
func TestAccessSpec(t *testing.T) {
	s := AccessSpec()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	routed := map[string]bool{}
	for _, r := range s.Routes {
		if r.From != client || len(r.Via) != 1 || r.Via[0] != "gw" {
			t.Errorf("route %+v: want client -> gw -> source", r)
		}
		routed[r.To] = true
	}
	var sum, others float64
	for _, src := range sources {
		if !routed[src.host] {
			t.Errorf("%s not routed through the access link", src.host)
		}
		sum += accessSources[src.host]
		if src.host != "paris" {
			others += accessSources[src.host]
		}
	}
	if sum <= accessMbit || others >= accessMbit {
		t.Errorf("paths %v Mbit/s (others %v) vs access %v: want sum > access > others", sum, others, accessMbit)
	}
}

// TestFailureBound checks the bound against the arithmetic done by hand:
// in Spec's world Paris is 24 of 44 Mbit/s, so 7 s x 24/44 = 3.82 s; in
// AccessSpec's the others reach 34 of the 36 Mbit/s access link, so
// 7 s x 2/36 = 0.39 s.
func TestFailureBound(t *testing.T) {
	for sc, want := range map[string]float64{"failure": 7.0 * 24 / 44, "failure-access": 7.0 * 2 / 36} {
		if got := FailureBound(sc); math.Abs(got-want) > 1e-9 {
			t.Errorf("FailureBound(%s) = %.4f s, want %.4f", sc, got, want)
		}
	}
}
