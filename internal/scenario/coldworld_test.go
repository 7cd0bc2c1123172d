package scenario_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/cli/clitest"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestColdModes checks that mosto-plain restarts the proxies without levers
// (FEP routes back to the kernel's initial window, no pools) and mosto-cold
// with them, that both fetch through the computed chain with exact bytes,
// and that the warm chain works again after them.
func TestColdModes(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("restarts the demo world's proxies: not in -short")
	}
	spec, err := scenario.DemoSpec()
	if err != nil {
		t.Fatal(err)
	}
	w := emutest.Start(t, spec)
	mosto, mostoEnv := clitest.Mosto(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	size := int64(20_000)
	sc, err := scenario.Start(ctx, w, scenario.Config{
		Sizes: []int64{size}, Mosto: mosto, Env: mostoEnv, Dir: t.TempDir(),
		Tune: scenario.Tune{InitCwnd: 40, HopPool: 1, FastOpen: true},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	want, ok := sc.ComputedChain(size)
	if !ok {
		t.Fatal("no computed chain")
	}
	route := func() string {
		t.Helper()
		out, err := w.Command(ctx, "London", "ip", "route", "show", emu.Prefix.String()).Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	for _, c := range []struct {
		mode     scenario.Mode
		initcwnd bool
	}{{scenario.ChainPlain, false}, {scenario.ChainCold, true}, {scenario.ChainPlain, false}, {scenario.Chain, true}} {
		smp, err := sc.Fetch(ctx, c.mode, size, 3)
		if err != nil {
			t.Fatalf("fetch %s: %v", c.mode, err)
		}
		if smp.Result.Total <= 0 {
			t.Errorf("%s: total %v", c.mode, smp.Result.Total)
		}
		if got := strings.Contains(route(), "initcwnd 40"); got != c.initcwnd {
			t.Errorf("after %s: London's route %q; want initcwnd 40: %v", c.mode, route(), c.initcwnd)
		}
		if c.mode == scenario.Chain {
			continue
		}
		// The proxies restarted before the fetch, so their counters hold
		// this flow alone.
		after, err := sc.Hops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := scenario.UsedChain(nil, after, sc.Roles().InP); !ok || !slices.Equal(got, want) {
			t.Errorf("%s: flow took %v (complete %v); want %v", c.mode, got, ok, want)
		}
	}
	if flows, pooled := sc.ColdPooled(scenario.ChainPlain); flows != 2 || pooled != 0 {
		t.Errorf("mosto-plain: %d flows, %d pooled hops; want 2 flows, none pooled", flows, pooled)
	}
	if flows, _ := sc.ColdPooled(scenario.ChainCold); flows != 1 {
		t.Errorf("mosto-cold: %d flows; want 1", flows)
	}
}
