package metrics

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Type is the type of a metric family, as the TYPE line says it.
type Type string

// Metric family types.
const (
	TypeCounter   Type = "counter"
	TypeGauge     Type = "gauge"
	TypeHistogram Type = "histogram"
	TypeSummary   Type = "summary"
)

// Opts names a metric family and says what it measures.
type Opts struct {
	Name string
	Help string
}

// Registry holds metric families and gathers them for exposition. The zero
// value is not usable; use NewRegistry.
type Registry struct {
	mu         sync.Mutex
	names      map[string]bool
	collectors []collector
}

// collector produces whole families when gathered.
type collector interface {
	collect(add func(Family))
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{names: make(map[string]bool)}
}

// register adds c, which exposes the families named names. It panics on an
// invalid or duplicate name.
func (r *Registry) register(c collector, names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		if !validName(n) {
			panic(fmt.Sprintf("metrics: invalid metric name %q", n))
		}
		if r.names[n] {
			panic(fmt.Sprintf("metrics: %q registered twice", n))
		}
	}
	for _, n := range names {
		r.names[n] = true
	}
	r.collectors = append(r.collectors, c)
}

// Gather returns a snapshot of every family, sorted by name, each family's
// series sorted by label values. Families without series are left out.
func (r *Registry) Gather() []Family {
	r.mu.Lock()
	cs := slices.Clone(r.collectors)
	r.mu.Unlock()
	var fams []Family
	for _, c := range cs {
		c.collect(func(f Family) {
			if len(f.Series) > 0 {
				fams = append(fams, f)
			}
		})
	}
	slices.SortFunc(fams, func(a, b Family) int { return strings.Compare(a.Name, b.Name) })
	return fams
}

// Family is a gathered metric family.
type Family struct {
	Name   string
	Help   string
	Type   Type
	Series []Series
}

// Series is one labelled series of a family, its labels sorted by name.
// Value holds a counter's or a
// gauge's value; histograms have Buckets, summaries Quantiles, and both
// Count and Sum.
type Series struct {
	Labels    []Label
	Value     float64
	Buckets   []Bucket   // cumulative, ascending, the last one +Inf
	Quantiles []Quantile // ascending
	Count     uint64
	Sum       float64
}

// Label is a label name and value.
type Label struct{ Name, Value string }

// Bucket is a cumulative histogram bucket: Count observations <= Upper.
type Bucket struct {
	Upper float64
	Count uint64
}

// Quantile is a summary quantile.
type Quantile struct{ Q, Value float64 }

// Label returns the value of the label named name ("" if none).
func (s Series) Label(name string) string {
	for _, l := range s.Labels {
		if l.Name == name {
			return l.Value
		}
	}
	return ""
}

// Find returns the family named name among fams.
func Find(fams []Family, name string) (Family, bool) {
	for _, f := range fams {
		if f.Name == name {
			return f, true
		}
	}
	return Family{}, false
}

// addFloat adds v to the float64 whose bits b holds.
func addFloat(b *atomic.Uint64, v float64) {
	for {
		old := b.Load()
		if b.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// Counter is a value that only goes up.
type Counter struct {
	n    atomic.Uint64 // whole additions
	bits atomic.Uint64 // fractional (or huge) additions, float64 bits
}

// Inc adds 1.
func (c *Counter) Inc() { c.n.Add(1) }

// Add adds v. A negative or NaN v is ignored: a counter never goes down.
func (c *Counter) Add(v float64) {
	if !(v >= 0) {
		return
	}
	if v < 1<<63 {
		if u := uint64(v); float64(u) == v {
			c.n.Add(u)
			return
		}
	}
	addFloat(&c.bits, v)
}

// Value returns the current value.
func (c *Counter) Value() float64 {
	return float64(c.n.Load()) + math.Float64frombits(c.bits.Load())
}

// Gauge is a value that goes up and down.
type Gauge struct{ bits atomic.Uint64 }

// Set sets the value to v.
func (g *Gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

// Add adds v (which may be negative).
func (g *Gauge) Add(v float64) { addFloat(&g.bits, v) }

// Sub subtracts v.
func (g *Gauge) Sub(v float64) { addFloat(&g.bits, -v) }

// Inc adds 1.
func (g *Gauge) Inc() { g.Add(1) }

// Dec subtracts 1.
func (g *Gauge) Dec() { g.Add(-1) }

// Value returns the current value.
func (g *Gauge) Value() float64 { return math.Float64frombits(g.bits.Load()) }

// Histogram counts observations in buckets.
type Histogram struct {
	upper  []float64       // ascending bucket upper bounds, without +Inf
	counts []atomic.Uint64 // per bucket (not cumulative), the last one +Inf
	sum    atomic.Uint64   // float64 bits
}

func newHistogram(upper []float64) *Histogram {
	return &Histogram{upper: upper, counts: make([]atomic.Uint64, len(upper)+1)}
}

// Observe records v. NaN is ignored.
func (h *Histogram) Observe(v float64) {
	if math.IsNaN(v) {
		return
	}
	i, _ := slices.BinarySearch(h.upper, v) // first bound >= v
	h.counts[i].Add(1)
	addFloat(&h.sum, v)
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

func (h *Histogram) snapshot(s *Series) {
	s.Buckets = make([]Bucket, len(h.counts))
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
		up := math.Inf(1)
		if i < len(h.upper) {
			up = h.upper[i]
		}
		s.Buckets[i] = Bucket{Upper: up, Count: n}
	}
	s.Count = n
	s.Sum = math.Float64frombits(h.sum.Load())
}

// ExponentialBuckets returns count bucket bounds: start, start*factor, ...
// It panics unless start > 0, factor > 1 and count >= 1.
func ExponentialBuckets(start, factor float64, count int) []float64 {
	if !(start > 0) || !(factor > 1) || count < 1 {
		panic(fmt.Sprintf("metrics: ExponentialBuckets(%v, %v, %d): want start > 0, factor > 1, count >= 1", start, factor, count))
	}
	b := make([]float64, count)
	for i := range b {
		b[i] = start
		start *= factor
	}
	return b
}

// family is a registered family of one type with fixed label names; its
// children are made on first use of their label values.
type family[T any] struct {
	Opts
	typ      Type
	labels   []string
	order    []int // indexes of labels sorted by name: the exposition order
	newChild func() *T
	write    func(*T, *Series)

	mu       sync.RWMutex
	children map[string]*child[T]
}

type child[T any] struct {
	values []string
	m      *T
}

func newFamily[T any](r *Registry, o Opts, typ Type, labels []string, newChild func() *T, write func(*T, *Series)) *family[T] {
	for _, l := range labels {
		if !validLabel(l) || (typ == TypeHistogram && l == "le") || (typ == TypeSummary && l == "quantile") {
			panic(fmt.Sprintf("metrics: %s: invalid label name %q", o.Name, l))
		}
	}
	for i := range labels {
		if slices.Contains(labels[:i], labels[i]) {
			panic(fmt.Sprintf("metrics: %s: label %q twice", o.Name, labels[i]))
		}
	}
	f := &family[T]{Opts: o, typ: typ, labels: slices.Clone(labels), newChild: newChild, write: write,
		children: make(map[string]*child[T])}
	f.order = make([]int, len(labels))
	for i := range f.order {
		f.order[i] = i
	}
	slices.SortFunc(f.order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	r.register(f, o.Name)
	return f
}

// with returns the child for values, made on first use. It panics if the
// number of values is not the number of labels.
func (f *family[T]) with(values []string) *T {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s: %d label values for %d labels", f.Name, len(values), len(f.labels)))
	}
	key := strings.Join(values, "\xff")
	f.mu.RLock()
	c, ok := f.children[key]
	f.mu.RUnlock()
	if ok {
		return c.m
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.children[key]; ok {
		return c.m
	}
	c = &child[T]{values: slices.Clone(values), m: f.newChild()}
	f.children[key] = c
	return c.m
}

// remove forgets the child of values; it reports whether there was one.
func (f *family[T]) remove(values []string) bool {
	if len(values) != len(f.labels) {
		return false
	}
	key := strings.Join(values, "\xff")
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.children[key]
	delete(f.children, key)
	return ok
}

func (f *family[T]) collect(add func(Family)) {
	f.mu.RLock()
	cs := make([]*child[T], 0, len(f.children))
	for _, c := range f.children {
		cs = append(cs, c)
	}
	f.mu.RUnlock()
	slices.SortFunc(cs, func(a, b *child[T]) int {
		for _, i := range f.order {
			if c := strings.Compare(a.values[i], b.values[i]); c != 0 {
				return c
			}
		}
		return 0
	})
	out := Family{Name: f.Name, Help: f.Help, Type: f.typ, Series: make([]Series, len(cs))}
	for i, c := range cs {
		s := &out.Series[i]
		if len(f.labels) > 0 {
			s.Labels = make([]Label, len(f.labels))
			for j, k := range f.order {
				s.Labels[j] = Label{f.labels[k], c.values[k]}
			}
		}
		f.write(c.m, s)
	}
	add(out)
}

func newCounter() *Counter                   { return new(Counter) }
func newGauge() *Gauge                       { return new(Gauge) }
func writeCounter(c *Counter, s *Series)     { s.Value = c.Value() }
func writeGauge(g *Gauge, s *Series)         { s.Value = g.Value() }
func writeHistogram(h *Histogram, s *Series) { h.snapshot(s) }

// Counter registers and returns a counter without labels.
func (r *Registry) Counter(o Opts) *Counter {
	return newFamily(r, o, TypeCounter, nil, newCounter, writeCounter).with(nil)
}

// Gauge registers and returns a gauge without labels.
func (r *Registry) Gauge(o Opts) *Gauge {
	return newFamily(r, o, TypeGauge, nil, newGauge, writeGauge).with(nil)
}

// CounterVec is a family of counters with labels.
type CounterVec struct{ f *family[Counter] }

// CounterVec registers a counter family with the label names labels.
func (r *Registry) CounterVec(o Opts, labels ...string) *CounterVec {
	return &CounterVec{newFamily(r, o, TypeCounter, labels, newCounter, writeCounter)}
}

// WithLabelValues returns the counter of the label values, in the order of
// the label names (it panics on a wrong number of values).
func (v *CounterVec) WithLabelValues(values ...string) *Counter { return v.f.with(values) }

// DeleteLabelValues removes the series of the label values; it reports
// whether there was one. A counter held from before keeps counting
// unexposed.
func (v *CounterVec) DeleteLabelValues(values ...string) bool { return v.f.remove(values) }

// GaugeVec is a family of gauges with labels.
type GaugeVec struct{ f *family[Gauge] }

// GaugeVec registers a gauge family with the label names labels.
func (r *Registry) GaugeVec(o Opts, labels ...string) *GaugeVec {
	return &GaugeVec{newFamily(r, o, TypeGauge, labels, newGauge, writeGauge)}
}

// WithLabelValues returns the gauge of the label values.
func (v *GaugeVec) WithLabelValues(values ...string) *Gauge { return v.f.with(values) }

// DeleteLabelValues removes the series of the label values; it reports
// whether there was one.
func (v *GaugeVec) DeleteLabelValues(values ...string) bool { return v.f.remove(values) }

// HistogramVec is a family of histograms with labels.
type HistogramVec struct{ f *family[Histogram] }

// HistogramVec registers a histogram family with the bucket upper bounds
// buckets (ascending; +Inf is implied) and the label names labels.
func (r *Registry) HistogramVec(o Opts, buckets []float64, labels ...string) *HistogramVec {
	up := slices.Clone(buckets)
	if n := len(up); n > 0 && math.IsInf(up[n-1], 1) {
		up = up[:n-1]
	}
	for i, b := range up {
		if math.IsNaN(b) || (i > 0 && b <= up[i-1]) {
			panic(fmt.Sprintf("metrics: %s: buckets %v not strictly ascending", o.Name, buckets))
		}
	}
	return &HistogramVec{newFamily(r, o, TypeHistogram, labels, func() *Histogram { return newHistogram(up) }, writeHistogram)}
}

// WithLabelValues returns the histogram of the label values.
func (v *HistogramVec) WithLabelValues(values ...string) *Histogram { return v.f.with(values) }

// funcMetric is a family of one series whose value f gives when gathered.
type funcMetric struct {
	Opts
	typ Type
	f   func() float64
}

func (m *funcMetric) collect(add func(Family)) {
	add(Family{Name: m.Name, Help: m.Help, Type: m.typ, Series: []Series{{Value: m.f()}}})
}

// CounterFunc registers a counter whose value f returns at each gathering
// (f must be safe to call concurrently and never decrease).
func (r *Registry) CounterFunc(o Opts, f func() float64) {
	r.register(&funcMetric{o, TypeCounter, f}, o.Name)
}

// GaugeFunc registers a gauge whose value f returns at each gathering.
func (r *Registry) GaugeFunc(o Opts, f func() float64) {
	r.register(&funcMetric{o, TypeGauge, f}, o.Name)
}

// validName reports whether n is a valid metric name.
func validName(n string) bool {
	if n == "" {
		return false
	}
	for i, c := range n {
		if !(c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// validLabel reports whether l is a valid label name (not reserved).
func validLabel(l string) bool {
	if l == "" || strings.HasPrefix(l, "__") {
		return false
	}
	for i, c := range l {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
