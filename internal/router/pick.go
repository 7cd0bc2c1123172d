package router

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"sort"
	"sync/atomic"
	"time"
)

// Surrogate is one cache server the router can send clients to.
type Surrogate struct {
	Name string `json:"name"`
	// Addr is the surrogate's host:port: where the router's pooled
	// connections go, the Location of a 302 and the DNS answer.
	Addr string `json:"addr"`
}

// Location maps the clients of a prefix to their RTT to each surrogate
// (from the controller's RTT data or a static map; a static preference list
// is RTTs 1, 2, 3... ms).
type Location struct {
	Prefix netip.Prefix             `json:"prefix"`
	RTT    map[string]time.Duration `json:"rtt"` // by surrogate name
}

// PickConfig configures a Picker.
type PickConfig struct {
	Surrogates []Surrogate
	Locations  []Location
	// Slack: surrogates whose RTT from the client is within Slack of the
	// nearest one are candidates for the content hash; 0 means 2 ms.
	Slack time.Duration
	// LoadFactor bounds a candidate's load: a surrogate already serving more
	// than LoadFactor times the candidates' mean load (+1) is skipped
	// (consistent hashing with bounded loads); 0 means 1.25.
	LoadFactor float64
	// Triangle, by client prefix and surrogate name, says whether a
	// handed-off answer should go surrogate -> client (surrogate-side
	// placement) rather than through the router (Picker.Triangle).
	Triangle map[netip.Prefix]map[string]bool
}

// Picker chooses a surrogate for a client and a URL: the candidates are the
// surrogates near the client (within Slack of the nearest, by the longest
// matching location prefix; every surrogate when no prefix matches), the URL
// is hashed onto them by rendezvous hashing (each URL has a stable order of
// candidates, so a surrogate's cache sees the same URLs), and a candidate
// over its load bound is passed over for the URL's next one. Safe for
// concurrent use.
type Picker struct {
	cfg   PickConfig
	loads []atomic.Int64 // sessions in progress per surrogate
}

// NewPicker validates cfg and returns a Picker.
func NewPicker(cfg PickConfig) (*Picker, error) {
	if len(cfg.Surrogates) == 0 {
		return nil, errors.New("router: no surrogates")
	}
	names := map[string]bool{}
	for _, s := range cfg.Surrogates {
		if s.Name == "" || s.Addr == "" {
			return nil, fmt.Errorf("router: surrogate %+v needs a name and an address", s)
		}
		if names[s.Name] {
			return nil, fmt.Errorf("router: surrogate %q listed twice", s.Name)
		}
		names[s.Name] = true
	}
	for _, l := range cfg.Locations {
		if !l.Prefix.IsValid() {
			return nil, fmt.Errorf("router: location without a valid prefix")
		}
		for n, d := range l.RTT {
			if !names[n] {
				return nil, fmt.Errorf("router: location %v names unknown surrogate %q", l.Prefix, n)
			}
			if d < 0 {
				return nil, fmt.Errorf("router: location %v: negative RTT to %q", l.Prefix, n)
			}
		}
	}
	if cfg.Slack == 0 {
		cfg.Slack = 2 * time.Millisecond
	}
	if cfg.LoadFactor == 0 {
		cfg.LoadFactor = 1.25
	}
	if cfg.LoadFactor < 1 {
		return nil, fmt.Errorf("router: load factor %v below 1", cfg.LoadFactor)
	}
	// Longest prefixes first.
	locs := append([]Location(nil), cfg.Locations...)
	sort.SliceStable(locs, func(i, j int) bool { return locs[i].Prefix.Bits() > locs[j].Prefix.Bits() })
	cfg.Locations = locs
	return &Picker{cfg: cfg, loads: make([]atomic.Int64, len(cfg.Surrogates))}, nil
}

// Surrogates returns the configured surrogates.
func (p *Picker) Surrogates() []Surrogate { return p.cfg.Surrogates }

// candidates returns the indexes of the surrogates near client.
func (p *Picker) candidates(client netip.Addr) []int {
	client = client.Unmap()
	for _, l := range p.cfg.Locations {
		if !l.Prefix.Contains(client) {
			continue
		}
		best := time.Duration(math.MaxInt64)
		for _, s := range p.cfg.Surrogates {
			if d, ok := l.RTT[s.Name]; ok && d < best {
				best = d
			}
		}
		var out []int
		for i, s := range p.cfg.Surrogates {
			if d, ok := l.RTT[s.Name]; ok && d <= best+p.cfg.Slack {
				out = append(out, i)
			}
		}
		if len(out) > 0 {
			sort.SliceStable(out, func(a, b int) bool {
				return l.RTT[p.cfg.Surrogates[out[a]].Name] < l.RTT[p.cfg.Surrogates[out[b]].Name]
			})
			return out
		}
	}
	out := make([]int, len(p.cfg.Surrogates))
	for i := range out {
		out[i] = i
	}
	return out
}

// Nearest returns the surrogate with the lowest RTT from client (the first
// configured one when no location matches), for the DNS responder.
func (p *Picker) Nearest(client netip.Addr) Surrogate {
	return p.cfg.Surrogates[p.candidates(client)[0]]
}

// Pick returns the index of the surrogate for client and url. The caller
// must call Done(i) when the session ends.
func (p *Picker) Pick(client netip.Addr, url string) int {
	cand := p.candidates(client)
	// Rendezvous order for the URL.
	type scored struct {
		i     int
		score uint64
	}
	order := make([]scored, len(cand))
	for k, i := range cand {
		h := fnv.New64a()
		h.Write([]byte(p.cfg.Surrogates[i].Name))
		h.Write([]byte{0})
		h.Write([]byte(url))
		order[k] = scored{i, mix(h.Sum64())}
	}
	sort.Slice(order, func(a, b int) bool { return order[a].score > order[b].score })
	var total int64
	for _, i := range cand {
		total += p.loads[i].Load()
	}
	bound := p.cfg.LoadFactor*float64(total)/float64(len(cand)) + 1
	pick := order[0].i
	for _, o := range order {
		if float64(p.loads[o.i].Load()) < bound {
			pick = o.i
			break
		}
	}
	p.loads[pick].Add(1)
	return pick
}

// Done ends a session counted by Pick.
func (p *Picker) Done(i int) { p.loads[i].Add(-1) }

// Load returns the sessions in progress at surrogate i.
func (p *Picker) Load(i int) int64 { return p.loads[i].Load() }

// mix is a 64-bit finalizer (splitmix64) spreading FNV's low-entropy bits.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Triangle reports whether the answer of surrogate (its address) to client
// should be translated at the surrogate's host (by the longest Triangle
// prefix containing client; true when none says).
func (p *Picker) Triangle(client, surrogate netip.Addr) bool {
	best := -1
	var m map[string]bool
	for pre, v := range p.cfg.Triangle {
		if pre.Contains(client.Unmap()) && pre.Bits() > best {
			best, m = pre.Bits(), v
		}
	}
	if m == nil {
		return true
	}
	for _, s := range p.cfg.Surrogates {
		if ap, err := netip.ParseAddrPort(s.Addr); err == nil && ap.Addr() == surrogate.Unmap() {
			if v, ok := m[s.Name]; ok {
				return v
			}
		}
	}
	return true
}
