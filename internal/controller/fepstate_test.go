package controller

import (
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/metrics"
)

// TestFEPStates: a report (RTTs or counters only) records the FEP's last
// report and counters, wakes Changed, sets the per-FEP metric; deleting
// the FEP forgets it; invalid counters are refused.
func TestFEPStates(t *testing.T) {
	st := openBolt(t)
	setup(t, st, line[:2], nil)
	reg := metrics.NewRegistry()
	now := time.Date(2026, 11, 25, 1, 0, 0, 0, time.UTC)
	c, err := New(Config{Store: st, Metrics: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if err := c.reloadFEPs(ctx); err != nil {
		t.Fatal(err)
	}
	changed := c.Changed()
	stats := &api.ProxyStats{Started: now.Add(-time.Hour), At: now, Flows: map[string]float64{"ok": 9}, Direct: map[string]float64{"no_chain": 2}}
	if _, err := c.Report(ctx, api.Report{FEP: "a", Stats: stats}); err != nil {
		t.Fatalf("counters-only report: %v", err)
	}
	select {
	case <-changed:
	default:
		t.Error("Changed not closed by a report")
	}
	if _, err := c.Report(ctx, api.Report{FEP: "b", Samples: []api.Sample{{Peer: "a", RTTMS: 3}}}); err != nil {
		t.Fatal(err)
	}
	s := c.FEPStates()
	if a := s["a"]; !a.LastReport.Equal(now) || a.Stats == nil || a.Stats.Flows["ok"] != 9 || a.Stats.Direct["no_chain"] != 2 {
		t.Errorf("state of a = %+v; want the report time and its counters", a)
	}
	if b := s["b"]; !b.LastReport.Equal(now) || b.Stats != nil {
		t.Errorf("state of b = %+v; want the report time, no counters", b)
	}
	if got := gauges(t, reg, "mosto_controller_fep_last_report_timestamp_seconds"); len(got) != 2 || got["a"] != float64(now.Unix()) || got["b"] != float64(now.Unix()) {
		t.Errorf("per-FEP report metric %v; want a and b at %d", got, now.Unix())
	}
	if _, err := c.Report(ctx, api.Report{FEP: "a", Stats: &api.ProxyStats{Bytes: -5}}); err == nil {
		t.Error("negative bytes accepted")
	}
	if err := c.DeleteFEP(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.FEPStates()["a"]; ok {
		t.Error("deleted FEP a still has a state")
	}
	if got := gauges(t, reg, "mosto_controller_fep_last_report_timestamp_seconds"); len(got) != 1 {
		t.Errorf("per-FEP report series after deleting a: %v; want b only", got)
	}
	// The key metric is set by the leader's key handling.
	if err := c.ensureKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if got := gauges(t, reg, "mosto_controller_keys_rotated_timestamp_seconds"); got[""] != float64(now.Unix()) {
		t.Errorf("keys rotated metric %v; want %v", got, now.Unix())
	}
}

// gauges returns the values of the gauge name by its fep label.
func gauges(t *testing.T, reg *metrics.Registry, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	f, _ := metrics.Find(reg.Gather(), name)
	for _, m := range f.Series {
		out[m.Label("fep")] = m.Value
	}
	return out
}
