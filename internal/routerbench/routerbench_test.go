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
