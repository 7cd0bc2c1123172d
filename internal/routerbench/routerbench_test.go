package routerbench

import (
	"testing"
	"time"
)

// The world of every hop count is a valid emulator spec: each client
// reaches rr and the surrogates through exactly its hops.
func TestWorldSpec(t *testing.T) {
	spec := worldSpec([]int{1, 3, 8}, 0.5, 10, false)
	if err := spec.Validate(); err != nil {
		t.Fatalf("world spec: %v", err)
	}
	vias := map[string]int{}
	for _, r := range spec.Routes {
		vias[r.From+">"+r.To] = len(r.Via)
	}
	for _, c := range []struct {
		from string
		hops int
	}{{"c1", 1}, {"c3", 3}, {"c8", 8}} {
		for _, to := range []string{"rr", "s1", "s2"} {
			if got := vias[c.from+">"+to]; got != c.hops {
				t.Errorf("%s -> %s through %d hosts; want %d", c.from, to, got, c.hops)
			}
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{Mosto: "/bin/true"}
	if err := c.defaults(); err != nil || c.Runs != 30 || len(c.Hops) != 4 {
		t.Fatalf("defaults: %v %+v", err, c)
	}
	for _, bad := range []Config{{Mosto: "x", Hops: []int{9}}, {Mosto: "x", Modes: []string{"teleport"}}, {}} {
		if err := bad.defaults(); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
	if ms(1500*time.Microsecond) != 1.5 {
		t.Error("ms")
	}
}

// With rr on the path, a client reaches the surrogates through its hops
// and then rr, and rr itself through its hops only.
func TestWorldSpecRROnPath(t *testing.T) {
	spec := worldSpec([]int{1, 4}, 0.5, 10, true)
	if err := spec.Validate(); err != nil {
		t.Fatalf("world spec: %v", err)
	}
	for _, r := range spec.Routes {
		want := 1
		if r.From == "c4" {
			want = 4
		}
		if r.To != "rr" {
			want++
			if r.Via[len(r.Via)-1] != "rr" {
				t.Errorf("%s -> %s via %v; want rr last", r.From, r.To, r.Via)
			}
		}
		if len(r.Via) != want {
			t.Errorf("%s -> %s via %v; want %d hosts", r.From, r.To, r.Via, want)
		}
	}
}

// The geographic world is a valid spec over the WonderProxy matrix, and
// each client's direct surrogate is the nearer one by that matrix.
func TestGeoSpec(t *testing.T) {
	spec := geoSpec(len(GeoClients))
	if err := spec.Validate(); err != nil {
		t.Fatalf("geo spec: %v", err)
	}
	if len(spec.Hosts) != len(GeoClients)+4 {
		t.Fatalf("%d hosts", len(spec.Hosts))
	}
	for k, want := range map[int]string{1: "s1", 3: "s1", 4: "s2", 6: "s2"} {
		if got := geoNearest(k); got != want {
			t.Errorf("client %d (%s): nearest %s, want %s", k, GeoClients[k-1], got, want)
		}
	}
	c := Config{Mosto: "x", Geo: true}
	if err := c.defaults(); err != nil || len(c.Hops) != len(GeoClients) {
		t.Fatalf("geo defaults: %v %v", err, c.Hops)
	}
	if err := (&Config{Mosto: "x", Geo: true, Hops: []int{7}}).defaults(); err == nil {
		t.Error("client 7 of 6 accepted")
	}
}

// The bootstrap interval of a median holds the median, is a point for a
// constant sample and is reproducible.
func TestMedianCI(t *testing.T) {
	if lo, hi := medianCI([]float64{2, 2, 2, 2}); lo != 2 || hi != 2 {
		t.Errorf("constant sample: [%v, %v]; want [2, 2]", lo, hi)
	}
	xs := make([]float64, 101)
	for i := range xs {
		xs[i] = float64(i)
	}
	lo, hi := medianCI(xs)
	if !(lo < 50 && 50 < hi) || lo < 30 || hi > 70 {
		t.Errorf("0..100: [%v, %v]; want around 50, within 30..70", lo, hi)
	}
	if lo2, hi2 := medianCI(xs); lo2 != lo || hi2 != hi {
		t.Errorf("not reproducible: [%v, %v] then [%v, %v]", lo, hi, lo2, hi2)
	}
}
