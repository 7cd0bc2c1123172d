package routerbench

import (
	"testing"
	"time"
)

// The world of every hop count is a valid emulator spec: each client
// reaches rr and the surrogates through exactly its hops.
func TestWorldSpec(t *testing.T) {
	spec := worldSpec([]int{1, 3, 8}, 0.5, 10)
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
