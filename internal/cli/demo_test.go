package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/scenario"
)

// TestPrintDemoLimit: the demo's table gives the physical limit and the
// chain's median over it next to the speedups.
func TestPrintDemoLimit(t *testing.T) {
	res := &scenario.Results{
		Modes: []scenario.Mode{scenario.Direct, scenario.Chain, scenario.CDNWarm},
		Sizes: []int64{10_000},
		MS: map[scenario.Mode]map[int64][]float64{
			scenario.Direct:  {10_000: {300}},
			scenario.Chain:   {10_000: {165}},
			scenario.CDNWarm: {10_000: {180}},
		},
		Chains:  map[int64][]string{10_000: {"A", "B"}},
		Planned: map[int64][]string{10_000: {"A", "B"}},
		RTT:     150 * time.Millisecond,
	}
	var out bytes.Buffer
	printDemo(&Env{Stdout: &out}, res, res.Modes)
	s := out.String()
	for _, want := range []string{"limit ms", "chain / limit", "1.82x", "1.09x", "150", "1.10", "physical limit"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
}

func TestTuningNote(t *testing.T) {
	c := scenario.Config{Tune: scenario.Tune{InitCwnd: 100, FastOpen: true}, TuneCDN: true, CDNHost: "London"}
	s := tuningNote(c, true)
	for _, want := range []string{"initcwnd/initrwnd 100", "host London", "origin has kernel defaults", "ICW 10 segments"} {
		if !strings.Contains(s, want) {
			t.Errorf("tuning note lacks %q: %s", want, s)
		}
	}
	c.Model = pathcomp.Model{ICW: 100, EndICW: 10, EndRTT: -1}
	if s := tuningNote(c, true); !strings.Contains(s, "end segments (client - InP, EgP - origin) ICW 10 over the world's client-InP RTT") {
		t.Errorf("end segments not said: %s", s)
	}
	if s := tuningNote(scenario.Config{TuneCDN: false}, true); !strings.Contains(s, "no levers (--tune-cdn=false)") {
		t.Errorf("untuned CDN not said: %s", s)
	}
}
