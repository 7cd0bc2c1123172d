package scenario_test

import (
	"bytes"
	"context"
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

// TestMain lets the test binary act as the mosto binary (clitest).
func TestMain(m *testing.M) { clitest.Main(m) }

// TestDemoWorld brings up the demo world with a proxy per FEP, an origin and
// nginx, fetches through every mode (each body hash-checked by the client),
// and checks that the flows took the chain the table holds.
func TestDemoWorld(t *testing.T) {
	testenv.RequirePrivileged(t)
	nginx := testenv.RequireCommand(t, "nginx")
	spec, err := scenario.DemoSpec()
	if err != nil {
		t.Fatal(err)
	}
	w := emutest.Start(t, spec)
	mosto, mostoEnv := clitest.Mosto(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	sizes := []int64{20_000, 300_000}
	if _, err := scenario.Start(ctx, w, scenario.Config{Sizes: sizes, Mosto: mosto, CDN: true, CDNHost: "nowhere"}, nil); err == nil || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Errorf("Start with CDN host nowhere = %v; want an error naming it", err)
	}
	sc, err := scenario.Start(ctx, w, scenario.Config{
		Roles: scenario.Roles{Single: "Washington"},
		Sizes: sizes, Mosto: mosto, Env: mostoEnv,
		// nginx's idle timeout well above the 100 ms cdn-default idles
		// for: a loaded machine can hold the test away longer than that.
		CDN: true, CDNIdle: 1500 * time.Millisecond, CDNDefaultIdle: 100 * time.Millisecond, Nginx: nginx, Dir: t.TempDir(),
		Tune: scenario.Tune{InitCwnd: 40}, TuneCDN: true, OriginWmem: 8 << 20, Model: pathcomp.Model{ICW: 40, EndICW: 10, EndRTT: -1},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	r := sc.Roles()
	// Equal tuning: the FEPs and the CDN front-end's host (the client's),
	// not the origin.
	for _, h := range []string{"London", r.Client, r.Origin} {
		out, err := w.Command(ctx, h, "ip", "route", "show", emu.Prefix.String()).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.Contains(string(out), "initcwnd 40"), h != r.Origin; got != want {
			t.Errorf("route on %s: %q; want initcwnd 40: %v (FEPs and the CDN host)", h, out, want)
		}
	}
	// A tuned origin: its send buffer in every mode.
	if out, err := w.Command(ctx, r.Origin, "sysctl", "-n", "net.ipv4.tcp_wmem").Output(); err != nil || strings.Fields(string(out))[1] != "8388608" {
		t.Errorf("origin's tcp_wmem = %q, %v; want the default 8388608", out, err)
	}
	// The table follows the planner model: 20 KB is one round of 40 segments.
	if e, ok := sc.ComputedEntry(20_000); !ok || e.Rounds != 1 || e.EndRounds != 2 {
		t.Errorf("ComputedEntry(20KB) = %+v, %v; want 1 round with ICW 40, 2 end rounds with end ICW 10", e, ok)
	}
	if m, want := sc.PlanModel(), float64(w.RTT(r.Client, r.InP))/1e6; m.EndRTT < 0 || m.EndRTT-want > 1e-3 || want-m.EndRTT > 1e-3 {
		t.Errorf("PlanModel end RTT %v ms; want the client-InP RTT %v ms", m.EndRTT, want)
	}
	if r.InP != "Dublin" || r.EgP != "SanFrancisco" || r.Single != "Washington" {
		t.Errorf("roles = %+v; want InP Dublin, EgP SanFrancisco, single Washington", r)
	}
	for i, size := range sizes {
		want, ok := sc.ComputedChain(size)
		if !ok || len(want) < 3 || want[0] != "Dublin" || want[len(want)-1] != "SanFrancisco" {
			t.Fatalf("computed chain for %d = %v, %v; want Dublin > ... > SanFrancisco with a proxy between", size, want, ok)
		}
		before, err := sc.Hops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sc.Fetch(ctx, scenario.Chain, size, uint64(i)); err != nil {
			t.Fatalf("fetch through the chain: %v", err)
		}
		after, err := sc.Hops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := scenario.UsedChain(before, after, r.InP); !ok || !slices.Equal(got, want) {
			t.Errorf("size %d: flow took %v (complete %v); the table says %v", size, got, ok, want)
		}
		for _, m := range []scenario.Mode{scenario.Direct, scenario.Single} {
			if _, err := sc.Fetch(ctx, m, size, uint64(i)); err != nil {
				t.Errorf("fetch %s: %v", m, err)
			}
		}
		cold, err := sc.Fetch(ctx, scenario.CDNCold, size, 7)
		if err != nil {
			t.Fatalf("fetch cdn-cold: %v", err)
		}
		warm, err := sc.Fetch(ctx, scenario.CDNWarm, size, 8)
		if err != nil {
			t.Fatalf("fetch cdn-warm: %v", err)
		}
		def, err := sc.Fetch(ctx, scenario.CDNDefault, size, 9)
		if err != nil {
			t.Fatalf("fetch cdn-default: %v", err)
		}
		if !cold.NewOriginConn || warm.NewOriginConn || def.NewOriginConn {
			t.Errorf("cdn-cold opened an origin connection: %v (want true); cdn-warm: %v, cdn-default: %v (want false)", cold.NewOriginConn, warm.NewOriginConn, def.NewOriginConn)
		}
		// cdn-default sets the origin's slow start after idle for its fetch only.
		if out, err := w.Command(ctx, r.Origin, "sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle").Output(); err != nil || strings.TrimSpace(string(out)) != "0" {
			t.Errorf("origin's tcp_slow_start_after_idle after cdn-default = %q, %v; want the world's 0", out, err)
		}
	}
	// The machine's rate along the chain, given to the chain's model.
	mr, err := sc.MeasureMachineRate(ctx, 1)
	if err != nil || mr.Chain <= 0 || mr.Link <= 0 {
		t.Fatalf("MeasureMachineRate = %+v, %v; want both rates (the EgP is ~0 ms from the origin)", mr, err)
	}
	sc.SetMachineRate(mr)
	// The measuring loop and its report.
	res, err := sc.Measure(ctx, scenario.Plan{Modes: []scenario.Mode{scenario.Direct, scenario.Chain}, Sizes: sizes[:1], Runs: 2})
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := res.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if n := len(res.MS[scenario.Chain][sizes[0]]); n != 2 || res.Machine != mr || !strings.Contains(md.String(), "Dublin > ") || !strings.Contains(md.String(), "fetch model ms") || !strings.Contains(md.String(), "Machine limit") ||
		!strings.Contains(md.String(), "Fetch model vs measured, every mode") {
		t.Errorf("Measure: %d chain samples, report:\n%s", n, md.String())
	}
	// The fetch model: more than the chain's own model (it adds the
	// client's handshake and the request), at most a few RTTs.
	rtt, _ := sc.OriginRTT()
	if f, m := res.Fetch[sizes[0]], res.Model[sizes[0]]; !(f > m && f < 4*float64(rtt)/1e6) || f != res.Predicted[scenario.Chain][sizes[0]] {
		t.Errorf("fetch model %v ms (every mode's table: %v), chain model %v ms, client-origin RTT %v", f, res.Predicted[scenario.Chain][sizes[0]], m, rtt)
	}
	// A fresh direct connection: the handshake and the request's RTT at least.
	if d := res.Predicted[scenario.Direct][sizes[0]]; d < 2*float64(rtt)/1e6 {
		t.Errorf("direct fetch model %v ms < 2 x the client-origin RTT %v", d, rtt)
	}
}
