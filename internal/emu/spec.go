package emu

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/topo"
)

// Prefix is the only address range the emulator uses. Hosts get a /32 from it
// and every namespace routes the whole prefix through its TUN device.
var Prefix = netip.MustParsePrefix("10.77.0.0/16")

// MaxHosts bounds the number of hosts of one world.
const MaxHosts = 1000

// Spec describes a world: its hosts, the links between them and the TCP
// settings of every host. It is read from YAML by ParseSpec; Go callers may
// also build one directly (and may set Matrix instead of a dataset).
type Spec struct {
	Name    string     `yaml:"name"`
	Dataset string     `yaml:"dataset"` // embedded RTT dataset of package topo, e.g. "wonderproxy"
	RTTCSV  string     `yaml:"rtt_csv"` // or: path of an RTT-matrix CSV file (ms)
	Hosts   []HostSpec `yaml:"hosts"`
	Links   []LinkSpec `yaml:"links"`
	// Routes send a pair's packets through on-path hosts (both directions;
	// the reverse direction takes the hosts in reverse order). Each on-path
	// host is a real forwarding namespace (ip_forward on), and every
	// segment of the path has its own link (delay, loss, jitter, rate).
	Routes   []RouteSpec `yaml:"routes"`
	Defaults Link        `yaml:"defaults"` // applies to every pair; delay_ms is ignored here
	TCP      TCP         `yaml:"tcp"`
	// Offload enables GSO super-packets (IFF_VNET_HDR + TSO) on the TUN
	// devices; nil means true. Lossy or rate-limited links segment them in
	// software, so loss and rate stay per packet either way.
	Offload *bool `yaml:"offload"`

	// Matrix, when set by a Go caller, is used instead of Dataset/RTTCSV.
	Matrix *topo.Matrix `yaml:"-"`
}

// HostSpec is one host. Its link fields apply to every pair the host is part
// of (see docs/emu.md for how two hosts' values combine).
type HostSpec struct {
	Name     string `yaml:"name"`
	Location string `yaml:"location"` // location in the RTT matrix; empty = explicit links only
	Addr     string `yaml:"addr"`     // optional fixed address inside Prefix
	Link     `yaml:",inline"`
}

// Link holds the one-way properties of a direction of a pair of hosts.
type Link struct {
	DelayMS  float64 `yaml:"delay_ms"`  // one-way delay
	JitterMS float64 `yaml:"jitter_ms"` // uniform in [-jitter, +jitter], delay never below 0
	Reorder  bool    `yaml:"reorder"`   // let jitter reorder packets (default: keep order)
	// JitterGSO draws the jitter once per packet the sending kernel hands
	// over (a GSO super-packet: all its segments keep one delay and stay
	// whole when none is lost), as netem does per skb on a veth with TSO
	// (Mininet); default: per wire segment.
	JitterGSO bool    `yaml:"jitter_gso"`
	LossPct   float64 `yaml:"loss_pct"`   // independent per-packet loss, 0..100
	RateMbit  float64 `yaml:"rate_mbit"`  // serialization rate; 0 = unlimited
	QueueMS   float64 `yaml:"queue_ms"`   // queue limit as time to drain at rate; 0 = default
	QueuePkts int     `yaml:"queue_pkts"` // queue limit in packets (segments); 0 = use queue_ms
	// LimitPkts bounds the packets the direction holds at once, queued
	// and in the delay line together, as netem's limit does (Mininet's
	// TCLink: an HTB class with a netem child, default limit 1000); a
	// packet arriving at the bound is dropped. 0: no such bound (the
	// queue limit alone).
	LimitPkts int `yaml:"limit_pkts"`
}

// DefaultQueueMS is the queue limit of a rate-limited link that sets neither
// queue_ms nor queue_pkts.
const DefaultQueueMS = 100

// LinkSpec overrides the properties of a pair of hosts (both directions).
// Fields left out keep the value from the matrix, the hosts and defaults.
type LinkSpec struct {
	A         string   `yaml:"a"`
	B         string   `yaml:"b"`
	DelayMS   *float64 `yaml:"delay_ms"`
	JitterMS  *float64 `yaml:"jitter_ms"`
	Reorder   *bool    `yaml:"reorder"`
	JitterGSO *bool    `yaml:"jitter_gso"`
	LossPct   *float64 `yaml:"loss_pct"`
	RateMbit  *float64 `yaml:"rate_mbit"`
	QueueMS   *float64 `yaml:"queue_ms"`
	QueuePkts *int     `yaml:"queue_pkts"`
	LimitPkts *int     `yaml:"limit_pkts"`
}

// RouteSpec routes the packets between From and To (both directions)
// through the hosts Via, in order from From. The pair From-To needs no
// delay of its own; every consecutive pair of the path needs one and must
// not be routed itself.
type RouteSpec struct {
	From string   `yaml:"from"`
	To   string   `yaml:"to"`
	Via  []string `yaml:"via"`
}

// TCP holds per-host TCP settings, applied as sysctls in every namespace and
// as route attributes. Zero values mean the emulator's defaults, which raise
// the buffer limits so that one flow is not capped by them on long paths.
type TCP struct {
	RmemMax            int    `yaml:"rmem_max"`              // tcp_rmem max; default 64 MiB
	WmemMax            int    `yaml:"wmem_max"`              // tcp_wmem max; default 64 MiB
	Congestion         string `yaml:"congestion"`            // default: the root namespace's default
	SlowStartAfterIdle *int   `yaml:"slow_start_after_idle"` // 0 or 1; default kernel's (1)
	InitCwnd           int    `yaml:"initcwnd"`              // route initcwnd; 0 = kernel default (10)
	InitRwnd           int    `yaml:"initrwnd"`              // route initrwnd; 0 = kernel default
}

// DefaultBufMax is the default tcp_rmem/tcp_wmem maximum in every host.
const DefaultBufMax = 64 << 20

// ParseSpec decodes a YAML world spec and validates it. Unknown fields are
// errors, so that a typo does not silently change the world.
func ParseSpec(data []byte) (*Spec, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Spec
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("emu: empty spec")
		}
		return nil, fmt.Errorf("emu: parse spec: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("emu: parse spec: more than one YAML document")
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Validate checks the spec and that every pair of hosts has a delay. It loads
// the RTT matrix when the spec names one.
func (s *Spec) Validate() error {
	_, err := s.resolve()
	return err
}

// plan is a validated spec: addresses and the link of every ordered pair.
type plan struct {
	names []string
	addrs []netip.Addr
	links [][]Link // links[i][j]: direction i -> j
	// paths[[2]int{i, j}] is the host path from i to j (both ends
	// included) of a routed pair; nil when no route is given.
	paths map[[2]int][]int
	// forward[i] is set for hosts that are on the path of a route.
	forward []bool
}

func (l Link) validate(what string) error {
	check := func(field string, v float64, max float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("emu: %s: %s is %v; want >= 0", what, field, v)
		}
		if v > max {
			return fmt.Errorf("emu: %s: %s is %v; want <= %v", what, field, v, max)
		}
		return nil
	}
	for _, c := range []struct {
		field string
		v     float64
		max   float64
	}{
		{"delay_ms", l.DelayMS, 60_000},
		{"jitter_ms", l.JitterMS, 60_000},
		{"loss_pct", l.LossPct, 100},
		{"rate_mbit", l.RateMbit, 1_000_000},
		{"queue_ms", l.QueueMS, 60_000},
	} {
		if err := check(c.field, c.v, c.max); err != nil {
			return err
		}
	}
	if l.QueuePkts < 0 {
		return fmt.Errorf("emu: %s: queue_pkts is %d; want >= 0", what, l.QueuePkts)
	}
	if l.LimitPkts < 0 {
		return fmt.Errorf("emu: %s: limit_pkts is %d; want >= 0", what, l.LimitPkts)
	}
	return nil
}

// combine merges the per-host properties of the two ends of a pair: loss
// compounds, jitter and the queue take the larger/smaller value, rate the
// smaller non-zero one.
func combine(a, b Link) Link {
	out := Link{
		LossPct:   100 * (1 - (1-a.LossPct/100)*(1-b.LossPct/100)),
		JitterMS:  math.Max(a.JitterMS, b.JitterMS),
		Reorder:   a.Reorder || b.Reorder,
		JitterGSO: a.JitterGSO || b.JitterGSO,
		RateMbit:  minNonZero(a.RateMbit, b.RateMbit),
		QueueMS:   minNonZero(a.QueueMS, b.QueueMS),
	}
	out.QueuePkts = int(minNonZero(float64(a.QueuePkts), float64(b.QueuePkts)))
	out.LimitPkts = int(minNonZero(float64(a.LimitPkts), float64(b.LimitPkts)))
	return out
}

func minNonZero(a, b float64) float64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return math.Min(a, b)
}

func (s *Spec) matrix() (*topo.Matrix, error) {
	switch {
	case s.Matrix != nil:
		if err := s.Matrix.Validate(); err != nil {
			return nil, fmt.Errorf("emu: matrix: %w", err)
		}
		return s.Matrix, nil
	case s.Dataset != "" && s.RTTCSV != "":
		return nil, errors.New("emu: set dataset or rtt_csv, not both")
	case s.Dataset != "":
		m, err := loadDataset(s.Dataset)
		if err != nil {
			return nil, fmt.Errorf("emu: dataset %q: %w", s.Dataset, err)
		}
		return m, nil
	case s.RTTCSV != "":
		m, err := loadCSV(s.RTTCSV)
		if err != nil {
			return nil, fmt.Errorf("emu: rtt_csv: %w", err)
		}
		return m, nil
	}
	return nil, nil
}

func (s *Spec) resolve() (*plan, error) {
	if s == nil {
		return nil, errors.New("emu: nil spec")
	}
	n := len(s.Hosts)
	if n == 0 {
		return nil, errors.New("emu: spec has no hosts")
	}
	if n > MaxHosts {
		return nil, fmt.Errorf("emu: spec has %d hosts; at most %d", n, MaxHosts)
	}
	if err := s.Defaults.validate("defaults"); err != nil {
		return nil, err
	}
	if s.Defaults.DelayMS != 0 {
		return nil, errors.New("emu: defaults: delay_ms is not allowed (set it per link or use an RTT matrix)")
	}
	if err := s.TCP.validate(); err != nil {
		return nil, err
	}
	m, err := s.matrix()
	if err != nil {
		return nil, err
	}
	p := &plan{names: make([]string, n), addrs: make([]netip.Addr, n)}
	index := make(map[string]int, n)
	locIdx := make([]int, n)
	byAddr := make(map[netip.Addr]string, n)
	for i, h := range s.Hosts {
		if !validHostName(h.Name) {
			return nil, fmt.Errorf("emu: host %d: bad name %q (letters, digits, '.', '_', '-'; at most 63)", i+1, h.Name)
		}
		if _, dup := index[h.Name]; dup {
			return nil, fmt.Errorf("emu: duplicate host %q", h.Name)
		}
		index[h.Name] = i
		p.names[i] = h.Name
		if h.DelayMS != 0 {
			return nil, fmt.Errorf("emu: host %q: delay_ms is per link, not per host", h.Name)
		}
		if err := h.Link.validate("host " + h.Name); err != nil {
			return nil, err
		}
		locIdx[i] = -1
		if h.Location != "" {
			if m == nil {
				return nil, fmt.Errorf("emu: host %q: location %q needs a dataset or rtt_csv", h.Name, h.Location)
			}
			locIdx[i] = findLocation(m, h.Location)
			if locIdx[i] < 0 {
				return nil, fmt.Errorf("emu: host %q: unknown location %q%s", h.Name, h.Location, suggest(m.Names, h.Location))
			}
		}
	}
	// Fixed addresses first, then the others in order from 10.77.0.1.
	for i, h := range s.Hosts {
		if h.Addr == "" {
			continue
		}
		a, err := netip.ParseAddr(h.Addr)
		if err != nil {
			return nil, fmt.Errorf("emu: host %q: address: %w", h.Name, err)
		}
		if !Prefix.Contains(a) || a == Prefix.Addr() || a == lastAddr(Prefix) {
			return nil, fmt.Errorf("emu: host %q: address %v is not a host address in %v", h.Name, a, Prefix)
		}
		if other, clash := byAddr[a]; clash {
			return nil, fmt.Errorf("emu: address clash: hosts %q and %q both use %v", other, h.Name, a)
		}
		byAddr[a] = h.Name
		p.addrs[i] = a
	}
	next := Prefix.Addr().Next()
	for i := range s.Hosts {
		if p.addrs[i].IsValid() {
			continue
		}
		for byAddr[next] != "" {
			next = next.Next()
		}
		p.addrs[i] = next
		byAddr[next] = s.Hosts[i].Name
		next = next.Next()
	}
	// Links: defaults + hosts + matrix, then overrides.
	p.links = make([][]Link, n)
	for i := range p.links {
		p.links[i] = make([]Link, n)
		for j := range p.links[i] {
			if i == j {
				continue
			}
			l := combine(combine(s.Defaults, s.Hosts[i].Link), combine(s.Defaults, s.Hosts[j].Link))
			l.DelayMS = math.NaN() // unknown until the matrix or a link says
			if locIdx[i] >= 0 && locIdx[j] >= 0 {
				if rtt := m.RTT[locIdx[i]][locIdx[j]]; !math.IsInf(rtt, 0) {
					l.DelayMS = rtt / 2
				}
			}
			p.links[i][j] = l
		}
	}
	seen := make(map[[2]int]bool)
	for k, ls := range s.Links {
		what := fmt.Sprintf("link %d (%s-%s)", k+1, ls.A, ls.B)
		a, okA := index[ls.A]
		b, okB := index[ls.B]
		switch {
		case !okA:
			return nil, fmt.Errorf("emu: %s: unknown host %q", what, ls.A)
		case !okB:
			return nil, fmt.Errorf("emu: %s: unknown host %q", what, ls.B)
		case a == b:
			return nil, fmt.Errorf("emu: %s: a host cannot link to itself", what)
		}
		key := [2]int{min(a, b), max(a, b)}
		if seen[key] {
			return nil, fmt.Errorf("emu: %s: pair given twice", what)
		}
		seen[key] = true
		for _, d := range [][2]int{{a, b}, {b, a}} {
			l := p.links[d[0]][d[1]]
			ls.apply(&l)
			chk := l
			if math.IsNaN(chk.DelayMS) {
				chk.DelayMS = 0
			}
			if err := chk.validate(what); err != nil {
				return nil, err
			}
			p.links[d[0]][d[1]] = l
		}
	}
	if err := p.resolveRoutes(s.Routes, index); err != nil {
		return nil, err
	}
	for i := range n {
		for j := range n {
			if _, routed := p.paths[[2]int{i, j}]; routed && math.IsNaN(p.links[i][j].DelayMS) {
				l := p.links[i][j]
				l.DelayMS = 0 // never used: the pair's packets take the route
				p.links[i][j] = l
			}
			if i != j && math.IsNaN(p.links[i][j].DelayMS) {
				why := "has no location"
				switch {
				case locIdx[i] >= 0 && locIdx[j] >= 0:
					why = fmt.Sprintf("no measured RTT between %q and %q", s.Hosts[i].Location, s.Hosts[j].Location)
				case locIdx[i] >= 0:
					why = fmt.Sprintf("%q has no location", p.names[j])
				default:
					why = fmt.Sprintf("%q has no location", p.names[i])
				}
				return nil, fmt.Errorf("emu: no delay for pair %s-%s (%s): add a link with delay_ms", p.names[i], p.names[j], why)
			}
		}
	}
	return p, nil
}

// resolveRoutes checks the routes and fills p.paths and p.forward. It runs
// after the links so it can check that every hop of a path has a delay.
func (p *plan) resolveRoutes(routes []RouteSpec, index map[string]int) error {
	p.forward = make([]bool, len(p.names))
	if len(routes) == 0 {
		return nil
	}
	p.paths = make(map[[2]int][]int, 2*len(routes))
	for k, r := range routes {
		what := fmt.Sprintf("route %d (%s-%s)", k+1, r.From, r.To)
		if len(r.Via) == 0 {
			return fmt.Errorf("emu: %s: via is empty", what)
		}
		path := make([]int, 0, len(r.Via)+2)
		seen := make(map[int]bool, len(r.Via)+2)
		for _, name := range append(append([]string{r.From}, r.Via...), r.To) {
			i, ok := index[name]
			if !ok {
				return fmt.Errorf("emu: %s: unknown host %q", what, name)
			}
			if seen[i] {
				return fmt.Errorf("emu: %s: host %q appears twice on the path", what, name)
			}
			seen[i] = true
			path = append(path, i)
		}
		a, b := path[0], path[len(path)-1]
		if _, dup := p.paths[[2]int{a, b}]; dup {
			return fmt.Errorf("emu: %s: pair routed twice", what)
		}
		rev := make([]int, len(path))
		for i, h := range path {
			rev[len(path)-1-i] = h
		}
		p.paths[[2]int{a, b}] = path
		p.paths[[2]int{b, a}] = rev
		for _, h := range path[1 : len(path)-1] {
			p.forward[h] = true
		}
	}
	// Every hop must be a direct link with a delay. Pairs are checked in
	// order so that the error names the same hop every time.
	pairs := make([][2]int, 0, len(p.paths))
	for k := range p.paths {
		pairs = append(pairs, k)
	}
	slices.SortFunc(pairs, func(x, y [2]int) int {
		if c := cmp.Compare(x[0], y[0]); c != 0 {
			return c
		}
		return cmp.Compare(x[1], y[1])
	})
	for _, k := range pairs {
		path := p.paths[k]
		for h := 0; h+1 < len(path); h++ {
			i, j := path[h], path[h+1]
			if _, routed := p.paths[[2]int{i, j}]; routed {
				return fmt.Errorf("emu: route %s-%s: hop %s-%s is itself routed", p.names[path[0]], p.names[path[len(path)-1]], p.names[i], p.names[j])
			}
			if math.IsNaN(p.links[i][j].DelayMS) {
				return fmt.Errorf("emu: route %s-%s: no delay for hop %s-%s: add a link with delay_ms", p.names[path[0]], p.names[path[len(path)-1]], p.names[i], p.names[j])
			}
		}
	}
	return nil
}

func (ls LinkSpec) apply(l *Link) {
	if ls.DelayMS != nil {
		l.DelayMS = *ls.DelayMS
	}
	if ls.JitterMS != nil {
		l.JitterMS = *ls.JitterMS
	}
	if ls.Reorder != nil {
		l.Reorder = *ls.Reorder
	}
	if ls.JitterGSO != nil {
		l.JitterGSO = *ls.JitterGSO
	}
	if ls.LossPct != nil {
		l.LossPct = *ls.LossPct
	}
	if ls.RateMbit != nil {
		l.RateMbit = *ls.RateMbit
	}
	if ls.QueueMS != nil {
		l.QueueMS = *ls.QueueMS
	}
	if ls.QueuePkts != nil {
		l.QueuePkts = *ls.QueuePkts
	}
	if ls.LimitPkts != nil {
		l.LimitPkts = *ls.LimitPkts
	}
}

func (t TCP) validate() error {
	if t.RmemMax < 0 || t.WmemMax < 0 {
		return errors.New("emu: tcp: rmem_max and wmem_max must be >= 0")
	}
	if (t.RmemMax > 0 && t.RmemMax < 65536) || (t.WmemMax > 0 && t.WmemMax < 65536) {
		return errors.New("emu: tcp: rmem_max and wmem_max must be >= 65536")
	}
	if t.Congestion != "" && !validCongestion(t.Congestion) {
		return fmt.Errorf("emu: tcp: bad congestion control name %q", t.Congestion)
	}
	if t.SlowStartAfterIdle != nil && *t.SlowStartAfterIdle != 0 && *t.SlowStartAfterIdle != 1 {
		return fmt.Errorf("emu: tcp: slow_start_after_idle is %d; want 0 or 1", *t.SlowStartAfterIdle)
	}
	if t.InitCwnd < 0 || t.InitCwnd > 1000 || t.InitRwnd < 0 || t.InitRwnd > 1000 {
		return errors.New("emu: tcp: initcwnd and initrwnd must be in 0..1000")
	}
	return nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	bits := p.Bits()
	for i := bits; i < 32; i++ {
		a[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(a)
}

// suggest returns ` (did you mean "X"?)` for a close location name, or "".
func suggest(names []string, want string) string {
	lw := strings.ToLower(want)
	for _, n := range names {
		ln := strings.ToLower(n)
		if ln == lw || strings.Contains(ln, lw) || strings.Contains(lw, ln) {
			return fmt.Sprintf(" (did you mean %q?)", n)
		}
	}
	return ""
}
