package scenario

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConnectCounts(t *testing.T) {
	in := `# HELP mosto_relay_connect_seconds Time to connect
# TYPE mosto_relay_connect_seconds histogram
mosto_relay_connect_seconds_bucket{peer="London",le="0.1"} 3
mosto_relay_connect_seconds_count{peer="London"} 7
mosto_relay_upstream_total{peer="London",via="dial"} 1
mosto_relay_upstream_total{peer="London",via="pool"} 2
mosto_relay_upstream_total{peer="origin",via="dial"} 2
mosto_relay_connect_seconds_sum{peer="origin"} 0.01
`
	got, err := parseConnectCounts(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["London"] != 3 || got["origin"] != 2 {
		t.Errorf("parseConnectCounts = %v", got)
	}
	if _, err := parseConnectCounts(strings.NewReader(`mosto_relay_upstream_total{peer="x",via="dial"} abc` + "\n")); err == nil {
		t.Errorf("malformed value accepted")
	}
}

func TestUsedChain(t *testing.T) {
	before := Hops{"A": {"B": 1}, "B": {"C": 1}, "C": {"origin": 1}}
	after := Hops{"A": {"B": 2}, "B": {"C": 2}, "C": {"origin": 2}, "D": {"origin": 1}}
	if p, ok := UsedChain(before, after, "A"); !ok || !slices.Equal(p, []string{"A", "B", "C"}) {
		t.Errorf("UsedChain = %v, %v; want [A B C], true", p, ok)
	}
	// Ambiguous: two new peers at A.
	after["A"]["D"] = 1
	if _, ok := UsedChain(before, after, "A"); ok {
		t.Errorf("ambiguous walk reported ok")
	}
	// Direct from the entry.
	if p, ok := UsedChain(Hops{}, Hops{"D": {"origin": 1}}, "D"); !ok || !slices.Equal(p, []string{"D"}) {
		t.Errorf("UsedChain direct = %v, %v", p, ok)
	}
}

func TestRolesResolve(t *testing.T) {
	ms := map[string]float64{
		"client|A": 1, "client|B": 50, "client|C": 100, "client|origin": 110,
		"A|B": 50, "A|C": 100, "A|origin": 110, "B|C": 50, "B|origin": 60, "C|origin": 2,
	}
	d := func(a, b string) time.Duration {
		if v, ok := ms[a+"|"+b]; ok {
			return time.Duration(v * 1e6)
		}
		return time.Duration(ms[b+"|"+a] * 1e6)
	}
	hosts := []string{"client", "origin", "A", "B", "C"}
	r, err := Roles{}.resolve(hosts, d)
	if err != nil {
		t.Fatal(err)
	}
	if r.InP != "A" || r.EgP != "C" || r.Single != "B" || !slices.Equal(r.FEPs, []string{"A", "B", "C"}) {
		t.Errorf("resolve = %+v; want InP A, EgP C, Single B, FEPs [A B C]", r)
	}
	bad := []Roles{
		{Client: "nope"},
		{FEPs: []string{"client"}},
		{InP: "C", EgP: "C"},
		{Single: "origin"},
	}
	for _, b := range bad {
		if _, err := b.resolve(hosts, d); err == nil {
			t.Errorf("resolve(%+v) succeeded; want error", b)
		}
	}
}

func TestDemoSpec(t *testing.T) {
	s, err := DemoSpec()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, h := range s.Hosts {
		names = append(names, h.Name)
	}
	if len(names) != 10 || !slices.Contains(names, "client") || !slices.Contains(names, "origin") {
		t.Errorf("demo hosts = %v; want client, origin and 8 FEPs", names)
	}
}

func TestResultsReport(t *testing.T) {
	r := &Results{
		Modes: []Mode{Direct, Chain, CDNWarm}, Sizes: []int64{10_000}, Runs: 3,
		MS: map[Mode]map[int64][]float64{
			Direct:  {10_000: {300, 310, 320}},
			Chain:   {10_000: {150, 160, 155}},
			CDNWarm: {10_000: {200, 205, 210}},
		},
		Planned: map[int64][]string{10_000: {"A", "B"}},
		Chains:  map[int64][]string{10_000: {"A", "B"}},
		RTT:     150 * time.Millisecond, RateBps: 1e6,
		Predicted: map[Mode]map[int64]float64{Direct: {10_000: 279}, Chain: {10_000: 162.75}},
	}
	if got := r.Limit(10_000); got != 160 {
		t.Errorf("Limit = %v; want 150 ms + 10 ms", got)
	}
	var b strings.Builder
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"| 10KB | mosto-chain |   3 | 155.0 |  5.0 |  155.0 | 150.5 | 159.5 |", // summary row
		"| 10KB | mosto-chain |   2.00x | 0.00 | 0.1 |",                        // vs direct: 310/155, all faster, exact p = 2/20
		"| 10KB | direct      |   0.66x | 1.00 | 0.1 |",                        // vs cdn-warm: 205/310
		"A > B",
		"bottleneck 8 Mbit/s",
		// Fetch model vs measured: 279 / 310 - 1 = -10%, 162.75 / 155 - 1 = +5%; no model of cdn-warm.
		"Fetch model vs measured, every mode",
		"| 10KB          | 279.0 / 310.0 (-10%) | 162.8 / 155.0 (+5%) |",
		"| largest error |                 -10% |                 +5% |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	var svg strings.Builder
	if err := r.WriteSVG(&svg, "t"); err != nil || strings.Count(svg.String(), "<g ") != 4 {
		t.Errorf("WriteSVG: %v; %d series (want 3 modes + limit)", err, strings.Count(svg.String(), "<g "))
	}
}

func FuzzParseConnectCounts(f *testing.F) {
	f.Add("mosto_relay_connect_seconds_count{peer=\"London\"} 3\n")
	f.Add("mosto_relay_connect_seconds_count{le=\"1\",peer=\"origin\"} 2e3\n# comment\n")
	f.Add("mosto_relay_connect_seconds_count{peer=\"x\"} abc\n")
	f.Add("mosto_relay_connect_seconds_count{")
	f.Fuzz(func(t *testing.T, in string) {
		m, err := parseConnectCounts(strings.NewReader(in))
		if err != nil {
			return
		}
		for peer := range m {
			if peer == "" {
				t.Fatalf("empty peer accepted from %q", in)
			}
		}
	})
}
