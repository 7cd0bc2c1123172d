package onpath

import (
	"strings"
	"testing"
	"time"
)

// FuzzParseConfig: any input gives a config or an error, never a panic;
// an accepted config builds a planner whose decisions name only declared
// relays.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"paths: [{name: cs, relays: [r1, r2], dests: [10.0.0.1], ports: \"80\"}]\nhold: 2s\n",
		"gain: 0.2\nmin_segs: 10\npaths: [{name: a, relays: [x], pin: all}]\n",
		"paths: [{name: a, relays: []}]",
		"hold: nope",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConfig(strings.NewReader(s))
		if err != nil {
			return
		}
		pl, err := New(c, time.Unix(0, 0))
		if err != nil {
			t.Fatalf("accepted config %+v: New: %v", c, err)
		}
		relays := map[string]bool{}
		for _, p := range c.Paths {
			for _, r := range p.Relays {
				relays[r] = true
			}
		}
		for _, in := range pl.Intercepts() {
			if !relays[in.FEP] {
				t.Fatalf("decision for undeclared relay %q", in.FEP)
			}
		}
	})
}
