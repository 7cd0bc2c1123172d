package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/store"
	"github.com/mosto-net/mosto/internal/store/boltstore"
	"github.com/mosto-net/mosto/internal/testenv"
)

func openBolt(t testing.TB) store.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "mosto.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func fepAt(id string, lat, lon float64) api.FEP {
	return api.FEP{ID: id, HopAddr: id + ".example:7000", ProbeAddr: id + ".example:7001", Lat: lat, Lon: lon}
}

// line is a, b, c close together (measured), d far away (never measured).
var line = []api.FEP{fepAt("a", 50, 8), fepAt("b", 50, 9), fepAt("c", 50, 10), fepAt("d", -33, 151)}

func sample(from, to string, ms float64) store.RTT {
	return store.RTT{From: from, To: to, MS: ms, At: time.Now().UTC()}
}

func setup(t testing.TB, st store.Store, feps []api.FEP, rtts []store.RTT) {
	t.Helper()
	ctx := testCtx(t)
	for _, f := range feps {
		if err := st.PutFEP(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutRTTs(ctx, rtts); err != nil {
		t.Fatal(err)
	}
}

// decodeTable reads the stored table of lop strictly into an api.Table.
// computed is a controller on st, which setup filled with feps and rtts,
// after one forced Compute.
func computed(t testing.TB, st store.Store, feps []api.FEP, rtts []store.RTT) *Controller {
	t.Helper()
	setup(t, st, feps, rtts)
	c, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(testCtx(t), true); err != nil {
		t.Fatal(err)
	}
	return c
}

func decodeTable(t testing.TB, c *Controller, lop string) *api.Table {
	t.Helper()
	et, err := c.WaitTable(testCtx(t), lop, 0, "")
	if err != nil {
		t.Fatalf("WaitTable(%s): %v", lop, err)
	}
	tab, err := api.DecodeJSON[api.Table](bytes.NewReader(et.JSON()))
	if err != nil {
		t.Fatalf("table %s: %v", lop, err)
	}
	if tab.Version != et.Version || tab.LoP != lop {
		t.Fatalf("table %s: version %d lop %s; want %d %s", lop, tab.Version, tab.LoP, et.Version, lop)
	}
	if _, err := pathcomp.NewIndex(&tab.Table); err != nil {
		t.Fatalf("table %s does not index: %v", lop, err)
	}
	return &tab
}

func pathOf(tab *api.Table, from, to string, size int64) []string {
	ix, err := pathcomp.NewIndex(&tab.Table)
	if err != nil {
		return nil
	}
	e, ok := ix.Lookup(from, to, size)
	if !ok {
		return nil
	}
	return e.Path
}

func TestComputeTables(t *testing.T) {
	st := openBolt(t)
	c := computed(t, st, line, []store.RTT{sample("a", "b", 10), sample("b", "a", 10), sample("b", "c", 10), sample("a", "c", 50)})
	ctx := testCtx(t)
	v1 := c.Version()
	if v1 == 0 {
		t.Fatal("no version after Compute")
	}
	ta := decodeTable(t, c, "a")
	for _, e := range ta.Table.Chains {
		if e.From != "a" {
			t.Errorf("table of LoP a has a chain from %s; each LoP gets only its InPs' pairs", e.From)
		}
	}
	tests := []struct {
		to   string
		size int64
		want []string
	}{
		{"b", 14_000, []string{"a", "b"}},
		{"c", 14_000, []string{"a", "b", "c"}}, // 2 hops of 10 ms beat 50 ms direct
		{"c", 15_000_000, []string{"a", "b", "c"}},
		{"d", 1_000_000, []string{"a", "d"}}, // never measured: direct, estimated
	}
	for _, tc := range tests {
		if got := pathOf(ta, "a", tc.to, tc.size); !slices.Equal(got, tc.want) {
			t.Errorf("a -> %s (%d B) = %v; want %v", tc.to, tc.size, got, tc.want)
		}
	}
	if k := ta.Keys.Current; k == nil || len(k.Recv) != 64 || len(k.Probe) != 64 || len(k.Send) != len(ta.Members)-1 || k.Send["a"] != "" {
		t.Errorf("current key %+v; want a's receive key, probe key and a send key to every other member (%d)", k, len(ta.Members)-1)
	}
	if ta.Members["b"] != "b.example:7000" || ta.Members["d"] != "d.example:7000" {
		t.Errorf("members = %v; want hop addresses of b and d", ta.Members)
	}

	// Nothing changed: a forced recomputation writes no new version.
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	if v := c.Version(); v != v1 {
		t.Errorf("version after an identical computation = %d; want %d", v, v1)
	}
	// An insignificant change does not recompute when not forced.
	if err := st.PutRTTs(ctx, []store.RTT{sample("a", "b", 10.5)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(ctx, false); err != nil {
		t.Fatal(err)
	}
	if v := c.Version(); v != v1 {
		t.Errorf("version after an insignificant change = %d; want %d", v, v1)
	}
	// A significant change: a-c becomes 5 ms, direct wins.
	if err := st.PutRTTs(ctx, []store.RTT{sample("a", "c", 5), sample("c", "a", 5)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(ctx, false); err != nil {
		t.Fatal(err)
	}
	v2 := c.Version()
	if v2 <= v1 {
		t.Fatalf("version after a significant change = %d; want > %d", v2, v1)
	}
	ta = decodeTable(t, c, "a")
	if got := pathOf(ta, "a", "c", 1_000_000); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("after a-c = 5 ms: a -> c = %v; want [a c]", got)
	}
}

func TestLoPAssignment(t *testing.T) {
	st := openBolt(t)
	setup(t, st, line, []store.RTT{sample("a", "b", 10), sample("b", "c", 10), sample("a", "c", 50)})
	c, err := New(Config{Store: st, Topology: Topology{LoPs: []string{"b", "d"}, InP: map[string]string{"c": "d"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(testCtx(t), true); err != nil {
		t.Fatal(err)
	}
	from := func(tab *api.Table) []string {
		var out []string
		for _, e := range tab.Table.Chains {
			if !slices.Contains(out, e.From) {
				out = append(out, e.From)
			}
		}
		slices.Sort(out)
		return out
	}
	// a is closest to b (measured 10 ms); c is mapped to d explicitly.
	want := map[string][]string{"a": nil, "b": {"a", "b"}, "c": nil, "d": {"c", "d"}}
	for lop, w := range want {
		tab := decodeTable(t, c, lop)
		if got := from(tab); !slices.Equal(got, w) {
			t.Errorf("LoP %s serves InPs %v; want %v", lop, got, w)
		}
		if tab.Keys.Current == nil {
			t.Errorf("LoP %s: table has no hop key", lop)
		}
	}
}

func TestEgress(t *testing.T) {
	st := openBolt(t)
	setup(t, st, line, nil)
	c, err := New(Config{Store: st, Topology: Topology{Egress: []Destination{{Prefix: "198.51.100.0/24", Lat: -34, Lon: 150}, {Prefix: "2001:db8::/32", Lat: 51, Lon: 10.5}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(testCtx(t), true); err != nil {
		t.Fatal(err)
	}
	tab := decodeTable(t, c, "a")
	want := []api.Egress{{Prefix: "198.51.100.0/24", FEP: "d"}, {Prefix: "2001:db8::/32", FEP: "c"}}
	if !slices.Equal(tab.Egress, want) {
		t.Errorf("egress = %v; want %v", tab.Egress, want)
	}
}

func TestBuildMatrixAndSignificant(t *testing.T) {
	feps := line[:3]
	m := BuildMatrix(feps, []store.RTT{sample("a", "b", 10), sample("b", "a", 12), sample("b", "c", 7), sample("x", "a", 1)})
	want := [][]float64{{0, 11, math.Inf(1)}, {11, 0, 7}, {math.Inf(1), 7, 0}}
	for i := range want {
		if !slices.Equal(m.RTT[i], want[i]) {
			t.Errorf("row %d = %v; want %v", i, m.RTT[i], want[i])
		}
	}
	tests := []struct {
		name string
		rtts []store.RTT
		feps []api.FEP
		want bool
	}{
		{"same", []store.RTT{sample("a", "b", 11), sample("b", "c", 7)}, feps, false},
		{"small change", []store.RTT{sample("a", "b", 12.5), sample("b", "c", 7)}, feps, false},
		{"relative but under 2ms", []store.RTT{sample("a", "b", 11), sample("b", "c", 8.5)}, feps, false},
		{"big change", []store.RTT{sample("a", "b", 14), sample("b", "c", 7)}, feps, true},
		{"new pair", []store.RTT{sample("a", "b", 11), sample("b", "c", 7), sample("a", "c", 30)}, feps, true},
		{"lost pair", []store.RTT{sample("a", "b", 11)}, feps, true},
		{"fep joined", []store.RTT{sample("a", "b", 11), sample("b", "c", 7)}, line, true},
	}
	for _, tc := range tests {
		if got := Significant(m, BuildMatrix(tc.feps, tc.rtts), 0.10, 2); got != tc.want {
			t.Errorf("%s: Significant = %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestDistanceAndClosest(t *testing.T) {
	if d := DistanceKm(50.11, 8.68, 40.71, -74.01); math.Abs(d-6200) > 50 {
		t.Errorf("Frankfurt-New York = %.0f km; want about 6200", d)
	}
	if d := DistanceKm(1, 2, 1, 2); d != 0 {
		t.Errorf("distance to itself = %v", d)
	}
	cands := []api.FEP{fepAt("fra", 50.11, 8.68), fepAt("nyc", 40.71, -74.01), fepAt("sin", 1.35, 103.8)}
	if k := Closest(48.85, 2.35, cands, nil); cands[k].ID != "fra" {
		t.Errorf("closest to Paris = %s; want fra", cands[k].ID)
	}
	// A measurement beats geography.
	meas := func(i int) (float64, bool) { return 1, cands[i].ID == "sin" }
	if k := Closest(48.85, 2.35, cands, meas); cands[k].ID != "sin" {
		t.Errorf("closest to Paris with sin measured at 1 ms = %s; want sin", cands[k].ID)
	}
	if k := Closest(0, 0, nil, nil); k != -1 {
		t.Errorf("Closest of none = %d; want -1", k)
	}
}

func TestChooseTargets(t *testing.T) {
	var feps []api.FEP
	for i := 0; i < 40; i++ {
		feps = append(feps, fepAt(string(rune('A'+i/26))+string(rune('a'+i%26)), float64(i%8)*10-40, float64(i/8)*30-60))
	}
	slices.SortFunc(feps, func(a, b api.FEP) int { return strings.Compare(a.ID, b.ID) })
	p := TargetPolicy{Near: 4, Far: 2}
	ts := ChooseTargets(feps, p)
	has := func(i int, id string) bool {
		return slices.ContainsFunc(ts[i], func(t api.Target) bool { return t.ID == id })
	}
	far := 0
	for i, f := range feps {
		if len(ts[i]) < 6 {
			t.Errorf("%s has %d targets; want >= near+far = 6", f.ID, len(ts[i]))
		}
		if len(ts[i]) >= len(feps)-1 {
			t.Errorf("%s measures every peer; want a subset", f.ID)
		}
		for _, tg := range ts[i] {
			if tg.ID == f.ID {
				t.Errorf("%s measures itself", f.ID)
			}
			j, _ := slices.BinarySearchFunc(feps, tg.ID, cmpFEP)
			if !has(j, f.ID) {
				t.Errorf("%s measures %s but not the reverse", f.ID, tg.ID)
			}
			if tg.ProbeAddr != tg.ID+".example:7001" {
				t.Errorf("target %s probe addr %q", tg.ID, tg.ProbeAddr)
			}
			if tg.Reason == "far" {
				far++
			}
		}
	}
	if far == 0 {
		t.Error("no far targets chosen")
	}
	// Stable: the same input gives the same choice.
	if again := ChooseTargets(feps, p); !slices.EqualFunc(again, ts, slices.Equal) {
		t.Error("ChooseTargets is not deterministic")
	}
}

func TestParseTopology(t *testing.T) {
	good := "lops: [fra, nyc]\ninp:\n  edge1: fra\negress:\n  - prefix: 198.51.100.0/24\n    lat: 40.7\n    lon: -74\n"
	top, err := ParseTopology(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(top.LoPs, []string{"fra", "nyc"}) || top.InP["edge1"] != "fra" || len(top.Egress) != 1 {
		t.Errorf("ParseTopology = %+v", top)
	}
	bad := []struct{ in, want string }{
		{"lops: [fra, fra]", "twice"},
		{"inp: {edge1: ams}\nlops: [fra]", "not in lops"},
		{"egress: [{prefix: 1.2.3.4, lat: 0, lon: 0}]", "egress"},
		{"egress: [{prefix: 10.0.0.0/8, lat: 100, lon: 0}]", "coordinates"},
		{"egress: [{prefix: 10.0.0.0/8, lat: 0, lon: 0, probe_addr: \"10.0.0.1:80\"}]", "needs an id"},
		{"egress: [{id: x, prefix: 10.0.0.0/8, lat: 0, lon: 0}, {id: x, prefix: 10.1.0.0/16, lat: 0, lon: 0}]", "twice"},
		{"egress: [{id: x, prefix: 10.0.0.0/8, lat: 0, lon: 0, probe_addr: nowhere}]", "probe_addr"},
		{"egress: [{id: \"-x\", prefix: 10.0.0.0/8, lat: 0, lon: 0}]", "id"},
		{"bogus: 1", "not found"},
		{"lops: [\"a b\"]", "lops"},
	}
	for _, tc := range bad {
		if _, err := ParseTopology(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseTopology(%q) = %v; want an error mentioning %q", tc.in, err, tc.want)
		}
	}
	if top, err := ParseTopology(strings.NewReader("")); err != nil || len(top.LoPs) != 0 {
		t.Errorf("empty topology = %+v, %v; want zero, nil", top, err)
	}
}

func FuzzParseTopology(f *testing.F) {
	f.Add("lops: [fra, nyc]\ninp:\n  edge1: fra\n")
	f.Add("egress: [{prefix: 10.0.0.0/8, lat: 1, lon: 2}]")
	f.Add("{}")
	f.Fuzz(func(t *testing.T, s string) {
		top, err := ParseTopology(strings.NewReader(s))
		if err == nil {
			if err := top.Validate(); err != nil {
				t.Fatalf("accepted topology fails Validate: %v", err)
			}
		}
	})
}

// serve runs c behind an HTTP test server and returns a client for it.
func serve(t *testing.T, c *Controller) *api.Client {
	t.Helper()
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: c}))
	t.Cleanup(srv.Close)
	return &api.Client{BaseURL: srv.URL}
}

func run(t *testing.T, c *Controller) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func TestWatchSemantics(t *testing.T) {
	testenv.CheckLeaks(t)
	st := openBolt(t)
	c, err := New(Config{Store: st, Debounce: 20 * time.Millisecond, DrainTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	cl := serve(t, c)
	ctx := testCtx(t)
	for _, f := range line[:3] {
		if err := cl.RegisterFEP(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	report := func(from, to string, ms float64) {
		t.Helper()
		if _, err := cl.Report(ctx, api.Report{FEP: from, Samples: []api.Sample{{Peer: to, RTTMS: ms}}}); err != nil {
			t.Fatal(err)
		}
	}
	report("a", "b", 10)
	report("b", "c", 10)
	report("a", "c", 50)

	// Waiting for a table that will come.
	t1, err := cl.Table(ctx, "a", 0, 10*time.Second)
	if err != nil || t1 == nil {
		t.Fatalf("first table: %v, %v", t1, err)
	}
	// Wait until the computation has settled on the three reports.
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(pathOf(t1, "a", "c", 14_000), []string{"a", "b", "c"}) && time.Now().Before(deadline) {
		next, err := cl.Table(ctx, "a", t1.Version, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if next != nil {
			t1 = next
		}
	}
	if got := pathOf(t1, "a", "c", 14_000); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("a -> c = %v; want [a b c]", got)
	}

	// A long-poll from the current version blocks until a change...
	if t0, err := cl.Table(ctx, "a", t1.Version, 100*time.Millisecond); err != nil || t0 != nil {
		t.Fatalf("poll with nothing new = %v, %v; want 304", t0, err)
	}
	got := make(chan *api.Table, 1)
	go func() {
		tab, err := cl.Table(ctx, "a", t1.Version, 20*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- tab
	}()
	// The poll is blocked in the controller before the change comes.
	testenv.WaitFor(t, 10*time.Second, "the long-poll blocked", func() bool { return c.cache.waiters() == 1 })
	report("a", "c", 5) // significant: direct becomes best
	var t2 *api.Table
	select {
	case t2 = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("long-poll did not return after a significant change")
	}
	if t2 == nil || t2.Version <= t1.Version {
		t.Fatalf("long-poll returned %+v; want a version > %d", t2, t1.Version)
	}
	if p := pathOf(t2, "a", "c", 14_000); !slices.Equal(p, []string{"a", "c"}) {
		t.Errorf("after a-c = 5 ms: a -> c = %v; want [a c]", p)
	}

	// A slow watcher still at t1 gets the newest version, not t2.
	report("a", "c", 80) // back to the chain
	deadline = time.Now().Add(10 * time.Second)
	for c.Version() <= t2.Version && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	newest := c.Version()
	if newest <= t2.Version {
		t.Fatalf("no new version after a-c = 80 ms")
	}
	t3, err := cl.Table(ctx, "a", t1.Version, time.Second)
	if err != nil || t3 == nil {
		t.Fatalf("slow watcher: %v, %v", t3, err)
	}
	if t3.Version != newest {
		t.Errorf("slow watcher at %d got version %d; want the newest %d", t1.Version, t3.Version, newest)
	}
	// Versions never go backwards: asking from the future gets nothing.
	if tf, err := cl.Table(ctx, "a", newest+100, 50*time.Millisecond); err != nil || tf != nil {
		t.Errorf("poll from a future version = %v, %v; want 304", tf, err)
	}

	// Reports from unregistered FEPs are refused; unknown LoPs are 404.
	_, err = cl.Report(ctx, api.Report{FEP: "zz", Samples: []api.Sample{{Peer: "a", RTTMS: 3}}})
	if se, ok := err.(*api.StatusError); !ok || se.Code != 403 {
		t.Errorf("report from unregistered fep: err = %v; want 403", err)
	}
	_, err = cl.Table(ctx, "zz", 0, 0)
	if !strings.Contains(strings.ToLower(errString(err)), "404") {
		t.Errorf("table of unknown lop: err = %v; want 404", err)
	}

	// Targets and matrix.
	tg, err := cl.Targets(ctx, "a")
	if err != nil || len(tg) != 2 {
		t.Errorf("targets of a = %v, %v; want b and c", tg, err)
	}
	m, err := cl.Matrix(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Names) != 3 || m.RTTMS[0][2] == nil || *m.RTTMS[0][2] != 80 || m.RTTMS[2][0] != nil {
		b, _ := json.Marshal(m)
		t.Errorf("matrix = %s; want a->c = 80 and c->a unmeasured", b)
	}

	// A FEP leaving triggers a computation without it.
	if err := cl.DeleteFEP(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	t4, err := cl.Table(ctx, "a", newest, 10*time.Second)
	if err != nil || t4 == nil {
		t.Fatalf("no new table after c left: %v, %v", t4, err)
	}
	if _, ok := t4.Members["c"]; ok { // the table of the drain (computed before the deletion)
		if t4, err = cl.Table(ctx, "a", t4.Version, 10*time.Second); err != nil || t4 == nil {
			t.Fatalf("no new table after c left (after its drain): %v, %v", t4, err)
		}
	}
	if _, ok := t4.Members["c"]; ok || slices.Contains(t4.Table.Locations, "c") {
		t.Errorf("table after c left still names c: %v", t4.Table.Locations)
	}
	h, err := cl.Health(ctx)
	if err != nil || !h.Leader || h.FEPs != 2 || h.Version != t4.Version {
		t.Errorf("health = %+v, %v; want leader, 2 feps, version %d", h, err, t4.Version)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestKeyRotation(t *testing.T) {
	st := openBolt(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c, err := New(Config{Store: st, KeyRotation: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	setup(t, st, line[:2], nil)
	ctx := testCtx(t)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	k1 := decodeTable(t, c, "a").Keys
	if k1.Current == nil || k1.Previous != nil {
		t.Fatalf("first keys = %+v; want a current key only", k1)
	}
	now = now.Add(2 * time.Hour)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	// Phase 1: the new key is published, accept only.
	kp := decodeTable(t, c, "a").Keys
	if !reflect.DeepEqual(kp.Current, k1.Current) || kp.Next == nil || kp.Next.ID == k1.Current.ID {
		t.Fatalf("keys after the rotation is due = %+v; want current %+v and a new next key", kp, k1.Current)
	}
	// Phase 2, KeySwitchAfter later (nobody acknowledged): signing switches.
	now = now.Add(c.cfg.KeySwitchAfter)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	k2 := decodeTable(t, c, "a").Keys
	if !reflect.DeepEqual(k2.Previous, k1.Current) || !reflect.DeepEqual(k2.Current, kp.Next) || k2.Next != nil {
		t.Errorf("rotated keys = %+v; want previous = %+v, current = the published %+v", k2, k1.Current, kp.Next)
	}
	if k2.Current.ID == k2.Previous.ID {
		t.Errorf("rotated key ids are equal (%d)", k2.Current.ID)
	}
}

// TestKeySwitchCountsFromServedTables: the KeySwitchAfter fallback counts
// from the moment a table carrying the next key is served, not from its
// publication in the store. A computation that is slow or fails after the
// key was published (a loaded or slow controller) must not make the key
// sign at once: no LoP could have fetched it, and every peer would refuse
// the headers ("unknown key id").
func TestKeySwitchCountsFromServedTables(t *testing.T) {
	st := openBolt(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c, err := New(Config{Store: st, KeyRotation: time.Hour, KeySwitchAfter: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	setup(t, st, line[:2], nil)
	ctx := testCtx(t)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	k1 := decodeTable(t, c, "a").Keys
	cur := c.keys.Current
	// The rotation is due: the next key is published in the store...
	now = now.Add(2 * time.Hour)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	next := c.keys.Next
	if len(next) == 0 {
		t.Fatal("no next key published")
	}
	// ...but the computation that would serve it takes longer than
	// KeySwitchAfter (or fails and is retried).
	now = now.Add(2 * c.cfg.KeySwitchAfter)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.keys.Next, next) || !bytes.Equal(c.keys.Current, cur) {
		t.Fatalf("the next key (id %d) became the signing key before any table carried it", pki.KeyID(next))
	}
	if err := c.Compute(ctx, true); err != nil {
		t.Fatal(err)
	}
	if kp := decodeTable(t, c, "a").Keys; kp.Next == nil || !reflect.DeepEqual(kp.Current, k1.Current) {
		t.Fatalf("served keys = %+v; want current %+v and the next key", kp, k1.Current)
	}
	// Served now: the fallback counts KeySwitchAfter from here.
	now = now.Add(c.cfg.KeySwitchAfter - time.Second)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.keys.Next, next) {
		t.Fatal("switched before KeySwitchAfter after the next key was served (nobody acknowledged it)")
	}
	now = now.Add(time.Second)
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.keys.Current, next) || len(c.keys.Next) != 0 {
		t.Fatal("not switched KeySwitchAfter after the next key was served")
	}
}

// TestKeyPublishedOnQuietComputation: a leader iteration that publishes
// the next key serves it even when nothing else changed (a computation
// woken by a report, not forced, skips an insignificant change). Before,
// the key stayed unserved and the fallback switched to it: every proxy
// then signed with a key no peer held ("unknown key id").
func TestKeyPublishedOnQuietComputation(t *testing.T) {
	st := openBolt(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c, err := New(Config{Store: st, KeyRotation: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	setup(t, st, line[:2], nil)
	ctx := testCtx(t)
	if err := c.step(ctx, true); err != nil {
		t.Fatal(err)
	}
	k1 := decodeTable(t, c, "a").Keys
	now = now.Add(2 * time.Hour) // the rotation is due; the RTTs did not change
	if err := c.step(ctx, false); err != nil {
		t.Fatal(err)
	}
	if k := decodeTable(t, c, "a").Keys; k.Next == nil || !reflect.DeepEqual(k.Current, k1.Current) {
		t.Fatalf("after a quiet computation with the rotation due: next key served %v, current key id %d; want the next key and current id %d",
			k.Next != nil, k.Current.ID, k1.Current.ID)
	}
}

func TestInitialKeysSeedStore(t *testing.T) {
	st := openBolt(t)
	seed := store.Keys{Current: bytes.Repeat([]byte{7}, 32), Rotated: time.Now()}
	c, err := New(Config{Store: st, InitialKeys: &seed})
	if err != nil {
		t.Fatal(err)
	}
	setup(t, st, line[:2], nil)
	if err := c.Compute(testCtx(t), true); err != nil {
		t.Fatal(err)
	}
	ta := decodeTable(t, c, "a")
	want := FEPKeyOf(seed.Current, "a", slices.Sorted(maps.Keys(ta.Members)))
	if got := ta.Keys.Current; got == nil || !reflect.DeepEqual(*got, *want) {
		t.Errorf("current key = %+v; want a's share of the seed %+v", got, want)
	}
	if strings.Contains(fmt.Sprint(ta.Keys), strings.Repeat("07", 32)) {
		t.Error("the table carries the overlay secret")
	}
}

func TestAppendTableFileMatchesEncodingJSON(t *testing.T) {
	names := []string{"a", "b", "c<&>\"é", "x.y_z-1"}
	qnames := make([][]byte, len(names))
	for k, n := range names {
		qnames[k] = appendJSONString(nil, n)
	}
	rows := tableRows{
		entries: []tableEntry{
			{from: 0, to: 1, class: 0, off: 0, n: 2, cost: 5000, sum: 10000, max: 10000},
			{from: 0, to: 2, class: 1, off: 2, n: 3, cost: 123456, sum: 1, max: 4_000_000_000_000},
			{from: 3, to: 2, class: 1, off: 5, n: 2, cost: 10, sum: 100, max: 0},
		},
		paths: []int32{0, 1, 0, 3, 2, 3, 2},
	}
	locs := []int{0, 1, 2, 3}
	for _, tc := range []struct {
		m       pathcomp.Model
		classes []sizeClass
	}{
		{pathcomp.Model{}, []sizeClass{{size: 14000, rounds: 1}, {size: 15_000_000, rounds: 11}}},
		{pathcomp.Model{ICW: 4, MSS: 1200}, []sizeClass{{size: 14000, rounds: 1}, {size: 15_000_000, rounds: 11}}},
		{pathcomp.Model{ICW: 100, EndICW: 10, EndRTT: 12.5}, []sizeClass{{size: 14000, rounds: 1, endRounds: 1}, {size: 15_000_000, rounds: 7, endRounds: 11}}},
	} {
		var entries []pathcomp.ChainEntry
		for _, e := range rows.entries {
			var path []string
			for _, x := range rows.paths[e.off : e.off+e.n] {
				path = append(path, names[x])
			}
			cl := tc.classes[e.class]
			entries = append(entries, pathcomp.ChainEntry{From: names[e.from], To: names[e.to], Size: cl.size, Rounds: cl.rounds, EndRounds: cl.endRounds,
				Path: path, CostMS: float64(e.cost) / 1000, SumMS: float64(e.sum) / 1000, MaxMS: float64(e.max) / 1000})
		}
		m := tc.m
		want, err := json.Marshal(pathcomp.TableFile{ICW: m.ICW, MSS: m.MSS, EndICW: m.EndICW, EndRTTMS: m.EndRTT, Locations: names, Chains: entries})
		if err != nil {
			t.Fatal(err)
		}
		if got := appendTableFile(nil, m, qnames, tc.classes, locs, rows); !bytes.Equal(got, want) {
			t.Errorf("appendTableFile(%+v) =\n%s\nwant\n%s", m, got, want)
		}
	}
	if got, want := string(appendTableFile(nil, pathcomp.Model{}, nil, nil, nil, tableRows{})), `{"locations":[],"chains":[]}`; got != want {
		t.Errorf("empty table = %s; want %s", got, want)
	}
}

func TestAppendMillis(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	values := []int64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1001, 1010, 1100, 123456, 4_000_000_000, 1 << 40, -1500}
	for k := 0; k < 20000; k++ {
		values = append(values, rng.Int64N(1<<(1+rng.IntN(45))))
	}
	for _, us := range values {
		want, err := json.Marshal(float64(us) / 1000)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendMillis(nil, us); !bytes.Equal(got, want) {
			t.Fatalf("appendMillis(%d) = %s; want %s", us, got, want)
		}
	}
}

// followerStore never leads, and its first watch ends at once, as an etcd
// watch does after a compaction.
type followerStore struct {
	store.Store
	watches atomic.Int32
}

func (s *followerStore) Lead(ctx context.Context) (context.Context, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *followerStore) Watch(ctx context.Context) <-chan store.Change {
	if s.watches.Add(1) == 1 {
		ch := make(chan store.Change)
		close(ch)
		return ch
	}
	return s.Store.Watch(ctx)
}

func TestFollowerRewatchesAndLoadsTables(t *testing.T) {
	st := &followerStore{Store: openBolt(t)}
	setup(t, st, line[:2], nil)
	c, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	deadline := time.Now().Add(10 * time.Second)
	for st.watches.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Another controller (the leader) writes a table.
	if _, err := st.PutTables(testCtx(t), []store.Table{{LoP: "a", Version: 42, Data: api.GzipBytes([]byte(`{"lop":"a","version":42}`))}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	et, err := c.WaitTable(ctx, "a", 0, "")
	if err != nil || et.Version != 42 {
		t.Fatalf("follower table = %v, %v; want version 42 from the store", et, err)
	}
	if c.IsLeader() {
		t.Error("follower claims to lead")
	}
}

func TestMaxProxies(t *testing.T) {
	// p0 .. p6 in a row 143 km apart, neighbours measured at 1 ms (far
	// below the estimate for unmeasured pairs); p0-p6 measured at 100 ms.
	var feps []api.FEP
	var rtts []store.RTT
	for k := 0; k < 7; k++ {
		feps = append(feps, fepAt(fmt.Sprintf("p%d", k), 50, 8+2*float64(k)))
		if k > 0 {
			rtts = append(rtts, sample(fmt.Sprintf("p%d", k-1), fmt.Sprintf("p%d", k), 1))
		}
	}
	rtts = append(rtts, sample("p0", "p6", 100))
	tests := []struct {
		name       string
		maxProxies int
		bound      int // proxies no chain may exceed
		to         string
		want       []string
	}{
		{"unlimited", -1, 5, "p6", []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6"}},
		{"default", 0, DefaultMaxProxies, "p6", []string{"p0", "p6"}},
		{"two", 2, 2, "p6", []string{"p0", "p6"}},
		{"two within reach", 2, 2, "p3", []string{"p0", "p1", "p2", "p3"}},
		{"five", 5, 5, "p6", []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := openBolt(t)
			setup(t, st, feps, rtts)
			c, err := New(Config{Store: st, MaxProxies: tc.maxProxies})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Compute(testCtx(t), true); err != nil {
				t.Fatal(err)
			}
			for _, f := range feps {
				tab := decodeTable(t, c, f.ID)
				for _, e := range tab.Table.Chains {
					if len(e.Path)-2 > tc.bound {
						t.Errorf("table %s: chain %v has %d proxies; want at most %d", f.ID, e.Path, len(e.Path)-2, tc.bound)
					}
				}
			}
			tab := decodeTable(t, c, "p0")
			for _, size := range []int64{14_000, 15_000_000} {
				if got := pathOf(tab, "p0", tc.to, size); !slices.Equal(got, tc.want) {
					t.Errorf("p0 -> %s (%d B) = %v; want %v", tc.to, size, got, tc.want)
				}
			}
		})
	}
	if _, err := New(Config{Store: openBolt(t), MaxProxies: pathcomp.MaxProxiesLimit + 1}); err == nil {
		t.Errorf("New(MaxProxies: %d) succeeded; want an error", pathcomp.MaxProxiesLimit+1)
	}
}

// TestDebounceLeadingEdge checks that a change after a quiet Debounce is
// computed at once, and that the changes following it within Debounce are
// coalesced into one computation Debounce after it.
func TestDebounceLeadingEdge(t *testing.T) {
	testenv.CheckLeaks(t)
	const debounce = time.Second
	st := openBolt(t)
	setup(t, st, line[:3], []store.RTT{sample("a", "b", 10), sample("b", "c", 10), sample("a", "c", 50)})
	c, err := New(Config{Store: st, Debounce: debounce, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.computed = make(chan uint64, 16)
	run(t, c)
	ctx := testCtx(t)
	<-c.computed // the computation on taking the lead
	time.Sleep(debounce + 100*time.Millisecond)

	start := time.Now()
	if _, err := c.Report(ctx, api.Report{FEP: "a", Samples: []api.Sample{{Peer: "b", RTTMS: 100}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.computed:
	case <-time.After(10 * time.Second):
		t.Fatal("no computation after a significant change")
	}
	if d := time.Since(start); d >= debounce/2 {
		t.Errorf("a change after a quiet debounce computed after %v; want at once (well below the %v debounce)", d, debounce)
	}

	// A burst of changes right after: one computation, Debounce after the last one.
	start = time.Now()
	for k := range 5 {
		if _, err := c.Report(ctx, api.Report{FEP: "b", Samples: []api.Sample{{Peer: "c", RTTMS: float64(20 + 30*k)}}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-c.computed:
	case <-time.After(10 * time.Second):
		t.Fatal("no computation after a burst of changes")
	}
	if d := time.Since(start); d < debounce/2 {
		t.Errorf("a burst right after a computation computed after %v; want it coalesced (about the %v debounce)", d, debounce)
	}
	select {
	case v := <-c.computed:
		t.Errorf("a second computation (v%d) for one burst", v)
	case <-time.After(debounce + 200*time.Millisecond):
	}
}

// TestComputeTablesEnds: with pooled, tuned hops and fresh ends
// (Model.EndICW) the controller's tables choose what the per-segment
// model says. a-c is 100 ms direct or 60+60 ms over b: with every segment
// at the hops' window the split wins at 200 KB (2 rounds of 60 ms), but
// when the ends' own rounds (window 10 over 40 ms ends) bound the
// transfer, the split's extra 20 ms lose. The table records the ends'
// model and each entry's end rounds.
func TestComputeTablesEnds(t *testing.T) {
	rtts := []store.RTT{sample("a", "b", 60), sample("b", "c", 60), sample("a", "c", 100)}
	for _, tc := range []struct {
		model pathcomp.Model
		want  []string
	}{
		{pathcomp.Model{ICW: 100}, []string{"a", "b", "c"}},
		{pathcomp.Model{ICW: 100, EndICW: 100, EndRTT: 40}, []string{"a", "b", "c"}},
		{pathcomp.Model{ICW: 100, EndICW: 10, EndRTT: 40}, []string{"a", "c"}},
	} {
		st := openBolt(t)
		setup(t, st, line, rtts)
		c, err := New(Config{Store: st, Model: tc.model, Sizes: []int64{14_000, 200_000, 15_000_000}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Compute(testCtx(t), true); err != nil {
			t.Fatal(err)
		}
		ta := decodeTable(t, c, "a")
		if got := pathOf(ta, "a", "c", 200_000); !slices.Equal(got, tc.want) {
			t.Errorf("model %+v: a -> c (200 KB) = %v; want %v", tc.model, got, tc.want)
		}
		if ta.Table.EndICW != tc.model.EndICW || ta.Table.EndRTTMS != tc.model.EndRTT {
			t.Errorf("model %+v: table records end icw %d, end rtt %v", tc.model, ta.Table.EndICW, ta.Table.EndRTTMS)
		}
		for _, e := range ta.Table.Chains {
			if want := tc.model.EndRounds(e.Size); tc.model.EndICW > 0 && e.EndRounds != want {
				t.Errorf("model %+v: entry %v (%d B) has end rounds %d; want %d", tc.model, e.Path, e.Size, e.EndRounds, want)
			}
		}
	}
}
