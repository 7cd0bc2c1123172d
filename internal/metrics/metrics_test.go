package metrics

import (
	"bytes"
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mosto-net/mosto/internal/testenv"
)

// parse parses an exposition with the Prometheus text parser.
func parse(t testing.TB, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, text)
	}
	return mfs
}

func text(t testing.TB, r *Registry) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteText(&b, r.Gather()); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestSameTextAsClientGolang applies the same operations to client_golang
// metrics and to ours and wants byte-identical expositions.
func TestSameTextAsClientGolang(t *testing.T) {
	odd := []string{"plain", `quo"te`, `back\slash`, "new\nline", "ütf-8 ✓", ""}
	theirs := prometheus.NewRegistry()
	ours := NewRegistry()

	pc := prometheus.NewCounter(prometheus.CounterOpts{Name: "t_count_total", Help: "A counter\nwith a \\ and \"quotes\"."})
	oc := ours.Counter(Opts{Name: "t_count_total", Help: "A counter\nwith a \\ and \"quotes\"."})
	pcv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_vec_total", Help: "By a and b."}, []string{"b", "a"})
	ocv := ours.CounterVec(Opts{Name: "t_vec_total", Help: "By a and b."}, "b", "a")
	pg := prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_gauge", Help: "G."})
	og := ours.Gauge(Opts{Name: "t_gauge", Help: "G."})
	pgv := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "t_gauges", Help: "GV."}, []string{"role"})
	ogv := ours.GaugeVec(Opts{Name: "t_gauges", Help: "GV."}, "role")
	buckets := ExponentialBuckets(0.0001, 2.5, 14)
	ph := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t_seconds", Help: "H.", Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14)}, []string{"peer"})
	oh := ours.HistogramVec(Opts{Name: "t_seconds", Help: "H."}, buckets, "peer")
	var fn float64 = 3
	pf := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t_func_total", Help: "F."}, func() float64 { return fn })
	ours.CounterFunc(Opts{Name: "t_func_total", Help: "F."}, func() float64 { return fn })
	pgf := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "t_funcg", Help: "FG."}, func() float64 { return -fn / 7 })
	ours.GaugeFunc(Opts{Name: "t_funcg", Help: "FG."}, func() float64 { return -fn / 7 })
	theirs.MustRegister(pc, pcv, pg, pgv, ph, pf, pgf)

	for i, v := range []float64{1, 0.5, 1e6, 123456789, 1e-9, 7} {
		pc.Add(v)
		oc.Add(v)
		pcv.WithLabelValues(odd[i], odd[(i+1)%len(odd)]).Add(v)
		ocv.WithLabelValues(odd[i], odd[(i+1)%len(odd)]).Add(v)
		pg.Set(-v)
		og.Set(-v)
		pgv.WithLabelValues(odd[i]).Add(v)
		ogv.WithLabelValues(odd[i]).Add(v)
		pgv.WithLabelValues(odd[i]).Dec()
		ogv.WithLabelValues(odd[i]).Dec()
		for _, o := range []float64{0.0001, 0.00025, 0.003, 1e-7, 40, 1e9} {
			ph.WithLabelValues(odd[i]).Observe(o * v)
			oh.WithLabelValues(odd[i]).Observe(o * v)
		}
	}
	pg.Set(math.Inf(1))
	og.Set(math.Inf(1))
	pgv.WithLabelValues("nan").Set(math.NaN())
	ogv.WithLabelValues("nan").Set(math.NaN())

	mfs, err := theirs.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&want, mf); err != nil {
			t.Fatal(err)
		}
	}
	got := text(t, ours)
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("exposition differs from client_golang's\n--- ours\n%s\n--- theirs\n%s", got, want.Bytes())
	}
	parse(t, got)
}

// TestRuntimeSeriesAsClientGolang wants the same go_* and process_* family
// names, types and HELP texts as client_golang's Go and process
// collectors, and plausible values.
func TestRuntimeSeriesAsClientGolang(t *testing.T) {
	theirs := prometheus.NewRegistry()
	theirs.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mfs, err := theirs.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ours := NewRegistry()
	ours.RegisterRuntime()
	got := parse(t, text(t, ours))
	if len(got) != len(mfs) {
		var names []string
		for n := range got {
			names = append(names, n)
		}
		slices.Sort(names)
		t.Errorf("%d families, client_golang has %d; ours: %v", len(got), len(mfs), names)
	}
	for _, mf := range mfs {
		g, ok := got[mf.GetName()]
		switch {
		case !ok:
			t.Errorf("%s missing", mf.GetName())
		case g.GetType() != mf.GetType() || g.GetHelp() != mf.GetHelp():
			t.Errorf("%s: type %v help %q; client_golang: %v %q", mf.GetName(), g.GetType(), g.GetHelp(), mf.GetType(), mf.GetHelp())
		case len(g.GetMetric()) != len(mf.GetMetric()):
			t.Errorf("%s: %d series, client_golang %d", mf.GetName(), len(g.GetMetric()), len(mf.GetMetric()))
		}
	}
	val := func(name string) float64 {
		m := got[name].GetMetric()[0]
		return m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	theirVal := func(name string) float64 {
		for _, mf := range mfs {
			if mf.GetName() == name {
				m := mf.GetMetric()[0]
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		return math.NaN()
	}
	for _, n := range []string{"process_max_fds", "process_virtual_memory_max_bytes", "process_start_time_seconds",
		"go_gc_gogc_percent", "go_gc_gomemlimit_bytes", "go_sched_gomaxprocs_threads"} {
		if val(n) != theirVal(n) {
			t.Errorf("%s = %v, client_golang %v", n, val(n), theirVal(n))
		}
	}
	for _, n := range []string{"process_resident_memory_bytes", "process_virtual_memory_bytes", "process_open_fds",
		"process_network_receive_bytes_total", "go_memstats_sys_bytes", "go_goroutines", "go_threads"} {
		if v, w := val(n), theirVal(n); !(v > 0) || v > 4*w || v < w/4 {
			t.Errorf("%s = %v, client_golang %v", n, v, w)
		}
	}
	if v := got["go_info"].GetMetric()[0].GetLabel(); len(v) != 1 || v[0].GetName() != "version" || !strings.HasPrefix(v[0].GetValue(), "go") {
		t.Errorf("go_info labels %v", v)
	}
}

func TestGogcPercent(t *testing.T) {
	for env, want := range map[string]int{"": 100, "off": -1, "50": 50, "junk": 100} {
		if got := gogcPercent(env); got != want {
			t.Errorf("GOGC=%q: %d, want %d", env, got, want)
		}
	}
}

func TestNetOctets(t *testing.T) {
	in := "TcpExt: A B\nTcpExt: 1 2\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1234 5678\n"
	if rx, tx := netOctets(in); rx != 1234 || tx != 5678 {
		t.Errorf("netOctets = %v, %v; want 1234, 5678", rx, tx)
	}
	if rx, tx := netOctets("garbage"); !math.IsNaN(rx) || !math.IsNaN(tx) {
		t.Errorf("netOctets(garbage) = %v, %v; want NaN", rx, tx)
	}
}

// TestConcurrentUpdates updates from many goroutines while gathering and
// wants exact totals.
func TestConcurrentUpdates(t *testing.T) {
	r := NewRegistry()
	c := r.CounterVec(Opts{Name: "c_total", Help: "c"}, "k")
	g := r.Gauge(Opts{Name: "g", Help: "g"})
	h := r.HistogramVec(Opts{Name: "h", Help: "h"}, []float64{1, 2}, "k")
	const workers, n = 8, 2000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			WriteText(io.Discard, r.Gather())
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := string(rune('a' + w%3))
			for i := range n {
				c.WithLabelValues(k).Inc()
				c.WithLabelValues(k).Add(0.5)
				g.Inc()
				g.Sub(0.25)
				h.WithLabelValues(k).Observe(float64(i % 3))
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-done
	var sum float64
	var obs uint64
	for k := range 3 {
		sum += c.WithLabelValues(string(rune('a' + k))).Value()
		obs += h.WithLabelValues(string(rune('a' + k))).Count()
	}
	if sum != workers*n*1.5 {
		t.Errorf("counters sum %v, want %v", sum, workers*n*1.5)
	}
	if g.Value() != workers*n*0.75 {
		t.Errorf("gauge %v, want %v", g.Value(), workers*n*0.75)
	}
	if obs != workers*n {
		t.Errorf("observations %d, want %d", obs, workers*n)
	}
	mfs := parse(t, text(t, r))
	for _, m := range mfs["h"].GetMetric() {
		b := m.GetHistogram().GetBucket()
		if len(b) != 3 || b[2].GetCumulativeCount() != m.GetHistogram().GetSampleCount() || b[0].GetCumulativeCount() > b[1].GetCumulativeCount() || b[1].GetCumulativeCount() > b[2].GetCumulativeCount() {
			t.Errorf("histogram %v not cumulative", m)
		}
	}
}

func TestCounterNeverDecreases(t *testing.T) {
	var c Counter
	c.Add(2)
	c.Add(-1)
	c.Add(math.NaN())
	c.Add(0.25)
	c.Add(1e30)
	if got := c.Value(); got != 2.25+1e30 {
		t.Errorf("value %v", got)
	}
}

func TestHistogramBoundsInclusive(t *testing.T) {
	r := NewRegistry()
	h := r.HistogramVec(Opts{Name: "h", Help: "h"}, []float64{1, 2, math.Inf(1)})
	for _, v := range []float64{0, 1, 1.5, 2, 3, math.NaN()} {
		h.WithLabelValues().Observe(v)
	}
	f, _ := Find(r.Gather(), "h")
	s := f.Series[0]
	want := []Bucket{{1, 2}, {2, 4}, {math.Inf(1), 5}}
	if !slices.Equal(s.Buckets, want) || s.Count != 5 || s.Sum != 7.5 {
		t.Errorf("buckets %v count %d sum %v; want %v 5 7.5", s.Buckets, s.Count, s.Sum, want)
	}
}

func TestRegistrationErrorsPanic(t *testing.T) {
	for name, f := range map[string]func(r *Registry){
		"duplicate":      func(r *Registry) { r.Gauge(Opts{Name: "x"}); r.Counter(Opts{Name: "x"}) },
		"runtime twice":  func(r *Registry) { r.RegisterRuntime(); r.RegisterRuntime() },
		"bad name":       func(r *Registry) { r.Counter(Opts{Name: "1x"}) },
		"empty name":     func(r *Registry) { r.GaugeFunc(Opts{}, func() float64 { return 0 }) },
		"bad label":      func(r *Registry) { r.CounterVec(Opts{Name: "x"}, "a-b") },
		"reserved label": func(r *Registry) { r.CounterVec(Opts{Name: "x"}, "__a") },
		"le":             func(r *Registry) { r.HistogramVec(Opts{Name: "x"}, []float64{1}, "le") },
		"label twice":    func(r *Registry) { r.GaugeVec(Opts{Name: "x"}, "a", "a") },
		"buckets":        func(r *Registry) { r.HistogramVec(Opts{Name: "x"}, []float64{2, 1}) },
		"values":         func(r *Registry) { r.CounterVec(Opts{Name: "x"}, "a").WithLabelValues("1", "2") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f(NewRegistry())
		})
	}
}

func TestHandler(t *testing.T) {
	testenv.CheckLeaks(t)
	r := NewRegistry()
	r.Counter(Opts{Name: "hits_total", Help: "Hits."}).Add(3)
	srv := httptest.NewServer(Handler(r))
	defer srv.Close()
	get := func(method, ae string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, srv.URL, nil)
		req.Header.Set("Accept-Encoding", ae)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body := io.Reader(resp.Body)
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	for _, ae := range []string{"", "gzip", "deflate, gzip;q=1.0", "gzip;q=0", "identity"} {
		resp, b := get(http.MethodGet, ae)
		gz := resp.Header.Get("Content-Encoding") == "gzip"
		if wantGz := ae == "gzip" || ae == "deflate, gzip;q=1.0"; gz != wantGz {
			t.Errorf("Accept-Encoding %q: gzip %v", ae, gz)
		}
		if ct := resp.Header.Get("Content-Type"); ct != ContentType {
			t.Errorf("Content-Type %q", ct)
		}
		if got := parse(t, b)["hits_total"].GetMetric()[0].GetCounter().GetValue(); got != 3 {
			t.Errorf("hits_total %v", got)
		}
	}
	if resp, _ := get(http.MethodPost, ""); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s", resp.Status)
	}
}

// FuzzLabelValue: any label value and HELP text give an exposition the
// Prometheus parser reads back to the same strings (invalid UTF-8 as
// U+FFFD).
func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"", `a"b`, `\`, "\n", "\\n", "\xff", "é", "}", "{x=\"y\"}"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, value, help string) {
		r := NewRegistry()
		r.GaugeVec(Opts{Name: "f", Help: help}, "v").WithLabelValues(value).Set(1)
		mf := parse(t, text(t, r))["f"]
		// The parser skips the blanks before the HELP text.
		wantHelp := strings.TrimLeft(strings.ToValidUTF8(help, "\uFFFD"), " \t")
		if mf.GetHelp() != wantHelp {
			t.Errorf("help %q, want %q", mf.GetHelp(), wantHelp)
		}
		if got, want := mf.GetMetric()[0].GetLabel()[0].GetValue(), strings.ToValidUTF8(value, "\uFFFD"); got != want {
			t.Errorf("label value %q, want %q", got, want)
		}
	})
}

func TestDeleteLabelValues(t *testing.T) {
	r := NewRegistry()
	g := r.GaugeVec(Opts{Name: "g", Help: "g"}, "fep")
	g.WithLabelValues("a").Set(1)
	g.WithLabelValues("b").Set(2)
	if !g.DeleteLabelValues("a") || g.DeleteLabelValues("a") || g.DeleteLabelValues("a", "x") {
		t.Error("DeleteLabelValues: want true once, then false")
	}
	f, _ := Find(r.Gather(), "g")
	if len(f.Series) != 1 || f.Series[0].Label("fep") != "b" || f.Series[0].Value != 2 {
		t.Errorf("series after delete: %+v", f.Series)
	}
	if g.WithLabelValues("a").Value() != 0 {
		t.Error("a re-made gauge is not fresh")
	}
}
