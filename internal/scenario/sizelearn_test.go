package scenario_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/cli/clitest"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/stats"
	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/topo"
)

// sizeLearnSpec is a world where the size hint picks the chain: the
// ingress FEP (with the client) reaches the egress FEP (with the origin)
// over 100 ms of RTT directly or over 55 + 55 ms through a middle FEP. A
// transfer of one slow-start round takes the direct hop (50 ms against 55
// in the planner's cost), one of several rounds the middle FEP.
func sizeLearnSpec() *emu.Spec {
	zero := 0
	one := 0.5
	return &emu.Spec{
		Name: "sizelearn",
		Matrix: &topo.Matrix{Names: []string{"Ingress", "Middle", "Egress"}, RTT: [][]float64{
			{0, 55, 100},
			{55, 0, 55},
			{100, 55, 0},
		}},
		Hosts: []emu.HostSpec{
			{Name: "client", Location: "Ingress"}, {Name: "origin", Location: "Egress"},
			{Name: "in", Location: "Ingress"}, {Name: "mid", Location: "Middle"}, {Name: "out", Location: "Egress"},
		},
		Links: []emu.LinkSpec{{A: "client", B: "in", DelayMS: &one}, {A: "out", B: "origin", DelayMS: &one}},
		TCP:   emu.TCP{SlowStartAfterIdle: &zero},
	}
}

// BenchmarkSizeLearning shows the InP's size learning in an emulated world
// (sizeLearnSpec; route initcwnd 40 on the FEPs, no pools, the table planned
// for ICW 40): a service serving 2 MB objects under a static size hint of
// 1000 bytes takes the chain of one round (the direct hop) until
// size_learning.min_flows flows completed, then the chain of the learned
// size (through the middle FEP). A control service (2.1 MB, hinted with
// its own size: what a perfect static hint does) is fetched before every
// fetch of the learning one, so a change of the machine between the
// phases shows in it. It prints the chains taken and the fetch times per
// phase. Run (root, quiet machine):
//
//	go test -run '^$' -bench SizeLearning -benchtime 1x -timeout 15m ./internal/scenario
func BenchmarkSizeLearning(b *testing.B) {
	testenv.RequirePrivileged(b)
	const minFlows = 10
	w := emutest.Start(b, sizeLearnSpec())
	mosto, env := clitest.Mosto(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const size, control, hint = 2_000_000, 2_100_000, 1000
	sc, err := scenario.Start(ctx, w, scenario.Config{
		Roles: scenario.Roles{Single: "mid"},
		Sizes: []int64{size, control}, SizeHints: []int64{hint, 0}, SizeMinFlows: minFlows,
		Mosto: mosto, Env: env, Dir: b.TempDir(),
		Tune: scenario.Tune{InitCwnd: 40}, Model: pathcomp.Model{ICW: 40},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	r := sc.Roles()
	static, _ := sc.ComputedChain(hint)
	learned, _ := sc.ComputedChain(size)
	b.Logf("table: %d bytes -> %s; %d bytes -> %s", int64(hint), strings.Join(static, " > "), int64(size), strings.Join(learned, " > "))
	if slices.Equal(static, learned) {
		b.Fatal("the table holds one chain for both sizes: nothing to learn")
	}
	type phase struct {
		ms, ctl []float64
		chains  map[string]int
	}
	phases := [2]phase{{chains: map[string]int{}}, {chains: map[string]int{}}}
	for i := range 2 * minFlows {
		p := &phases[min(i/minFlows, 1)]
		c, err := sc.Fetch(ctx, scenario.Chain, control, uint64(100+i))
		if err != nil {
			b.Fatal(err)
		}
		p.ctl = append(p.ctl, float64(c.Result.Total.Microseconds())/1000)
		before, err := sc.Hops(ctx)
		if err != nil {
			b.Fatal(err)
		}
		s, err := sc.Fetch(ctx, scenario.Chain, size, uint64(i))
		if err != nil {
			b.Fatal(err)
		}
		after, err := sc.Hops(ctx)
		if err != nil {
			b.Fatal(err)
		}
		used, _ := scenario.UsedChain(before, after, r.InP)
		p.ms = append(p.ms, float64(s.Result.Total.Microseconds())/1000)
		p.chains[strings.Join(used, " > ")]++
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\n| phase | flows | chain taken (flows) | 2 MB median ms | mean ms | control 2.1 MB median ms |\n|---|---|---|---|---|---|\n")
	for k, name := range []string{"static hint 1000 B", "learned"} {
		p := phases[k]
		var cs []string
		for c, n := range p.chains {
			cs = append(cs, fmt.Sprintf("%s (%d)", c, n))
		}
		slices.Sort(cs)
		fmt.Fprintf(&out, "| %s | %d | %s | %.1f | %.1f | %.1f |\n", name, len(p.ms), strings.Join(cs, ", "), stats.Median(p.ms), stats.Mean(p.ms), stats.Median(p.ctl))
	}
	before, after := stats.Median(phases[0].ms), stats.Median(phases[1].ms)
	fmt.Fprintf(&out, "\nlearned / static: %.2fx (median); control learned-phase / static-phase: %.2fx\n", after/before, stats.Median(phases[1].ctl)/stats.Median(phases[0].ctl))
	b.Log(out.String())
	b.ReportMetric(before, "static-ms")
	b.ReportMetric(after, "learned-ms")
}
