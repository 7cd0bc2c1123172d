package scenario_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/testenv"
)

// issue5Cities are the FEPs of the issue 5 world (WonderProxy locations).
var issue5Cities = []string{"Frankfurt", "London", "Paris", "Amsterdam", "NewYork", "Chicago", "Dallas", "SanJose", "Tokyo", "Singapore"}

// TestIssue5Figures measures issue 5's figures with the real controller and
// ten real proxies at WonderProxy cities in the emulator:
//  1. the matrix the agents measured (read from the controller's API) vs the
//     emulated RTTs;
//  2. five times, at a random phase of the probe rounds, the delay of the
//     first link of the InP's chain triples or is restored
//     (World.SetLink): the time until the controller has a new table and
//     until every proxy holds its LoP's current version (median and max);
//  3. with the controller killed, flows keep being relayed on the cached
//     tables (no failed flow), also after a proxy restarted meanwhile;
//  4. (run before 3) the EgP of a destination is chosen by the RTTs the
//     FEPs measured to it, not by its (wrong) coordinates.
//
// Run with -v to see the figures (docs/demo.md records them).
func TestIssue5Figures(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("about 40 s of emulated network; skipped with -short")
	}
	spec := &emu.Spec{Name: "issue5", Dataset: "wonderproxy", TCP: emu.TCP{SlowStartAfterIdle: new(0)}}
	spec.Hosts = append(spec.Hosts, emu.HostSpec{Name: "client", Location: "London"}, emu.HostSpec{Name: "origin", Location: "SanJose"})
	for _, c := range issue5Cities {
		spec.Hosts = append(spec.Hosts, emu.HostSpec{Name: c, Location: c})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const interval = 2 * time.Second
	sizes := []int64{30_000, 200_000}
	start := time.Now()
	w, sc := startWithController(t, ctx, spec, scenario.Roles{}, sizes)
	cv := sc.Converged()
	r := sc.Roles()
	t.Logf("10 FEPs + controller up; discovery converged %v after the proxies started (%v in all); InP %s, EgP %s, probe interval %v",
		cv.Took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), r.InP, r.EgP, interval)

	// 1. Measured vs emulated matrix. Every directed pair must be measured
	// and within the target, 5% (at least 1 ms: the emulator's own jitter
	// on short links). A pair outside it is read again from the live matrix
	// in a retry round, up to 3 probe intervals: under -race on a loaded
	// machine a proxy may answer a probe late, and the robust estimator
	// drops such a sample within a round or two. A pair still off after the
	// retries fails the test; the figures are those of the first read.
	type pair struct{ a, b string }
	offTarget := func(m api.Matrix) map[pair]string {
		off := map[pair]string{}
		for i, a := range m.Names {
			for j, b := range m.Names {
				if i == j {
					continue
				}
				want := float64(w.RTT(a, b)) / 1e6
				switch {
				case m.RTTMS[i][j] == nil:
					off[pair{a, b}] = "not measured"
				case math.Abs(*m.RTTMS[i][j]-want) > max(0.05*want, 1):
					off[pair{a, b}] = fmt.Sprintf("measured %.2f ms, emulated %.2f ms", *m.RTTMS[i][j], want)
				}
			}
		}
		return off
	}
	m := cv.Matrix
	var n, within5, within1ms int
	worstRel, worstAbs := 0.0, 0.0
	worst := ""
	for i, a := range m.Names {
		for j, b := range m.Names {
			if i == j || m.RTTMS[i][j] == nil {
				continue
			}
			got, want := *m.RTTMS[i][j], float64(w.RTT(a, b))/1e6
			d := math.Abs(got - want)
			n++
			if d <= 0.05*want {
				within5++
			}
			if d <= max(0.05*want, 1) {
				within1ms++
			}
			if rel := d / want; rel > worstRel {
				worstRel, worst = rel, fmt.Sprintf("%s->%s %.2f vs %.2f ms", a, b, got, want)
			}
			worstAbs = max(worstAbs, d)
		}
	}
	t.Logf("matrix: %d of %d directed pairs measured; %d within 5%%, %d within max(5%%, 1 ms); worst relative error %.1f%% (%s); worst absolute %.2f ms",
		n, len(m.Names)*(len(m.Names)-1), within5, within1ms, 100*worstRel, worst, worstAbs)
	if len(m.Names) != len(issue5Cities) {
		t.Errorf("matrix of %d FEPs; want %d", len(m.Names), len(issue5Cities))
	}
	off := offTarget(m)
	for round := 1; len(off) > 0 && round <= 3; round++ {
		t.Logf("retry round %d: %d pairs off target, e.g. %v", round, len(off), firstOf(off))
		time.Sleep(interval) // the next probe round
		live, err := sc.API().Matrix(ctx)
		if err != nil {
			t.Fatal(err)
		}
		still := offTarget(live)
		for p := range off {
			if _, bad := still[p]; !bad {
				delete(off, p)
			} else {
				off[p] = still[p]
			}
		}
	}
	for p, why := range off {
		t.Errorf("%s -> %s: %s (outside max(5%%, 1 ms) after 3 retry rounds)", p.a, p.b, why)
	}

	// 2. A delay change reaches every LoP: the first link of the chain
	// triples, is restored, triples... (ending tripled), each change at a
	// random phase of the probe rounds, timed from the moment it is set.
	big := sizes[len(sizes)-1]
	chain, _ := controllerChain(t, ctx, sc, big)
	a, b := chain[0], chain[1]
	base, err := w.Link(a, b)
	if err != nil {
		t.Fatal(err)
	}
	old := w.RTT(a, b)
	const changes = 5
	var alls []time.Duration
	for k := range changes {
		// The previous change must have reached the controller from both
		// ends first. The controller plans with the mean of the two ends;
		// a change set while one end still holds the old value never makes
		// that end report (its estimate never leaves the value the link
		// returns to), so the mean goes from half-way to the new value, and
		// the InP's table at half-way can be the one at the new value:
		// London's table with London-New York at 142 ms (71 and 213) is the
		// one at 213 ms, byte for byte (no chain of it takes the link once
		// it is slower than the detour through Paris). The table this loop
		// waits for then never comes (the load flake "no new table at
		// every LoP 30 s", matrix seen, table 0s).
		if took := settled(t, ctx, w, sc, a, b); took > 0 {
			t.Logf("before change %d: both ends of %s-%s in the controller's matrix after %v more", k+1, a, b, took.Round(time.Millisecond))
		}
		_, v0 := controllerChain(t, ctx, sc, big)
		time.Sleep(time.Duration(rand.Int64N(int64(interval))))
		l := base
		if k%2 == 0 {
			l.DelayMS *= 3
		}
		prev := w.RTT(a, b)
		tMatrix, tTable, tAll, v1 := propagation(t, ctx, w, sc, a, b, l, prev, v0)
		alls = append(alls, tAll)
		t.Logf("change %d %s-%s: RTT %.1f -> %.1f ms; in the controller's matrix after %v, new table v%d for %s after %v, every proxy holds its LoP's current table after %v (probe interval %v)",
			k+1, a, b, float64(prev)/1e6, float64(w.RTT(a, b))/1e6, tMatrix.Round(time.Millisecond), v1, r.InP, tTable.Round(time.Millisecond), tAll.Round(time.Millisecond), interval)
		if k == 0 {
			newChain, v2 := controllerChain(t, ctx, sc, big)
			t.Logf("chain %v -> %v (v%d)", chain, newChain, v2)
			if len(newChain) > 1 && newChain[0] == a && newChain[1] == b {
				t.Errorf("new chain %v still starts with the slowed link %s-%s", newChain, a, b)
			}
		}
	}
	if err := sc.ReloadTable(ctx); err != nil {
		t.Fatal(err)
	}
	slices.Sort(alls)
	med, slowest := alls[len(alls)/2], alls[len(alls)-1]
	t.Logf("delay change -> new table at every LoP, %d changes of %s-%s (%.1f <-> %.1f ms): median %v, max %v; probe interval %v",
		changes, a, b, float64(old)/1e6, float64(w.RTT(a, b))/1e6, med.Round(time.Millisecond), slowest.Round(time.Millisecond), interval)
	// The target (one probe interval + two RTTs + computation) holds for
	// the median: on a loaded machine under -race a change now and then
	// waits for a slow store write and ten slow proxies (a run at load 45:
	// median 2.7 s, two changes 8.1 and 8.4 s). One change far past it
	// (a missed notification waits for the next period, 1 h) fails too.
	if limit := interval + 3*time.Second; med > limit || slowest > 4*limit {
		t.Errorf("new tables reached every LoP after %v (median), %v (max); want a median within one probe interval + two RTTs + computation (fails above %v) and none above %v", med, slowest, limit, 4*limit)
	}

	// 4. EgP by measured RTT: the origin registered as a destination with
	// Chicago's coordinates (deliberately wrong: it is in San Jose) and
	// its HTTP port as probe address. By distance its EgP would be
	// Chicago; the FEPs near those coordinates time TCP handshakes to it
	// and the EgP becomes the FEP with the lowest measured RTT.
	oaddr := netip.AddrPortFrom(w.Addr(r.Origin), 80)
	dest := api.Destination{ID: "origin", Prefix: netip.PrefixFrom(oaddr.Addr(), 32).String(), Lat: 41.88, Lon: -87.63, ProbeAddr: oaddr.String()}
	registered := time.Now()
	if err := sc.API().RegisterDestination(ctx, dest); err != nil {
		t.Fatal(err)
	}
	var st api.DestinationStatus
	var tMeasured time.Duration
	for {
		ds, err := sc.API().Destinations(ctx)
		if err != nil || len(ds) != 1 {
			t.Fatalf("destinations %v, %v", ds, err)
		}
		st = ds[0]
		// Every FEP asked (the 8 nearest to the coordinates) reported.
		if st.By == "rtt" && len(st.RTTMS) >= 8 {
			if tMeasured == 0 {
				tMeasured = time.Since(registered)
				t.Logf("first measurements of the destination after %v: %v, EgP %s", tMeasured.Round(time.Millisecond), st.RTTMS, st.EgP)
			}
			// A first report may rest on one handshake, which a loaded
			// machine can delay by hundreds of ms (CI: SanJose's 10 ms
			// measured 556 ms, EgP Dallas); the estimator's next samples
			// correct it within a few probe rounds.
			if st.EgP == "SanJose" {
				break
			}
		}
		if time.Since(registered) > 20*time.Second {
			break // checked below
		}
		time.Sleep(50 * time.Millisecond)
	}
	if tMeasured == 0 {
		t.Fatalf("destination not measured 20 s after its registration: %+v", st)
	}
	var egInP string
	for egInP != st.EgP && time.Since(registered) < 20*time.Second {
		if tab, err := sc.API().Table(ctx, r.InP, 0, 0); err == nil && tab != nil {
			for _, e := range tab.Egress {
				if e.Prefix == dest.Prefix {
					egInP = e.FEP
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("destination %s at %s registered with Chicago's coordinates: measured by %d FEPs after %v (%v), EgP %s by %s; the InP's table says %s after %v",
		dest.ID, oaddr, len(st.RTTMS), tMeasured.Round(time.Millisecond), st.RTTMS, st.EgP, st.By, egInP, time.Since(registered).Round(time.Millisecond))
	if st.EgP != "SanJose" || egInP != st.EgP {
		t.Errorf("EgP of the origin %s, in the InP's table %s; want SanJose (the FEP next to it: lowest measured RTT)", st.EgP, egInP)
	}

	// 3. Controller down: flows keep going on the cached tables.
	if err := sc.KillController(); err != nil {
		t.Fatal(err)
	}
	failed, flows := 0, 0
	run := func(phase string, k int) {
		t.Helper()
		// The chains the InP's proxy has cached (its persisted table).
		cached, err := sc.ProxyTable(r.InP)
		if err != nil || cached == nil {
			t.Fatalf("cached table of %s: %v, %v", r.InP, cached, err)
		}
		ix, err := pathcomp.NewIndex(&cached.Table)
		if err != nil {
			t.Fatal(err)
		}
		for i := range k {
			size := sizes[i%len(sizes)]
			e, ok := ix.Lookup(r.InP, r.EgP, size)
			if !ok {
				t.Fatalf("cached table v%d of %s has no chain for %d B", cached.Version, r.InP, size)
			}
			want := e.Path
			if size == big && len(want) > 1 && want[1] == b {
				t.Errorf("cached table v%d still starts with the slowed link: %v", cached.Version, want)
			}
			before, err := sc.Hops(ctx)
			if err != nil {
				t.Fatal(err)
			}
			flows++
			if _, err := sc.Fetch(ctx, scenario.Chain, size, uint64(100+flows)); err != nil {
				failed++
				t.Errorf("%s: flow %d failed: %v", phase, i, err)
				continue
			}
			after, err := sc.Hops(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got, ok := scenario.UsedChain(before, after, r.InP); !ok || !slices.Equal(got, want) {
				t.Errorf("%s: flow %d took %v (complete %v); the cached table says %v", phase, i, got, ok, want)
			}
		}
	}
	run("controller down", 6)
	// Restart the InP and a transit proxy of the chain while the controller is down.
	restart := []string{r.InP}
	if c, _ := sc.ComputedChain(big); len(c) > 2 {
		restart = append(restart, c[1])
	}
	for _, f := range restart {
		if err := sc.RestartProxy(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	run("controller down, "+fmt.Sprint(restart)+" restarted", 6)
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
	t.Logf("controller killed: %d flows through the chain, %d failed; proxies %v restarted meanwhile and routed on their persisted tables", flows, failed, restart)
}

// propagation sets the link a-b to l (its RTT was prev) and returns when the
// controller's matrix shows the new RTT, when the InP has a table computed
// from it (a version past since), and when every proxy holds its LoP's
// current table, all timed from the moment the delay was set, and the InP's
// new version.
//
// A table counts only if the controller computed it after the last matrix
// read that did not show the change yet: under load the RTTs of other pairs
// jitter past the threshold and the controller writes new versions for them,
// and such a version, taken for "the new table", made the test look for a
// chain the controller had not computed yet (CI flake: "new chain ... still
// starts with the slowed link", the matrix change never seen).
func propagation(t *testing.T, ctx context.Context, w *emu.World, sc *scenario.Scenario, a, b string, l emu.Link, prev time.Duration, since uint64) (tMatrix, tTable, tAll time.Duration, v1 uint64) {
	t.Helper()
	r := sc.Roles()
	// A direction counts once its value moved towards the new RTT (the
	// other direction of the previous change may still be in flight).
	before := map[[2]int]float64{}
	if mx, err := sc.API().Matrix(ctx); err == nil {
		i, j := slices.Index(mx.Names, a), slices.Index(mx.Names, b)
		for _, p := range [][2]int{{i, j}, {j, i}} {
			if v := mx.RTTMS[p[0]][p[1]]; v != nil {
				before[p] = *v
			}
		}
	}
	changed := time.Now()
	if err := w.SetLink(a, b, l); err != nil {
		t.Fatal(err)
	}
	next := float64(w.RTT(a, b)) / 1e6
	prevMS := float64(prev) / 1e6
	// notYet is when the latest matrix read that did not show the change
	// started: a table computed before it cannot hold the change.
	notYet := changed
	seen := map[uint64]time.Duration{} // InP versions past since: when first read
	last := map[[2]int]float64{}       // the latest matrix values of both directions
	for tAll == 0 {
		if time.Since(changed) > 30*time.Second {
			cur := uint64(0)
			if tab, err := sc.API().Table(ctx, r.InP, 0, 0); err == nil && tab != nil {
				cur = tab.Version
			}
			t.Fatalf("no new table at every LoP 30 s after %s-%s changed %.1f -> %.1f ms (matrix %v, table %v); both directions in the controller's matrix: before %v, last read %v; %s's table v%d (since v%d), versions seen %v",
				a, b, prevMS, next, tMatrix, tTable, before, last, r.InP, cur, since, seen)
		}
		if tMatrix == 0 {
			read := time.Now()
			if mx, err := sc.API().Matrix(ctx); err == nil {
				i, j := slices.Index(mx.Names, a), slices.Index(mx.Names, b)
				for _, p := range [][2]int{{i, j}, {j, i}} {
					if v := mx.RTTMS[p[0]][p[1]]; v != nil {
						last[p] = *v
					}
					if v := mx.RTTMS[p[0]][p[1]]; v != nil && *v != before[p] && math.Abs(*v-next) < math.Abs(*v-prevMS) {
						tMatrix = time.Since(changed)
					}
				}
			}
			if tMatrix == 0 {
				notYet = read
			}
		}
		if tTable == 0 {
			if tab, err := sc.API().Table(ctx, r.InP, since, 0); err == nil && tab != nil {
				if _, ok := seen[tab.Version]; !ok {
					seen[tab.Version] = time.Since(changed)
				}
				if tMatrix > 0 && !tab.Computed.Before(notYet) {
					tTable, v1 = seen[tab.Version], tab.Version
				}
			}
		}
		if tTable > 0 {
			// The time is the latest install among the proxies (their
			// table files' times), not the end of this loop: on a loaded
			// machine ten API reads take seconds, and the figure (and
			// its bound) measured them (a loaded CI run: by the proxies'
			// logs every one had its table within 3.7 s of the change,
			// the loop saw it at 9.1 s).
			all := true
			var last time.Time
			for _, f := range r.FEPs {
				tab, err := sc.API().Table(ctx, f, 0, 0)
				if err != nil || tab == nil {
					t.Fatalf("table of %s: %v", f, err)
				}
				pv, at, err := sc.ProxyTableInstalled(f)
				if err != nil || pv != tab.Version {
					all = false
					break
				}
				if at.After(last) {
					last = at
				}
			}
			if all {
				tAll = max(last.Sub(changed), tTable)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return tMatrix, tTable, tAll, v1
}

// settled waits until the controller's matrix holds the emulated RTT of
// a-b from both ends (within 25%: the changes triple or restore it, so this
// tells which value an end reported; the matrix's precision is part 1's
// check), and returns how long that took (0: at once). It fails t after
// 30 s: by then each end has probed for many rounds.
func settled(t *testing.T, ctx context.Context, w *emu.World, sc *scenario.Scenario, a, b string) time.Duration {
	t.Helper()
	want := float64(w.RTT(a, b)) / 1e6
	start, first := time.Now(), true
	var got [2]*float64
	for {
		mx, err := sc.API().Matrix(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i, j := slices.Index(mx.Names, a), slices.Index(mx.Names, b)
		if i < 0 || j < 0 {
			t.Fatalf("%s or %s not in the controller's matrix %v", a, b, mx.Names)
		}
		got = [2]*float64{mx.RTTMS[i][j], mx.RTTMS[j][i]}
		ok := true
		for _, v := range got {
			ok = ok && v != nil && math.Abs(*v-want) <= 0.25*want
		}
		if ok {
			if first {
				return 0
			}
			return time.Since(start)
		}
		first = false
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%s-%s in the controller's matrix: %v, %v ms 30 s after waiting began; emulated %.1f ms", a, b, deref(got[0]), deref(got[1]), want)
		}
		time.Sleep(50 * time.Millisecond) // the next matrix read
	}
}

// deref is *v, or NaN for nil (not measured).
func deref(v *float64) float64 {
	if v == nil {
		return math.NaN()
	}
	return *v
}

// firstOf returns one entry of m, for a log line.
func firstOf[K comparable](m map[K]string) string {
	for k, v := range m {
		return fmt.Sprintf("%v: %s", k, v)
	}
	return ""
}
