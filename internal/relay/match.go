package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// matcher is one destination pattern of an allowlist or egress route.
type matcher struct {
	kind   matchKind
	prefix netip.Prefix // kindPrefix
	name   string       // kindName: exact host; kindSuffix: "example.com" for "*.example.com"
	port   uint16       // 0: any port
}

type matchKind uint8

const (
	kindAny    matchKind = iota // "*"
	kindPrefix                  // CIDR or single address
	kindName                    // host name
	kindSuffix                  // *.domain
)

// parseMatcher parses "10.0.0.0/8", "192.0.2.7", "::1", "example.com",
// "*.example.com", "*", each optionally followed by ":port" (IPv6 in brackets).
func parseMatcher(s string) (matcher, error) {
	var m matcher
	host := strings.TrimSpace(s)
	if host == "" {
		return m, errors.New("empty destination pattern")
	}
	if h, p, err := net.SplitHostPort(host); err == nil {
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil || port == 0 {
			return m, fmt.Errorf("pattern %q: bad port %q", s, p)
		}
		host, m.port = h, uint16(port)
	}
	switch {
	case host == "*":
		m.kind = kindAny
	case strings.Contains(host, "/"):
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return m, fmt.Errorf("pattern %q: %w", s, err)
		}
		m.kind, m.prefix = kindPrefix, netip.PrefixFrom(pfx.Addr().Unmap(), unmappedBits(pfx)).Masked()
	default:
		if ip, err := netip.ParseAddr(host); err == nil {
			ip = ip.Unmap()
			m.kind, m.prefix = kindPrefix, netip.PrefixFrom(ip, ip.BitLen())
			break
		}
		name := normalizeHost(host)
		m.kind = kindName
		if rest, ok := strings.CutPrefix(name, "*."); ok {
			m.kind, name = kindSuffix, rest
		}
		if !validHostName(name) {
			return m, fmt.Errorf("pattern %q: not a CIDR, address or host name", s)
		}
		m.name = name
	}
	return m, nil
}

func unmappedBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return max(p.Bits()-96, 0)
	}
	return p.Bits()
}

func normalizeHost(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// matches reports whether the destination (host as requested, ip if known,
// port) matches. explicit reports that the pattern names the destination
// itself (not "*"), which is what private addresses require.
func (m matcher) matches(host string, ip netip.Addr, port uint16) (ok, explicit bool) {
	if m.port != 0 && m.port != port {
		return false, false
	}
	switch m.kind {
	case kindAny:
		return true, false
	case kindPrefix:
		return ip.IsValid() && m.prefix.Contains(ip.Unmap()), true
	case kindName:
		return host == m.name, true
	case kindSuffix:
		return strings.HasSuffix(host, "."+m.name), true
	}
	return false, false
}

func parseMatchers(list []string) ([]matcher, error) {
	ms := make([]matcher, 0, len(list))
	for _, s := range list {
		m, err := parseMatcher(s)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// Target is a destination as requested: a host name or address, and a port.
type Target struct {
	Host string // normalized: lower case, no trailing dot, no brackets
	Port uint16
}

// ParseTarget parses "host:port".
func ParseTarget(s string) (Target, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return Target{}, fmt.Errorf("target %q: %w", s, err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil || port == 0 {
		return Target{}, fmt.Errorf("target %q: bad port", s)
	}
	h = normalizeHost(h)
	if ip, err := netip.ParseAddr(h); err == nil {
		if ip.Zone() != "" {
			return Target{}, fmt.Errorf("target %q: zoned address", s)
		}
		h = ip.Unmap().String()
	} else if !validHostName(h) {
		return Target{}, fmt.Errorf("target %q: bad host", s)
	}
	return Target{Host: h, Port: uint16(port)}, nil
}

func (t Target) String() string {
	return net.JoinHostPort(t.Host, strconv.Itoa(int(t.Port)))
}

// ip returns the target's address when the host is a literal.
func (t Target) ip() netip.Addr {
	ip, err := netip.ParseAddr(t.Host)
	if err != nil {
		return netip.Addr{}
	}
	return ip
}

// listAllows checks a target against an entry allowlist without resolving
// names: address literals match CIDRs, names match name patterns. An empty
// list allows everything.
func listAllows(ms []matcher, t Target) bool {
	if len(ms) == 0 {
		return true
	}
	ip := t.ip()
	for _, m := range ms {
		if ok, _ := m.matches(t.Host, ip, t.Port); ok {
			return true
		}
	}
	return false
}

// egressMap picks the EgP of a destination.
type egressMap struct {
	def    string
	routes []egressRoute
}

type egressRoute struct {
	m   matcher
	fep string
}

func newEgressMap(self string, c EgressConfig) (*egressMap, error) {
	em := &egressMap{def: c.Default}
	if em.def == "" {
		em.def = self
	}
	for i, r := range c.Routes {
		m, err := parseMatcher(r.Match)
		if err != nil {
			return nil, fmt.Errorf("egress.routes[%d]: %w", i, err)
		}
		em.routes = append(em.routes, egressRoute{m, r.FEP})
	}
	return em, nil
}

// lookup returns the FEP id of the first route matching t, else the default.
func (em *egressMap) lookup(t Target) string {
	ip := t.ip()
	for _, r := range em.routes {
		if ok, _ := r.m.matches(t.Host, ip, t.Port); ok {
			return r.fep
		}
	}
	return em.def
}

// policy is the EgP's destination policy; it never makes mosto an open
// relay to private networks.
type policy struct {
	allow []matcher
}

// resolver looks up host addresses; *net.Resolver satisfies it.
type resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var errPolicy = errors.New("relay: destination not allowed by policy")

// resolve returns the address to dial for t, or errPolicy when no address
// of t is allowed. Dialing the checked address (not the name again) keeps a
// DNS answer from changing between check and connect.
func (p *policy) resolve(ctx context.Context, r resolver, t Target) (netip.AddrPort, error) {
	var ips []netip.Addr
	if ip := t.ip(); ip.IsValid() {
		ips = []netip.Addr{ip}
	} else {
		// Names no pattern could match are refused before any DNS query.
		if !p.nameMayMatch(t) {
			return netip.AddrPort{}, errPolicy
		}
		var err error
		ips, err = r.LookupNetIP(ctx, "ip", t.Host)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", t.Host, err)
		}
	}
	for _, ip := range ips {
		ip = ip.Unmap()
		if p.allowsIP(t, ip) {
			return netip.AddrPortFrom(ip, t.Port), nil
		}
	}
	return netip.AddrPort{}, errPolicy
}

func (p *policy) nameMayMatch(t Target) bool {
	if len(p.allow) == 0 {
		return true
	}
	for _, m := range p.allow {
		if m.port != 0 && m.port != t.Port {
			continue
		}
		if m.kind == kindAny || m.kind == kindPrefix {
			return true
		}
		if ok, _ := m.matches(t.Host, netip.Addr{}, t.Port); ok {
			return true
		}
	}
	return false
}

func (p *policy) allowsIP(t Target, ip netip.Addr) bool {
	special := isSpecial(ip)
	if len(p.allow) == 0 {
		return !special
	}
	for _, m := range p.allow {
		ok, explicit := m.matches(t.Host, ip, t.Port)
		if ok && (explicit || !special) {
			return true
		}
	}
	return false
}

var specialPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// isSpecial reports addresses an EgP must not reach unless explicitly
// allowed: private, loopback, link-local, multicast, unspecified, shared
// and reserved ranges.
func isSpecial(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() ||
		ip.IsUnspecified() || ip.IsInterfaceLocalMulticast() || ip.IsLinkLocalMulticast() {
		return true
	}
	for _, p := range specialPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
