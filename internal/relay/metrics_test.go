package relay

import (
	"net/http/httptest"
	"slices"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestMetricFamiliesUnchanged serves the daemon's /metrics handler, parses
// it with the Prometheus text parser, and wants every family the
// dashboards and alerts of deploy/ may use with the name, type and label
// names it had with client_golang.
func TestMetricFamiliesUnchanged(t *testing.T) {
	s, err := New(baseConfig("a"), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	// Families with labels appear once they have a series.
	s.m.flows.WithLabelValues("inp", "ok").Inc()
	s.m.roles[roleTrP].up.Add(10)
	s.m.roles[roleEgP].active.Inc()
	s.m.refusals.WithLabelValues(refuseAuth).Inc()
	s.m.directFor("no_chain").Inc()
	s.m.peer("b").connect.Observe(0.002)
	s.m.pool.WithLabelValues("hop", "hit").Inc()
	s.m.upstream.WithLabelValues("b", "pool").Inc()
	s.lookups.inc("asked")

	rec := httptest.NewRecorder()
	s.m.handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"mosto_relay_flows_total":              {dto.MetricType_COUNTER, []string{"outcome", "role"}},
		"mosto_relay_bytes_total":              {dto.MetricType_COUNTER, []string{"direction", "role"}},
		"mosto_relay_active_flows":             {dto.MetricType_GAUGE, []string{"role"}},
		"mosto_relay_refusals_total":           {dto.MetricType_COUNTER, []string{"reason"}},
		"mosto_relay_direct_total":             {dto.MetricType_COUNTER, []string{"reason"}},
		"mosto_relay_connect_seconds":          {dto.MetricType_HISTOGRAM, []string{"peer"}},
		"mosto_relay_pool_total":               {dto.MetricType_COUNTER, []string{"pool", "result"}},
		"mosto_relay_upstream_total":           {dto.MetricType_COUNTER, []string{"peer", "via"}},
		"mosto_relay_lookup_total":             {dto.MetricType_COUNTER, []string{"result"}},
		"mosto_relay_replay_evictions_total":   {dto.MetricType_COUNTER, nil},
		"mosto_relay_replay_entries":           {dto.MetricType_GAUGE, nil},
		"mosto_relay_replay_capacity":          {dto.MetricType_GAUGE, nil},
		"mosto_relay_size_hints_total":         {dto.MetricType_COUNTER, []string{"hint"}},
		"mosto_relay_size_keys":                {dto.MetricType_GAUGE, nil},
		"mosto_relay_size_key_evictions_total": {dto.MetricType_COUNTER, nil},
		"process_resident_memory_bytes":        {dto.MetricType_GAUGE, nil},
		"process_start_time_seconds":           {dto.MetricType_GAUGE, nil},
		"go_goroutines":                        {dto.MetricType_GAUGE, nil},
	}
	for name, w := range want {
		mf, ok := mfs[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if mf.GetType() != w.typ || mf.GetHelp() == "" {
			t.Errorf("%s: type %v, help %q; want %v and a help text", name, mf.GetType(), mf.GetHelp(), w.typ)
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName())
			}
			if !slices.Equal(ls, w.labels) {
				t.Errorf("%s: labels %v, want %v", name, ls, w.labels)
			}
		}
	}
	if v := mfs["mosto_relay_connect_seconds"].GetMetric()[0].GetHistogram(); v.GetSampleCount() != 1 || len(v.GetBucket()) != 15 {
		t.Errorf("connect histogram %v; want 1 sample in 14 buckets + +Inf", v)
	}
	if v := mfs["mosto_relay_replay_capacity"].GetMetric()[0].GetGauge().GetValue(); v != DefaultReplayEntries {
		t.Errorf("replay capacity %v, want %d", v, DefaultReplayEntries)
	}
}
