package scenario_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/cli/clitest"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/testenv"
)

// startWithController brings up spec with a real controller and a proxy per
// FEP following it, and waits for discovery to converge.
func startWithController(t *testing.T, ctx context.Context, spec *emu.Spec, roles scenario.Roles, sizes []int64) (*emu.World, *scenario.Scenario) {
	t.Helper()
	w := emutest.Start(t, spec)
	mosto, mostoEnv := clitest.Mosto(t)
	// MOSTO_SCENARIO_DIR keeps the generated files and the processes' logs
	// (a new directory under it per test) for a post-mortem.
	dir := t.TempDir()
	if keep := os.Getenv("MOSTO_SCENARIO_DIR"); keep != "" {
		var err error
		if dir, err = os.MkdirTemp(keep, t.Name()+"-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("scenario files and logs in %s", dir)
	}
	sc, err := scenario.Start(ctx, w, scenario.Config{
		Roles: roles, Sizes: sizes, Mosto: mosto, Env: mostoEnv, Dir: dir,
		Controller: &scenario.ControllerConfig{ProbeInterval: 2 * time.Second},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return w, sc
}

// controllerChain reads the chain from the controller's API: the table of
// the InP (its own LoP), for size.
func controllerChain(t *testing.T, ctx context.Context, sc *scenario.Scenario, size int64) ([]string, uint64) {
	t.Helper()
	r := sc.Roles()
	tab, err := sc.API().Table(ctx, r.InP, 0, 0)
	if err != nil || tab == nil {
		t.Fatalf("controller table of %s: %v, %v", r.InP, tab, err)
	}
	ix, err := pathcomp.NewIndex(&tab.Table)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := ix.Lookup(r.InP, r.EgP, size)
	if !ok {
		t.Fatalf("controller table v%d has no chain %s -> %s for %d B", tab.Version, r.InP, r.EgP, size)
	}
	return e.Path, tab.Version
}

// fetchChain fetches size bytes through the chain (the client checks every
// byte against the origin's seeded content) and returns the chain the
// proxies' metrics show the flow took.
func fetchChain(t *testing.T, ctx context.Context, sc *scenario.Scenario, size int64, seed uint64) []string {
	t.Helper()
	before, err := sc.Hops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Fetch(ctx, scenario.Chain, size, seed); err != nil {
		t.Fatalf("fetch %d B through the chain: %v", size, err)
	}
	after, err := sc.Hops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := scenario.UsedChain(before, after, sc.Roles().InP)
	if !ok {
		t.Fatalf("flow of %d B: chain not observed unambiguously (%v)", size, got)
	}
	return got
}

// TestDemoWorldController runs the demo world with a real controller: the
// proxies join over mutual TLS, measure each other and receive tables;
// transfers through the chain return the exact bytes, and the chain the
// proxies used is the one in the controller's table for the InP.
func TestDemoWorldController(t *testing.T) {
	testenv.RequirePrivileged(t)
	spec, err := scenario.DemoSpec()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	sizes := []int64{20_000, 300_000}
	start := time.Now()
	_, sc := startWithController(t, ctx, spec, scenario.Roles{Single: "Washington"}, sizes)
	cv := sc.Converged()
	t.Logf("world, controller and 8 proxies up, discovery converged in %v (after start: %v)", time.Since(start).Round(time.Millisecond), cv.Took.Round(time.Millisecond))
	if !sc.UsesController() || len(cv.Versions) != 8 {
		t.Fatalf("converged with %d tables (%v); want one per FEP", len(cv.Versions), cv.Versions)
	}
	for f, v := range cv.Versions {
		pv, err := sc.ProxyTableVersion(f)
		if err != nil || pv != v || v == 0 {
			t.Errorf("proxy %s holds table v%d (%v); controller v%d", f, pv, err, v)
		}
	}
	for i, size := range sizes {
		want, ver := controllerChain(t, ctx, sc, size)
		if len(want) < 2 || want[0] != "Dublin" || want[len(want)-1] != "SanFrancisco" {
			t.Fatalf("controller chain v%d for %d B = %v; want Dublin > ... > SanFrancisco", ver, size, want)
		}
		if c, _ := sc.ComputedChain(size); !slices.Equal(c, want) || sc.TableVersion() != ver {
			t.Errorf("scenario reports chain %v v%d; controller %v v%d", c, sc.TableVersion(), want, ver)
		}
		got := fetchChain(t, ctx, sc, size, uint64(i+1))
		if !slices.Equal(got, want) {
			t.Errorf("%d B: proxies used %v; controller table v%d says %v", size, got, ver, want)
		}
		t.Logf("%d B: chain %v (controller table v%d), bytes checked", size, got, ver)
	}
}

// TestStartRefusesTableAndController checks that a static table and a
// controller cannot be asked for together (before any world is touched).
func TestStartRefusesTableAndController(t *testing.T) {
	_, err := scenario.Start(context.Background(), nil, scenario.Config{
		Sizes: []int64{1000}, Mosto: []string{"mosto"},
		Table: &pathcomp.TableFile{}, Controller: &scenario.ControllerConfig{},
	}, nil)
	if err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Errorf("Start with a table and a controller = %v; want an error saying they are exclusive", err)
	}
}
