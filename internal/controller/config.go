package controller

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/onpath"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/store"
)

// DefaultSizes are the transfer sizes (bytes) tables carry a chain for:
// 14 KB (one initial window), 50 KB, 100 KB, 450 KB, 1 MB, 5 MB and 15 MB.
// Sizes in the same slow-start rounds class share one entry (with the
// default model 50 KB and 100 KB both need 3 rounds).
var DefaultSizes = []int64{14_000, 50_000, 100_000, 450_000, 1_000_000, 5_000_000, 15_000_000}

// DefaultMaxProxies is the default bound on the intermediate proxies of a
// chain: each proxy costs CPU and is one more point of failure, and with
// only near pairs measured an unbounded planner chains a dozen of them.
const DefaultMaxProxies = 4

// Config configures a Controller.
type Config struct {
	Store store.Store
	// Period between two computations when nothing changes; default 5 min.
	Period time.Duration
	// Debounce is the shortest time between two computations caused by
	// changes: a change after a quiet Debounce is computed at once, the
	// changes that follow within Debounce of it are coalesced into one
	// computation Debounce after it; default 1 s.
	Debounce time.Duration
	Sizes    []int64        // default DefaultSizes
	Model    pathcomp.Model // slow-start model
	// MaxProxies bounds the intermediate proxies of every chain: 0 means
	// DefaultMaxProxies, a negative value unlimited; at most
	// pathcomp.MaxProxiesLimit.
	MaxProxies int
	Topology   Topology // InP -> LoP mapping and egress destinations
	Targets    TargetPolicy
	// Threshold for a significant RTT change: more than Rel of the old value
	// and more than AbsMS; defaults 0.10 and 2 ms.
	Rel   float64
	AbsMS float64
	// KeyRotation is the age after which the leader rotates the hop HMAC
	// key; default 24 h; negative disables rotation.
	KeyRotation time.Duration
	// KeySwitchAfter bounds the first phase of a rotation: the new key is
	// published as accept-only and becomes the signing key once every LoP
	// polled a table that has it, or KeySwitchAfter after a table with it
	// was first served (not merely stored: a slow or failed computation
	// does not shorten it), whichever comes first; default 2 min (at most
	// KeyRotation/2). A proxy that takes longer to fetch a table may
	// refuse, or see refused, headers signed with the new key.
	KeySwitchAfter time.Duration
	// LightBound refuses (and counts) RTT samples below the speed of light
	// in fibre (2/3 c) between the two FEPs' registered coordinates. The
	// controller command turns it on; tests on loopback leave it off.
	LightBound bool
	// Members checks the addresses FEPs register (hop_addr, probe_addr),
	// which every other FEP will connect to.
	Members MemberPolicy
	// DrainTimeout bounds the drain of a deleted FEP (DeleteFEP): the
	// leader first publishes tables whose chains avoid the FEP while it
	// stays a member, waits until every LoP polling it holds them (at most
	// DrainTimeout, default 10 s), then DrainGrace (default 2 s: hop
	// set-ups begun on older tables finish), and only then revokes its
	// certificate and drops it from the members. Negative: no drain (a
	// deletion takes effect at once). A follower deletes at once.
	DrainTimeout time.Duration
	DrainGrace   time.Duration
	// ReportRate and ReportBurst limit the reports of each FEP (a token
	// bucket); defaults 5/s and 20. A report over the limit gets 429.
	ReportRate  float64
	ReportBurst int
	// InitialKeys seeds the store's hop keys when it has none (the key set
	// `mosto controller init` wrote); nil makes a fresh key.
	InitialKeys *store.Keys
	// OnPath declares the paths through on-path relays (tproxy entries)
	// whose interception the controller decides (docs/tts.md); none:
	// the relays keep their own scope.
	OnPath  onpath.Config
	Log     *slog.Logger
	Metrics *metrics.Registry // nil: metrics are not registered
	Now     func() time.Time
}

// MemberPolicy says which member addresses the controller accepts. hop_addr
// is always unique among the FEPs. With Enforce, both addresses must be IP
// literals (no name another FEP would resolve), outside the special ranges
// (loopback, private, link-local, CGNAT, multicast, unspecified, ...)
// unless within Allow, and a FEP registering itself (or joining) must
// register the hop address it connects from, unless within Allow.
type MemberPolicy struct {
	Enforce bool
	Allow   []netip.Prefix
}

// Relay returns the policy proxies apply to member dials (api.Table's
// member_allow, the relay's destination-policy syntax): nil without
// Enforce; else any public address ("*") and the Allow prefixes.
func (p MemberPolicy) Relay() []string {
	if !p.Enforce {
		return nil
	}
	out := []string{"*"}
	for _, n := range p.Allow {
		out = append(out, n.String())
	}
	return out
}

func (p MemberPolicy) allowed(ip netip.Addr) bool {
	for _, n := range p.Allow {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// special reports whether ip is in a range no public FEP address is in.
func special(ip netip.Addr) bool {
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsMulticast() || ip.IsUnspecified() || ip.IsInterfaceLocalMulticast() {
		return true
	}
	for _, p := range specialNets {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

var specialNets = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),  // CGNAT
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, broadcast
	netip.MustParsePrefix("169.254.0.0/16"), // link local (also IMDS)
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
}

// check returns why f's addresses are refused, or nil. src is the address
// f registers from (ok=false: the admin or a test, no check).
func (p MemberPolicy) check(f api.FEP, src netip.Addr, fromFEP bool) error {
	if !p.Enforce {
		return nil
	}
	for _, a := range []struct{ name, addr string }{{"hop_addr", f.HopAddr}, {"probe_addr", f.ProbeAddr}} {
		ap, err := netip.ParseAddrPort(a.addr)
		if err != nil {
			return fmt.Errorf("fep %s %s %q: want an IP address and port (member addresses are not names)", f.ID, a.name, a.addr)
		}
		ip := ap.Addr().Unmap()
		if special(ip) && !p.allowed(ip) {
			return fmt.Errorf("fep %s %s %s: a special-purpose address (allow its range on the controller to use it)", f.ID, a.name, ip)
		}
		if a.name == "hop_addr" && fromFEP && ip != src.Unmap() && !p.allowed(ip) {
			return fmt.Errorf("fep %s hop_addr %s: not the address %s it registers from (allow its range on the controller if it differs)", f.ID, ip, src)
		}
	}
	return nil
}

func (c Config) withDefaults() (Config, error) {
	if c.Store == nil {
		return c, errors.New("controller: no store")
	}
	if c.Period <= 0 {
		c.Period = 5 * time.Minute
	}
	if c.Debounce <= 0 {
		c.Debounce = time.Second
	}
	if len(c.Sizes) == 0 {
		c.Sizes = DefaultSizes
	}
	switch {
	case c.MaxProxies == 0:
		c.MaxProxies = DefaultMaxProxies
	case c.MaxProxies > pathcomp.MaxProxiesLimit:
		return c, fmt.Errorf("controller: max proxies %d: want at most %d (or negative: unlimited)", c.MaxProxies, pathcomp.MaxProxiesLimit)
	}
	for _, s := range c.Sizes {
		if s <= 0 {
			return c, fmt.Errorf("controller: size %d: want > 0", s)
		}
	}
	if c.Rel <= 0 {
		c.Rel = 0.10
	}
	if c.AbsMS <= 0 {
		c.AbsMS = 2
	}
	if c.KeyRotation == 0 {
		c.KeyRotation = 24 * time.Hour
	}
	if c.ReportRate <= 0 {
		c.ReportRate = 5
	}
	if c.ReportBurst <= 0 {
		c.ReportBurst = 20
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.DrainGrace <= 0 {
		c.DrainGrace = 2 * time.Second
	}
	if c.KeySwitchAfter <= 0 {
		c.KeySwitchAfter = 2 * time.Minute
		if c.KeyRotation > 0 {
			c.KeySwitchAfter = min(c.KeySwitchAfter, c.KeyRotation/2)
		}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Targets = c.Targets.withDefaults()
	return c, nil
}

// Topology is the static part of the overlay's configuration (the
// --lop-map file): which FEPs act as LoPs and which InP forwards to which
// LoP, and the destination prefixes whose egress FEP goes into tables.
//
// Every FEP is its own LoP unless LoPs is set; then each FEP not in LoPs
// forwards to the closest LoP (measured RTT, else distance) unless InP names
// its LoP explicitly.
type Topology struct {
	LoPs   []string          `yaml:"lops" json:"lops,omitempty"`
	InP    map[string]string `yaml:"inp" json:"inp,omitempty"`
	Egress []Destination     `yaml:"egress" json:"egress,omitempty"`
}

// Destination is a destination prefix and where it is. With an id and a
// probe address (host:port of a TCP listener there, e.g. an origin), the
// FEPs nearest to it measure their RTT to it and its EgP is the FEP with
// the lowest measured RTT; otherwise the FEP nearest to its coordinates.
type Destination struct {
	ID        string  `yaml:"id" json:"id,omitempty"`
	Prefix    string  `yaml:"prefix" json:"prefix"`
	Lat       float64 `yaml:"lat" json:"lat"`
	Lon       float64 `yaml:"lon" json:"lon"`
	ProbeAddr string  `yaml:"probe_addr" json:"probe_addr,omitempty"`
}

func (d Destination) api() api.Destination {
	return api.Destination{ID: d.ID, Prefix: d.Prefix, Lat: d.Lat, Lon: d.Lon, ProbeAddr: d.ProbeAddr}
}

// ParseTopology reads a Topology from YAML (or JSON) and checks it.
func ParseTopology(r io.Reader) (Topology, error) {
	var t Topology
	b, err := io.ReadAll(io.LimitReader(r, 16<<20))
	if err != nil {
		return t, fmt.Errorf("read topology: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&t); err != nil && !errors.Is(err, io.EOF) {
		return Topology{}, fmt.Errorf("decode topology: %w", err)
	}
	if err := t.Validate(); err != nil {
		return Topology{}, err
	}
	return t, nil
}

// Validate checks ids, prefixes and coordinates.
func (t Topology) Validate() error {
	seen := map[string]bool{}
	for _, l := range t.LoPs {
		if err := api.ValidateID(l); err != nil {
			return fmt.Errorf("topology lops: %w", err)
		}
		if seen[l] {
			return fmt.Errorf("topology lops: %q listed twice", l)
		}
		seen[l] = true
	}
	for inp, lop := range t.InP {
		if err := api.ValidateID(inp); err != nil {
			return fmt.Errorf("topology inp: %w", err)
		}
		if err := api.ValidateID(lop); err != nil {
			return fmt.Errorf("topology inp %s: lop: %w", inp, err)
		}
		if len(t.LoPs) > 0 && !seen[lop] {
			return fmt.Errorf("topology inp %s: %q is not in lops", inp, lop)
		}
	}
	ids := map[string]bool{}
	for i, d := range t.Egress {
		if _, err := netip.ParsePrefix(d.Prefix); err != nil {
			return fmt.Errorf("topology egress %d: %w", i, err)
		}
		if math.IsNaN(d.Lat) || d.Lat < -90 || d.Lat > 90 || math.IsNaN(d.Lon) || d.Lon < -180 || d.Lon > 180 {
			return fmt.Errorf("topology egress %s: coordinates %v,%v out of range", d.Prefix, d.Lat, d.Lon)
		}
		if d.ID == "" {
			if d.ProbeAddr != "" {
				return fmt.Errorf("topology egress %s: probe_addr needs an id", d.Prefix)
			}
			continue
		}
		if err := d.api().Validate(); err != nil {
			return fmt.Errorf("topology egress: %w", err)
		}
		if ids[d.ID] {
			return fmt.Errorf("topology egress: id %q listed twice", d.ID)
		}
		ids[d.ID] = true
	}
	return nil
}
