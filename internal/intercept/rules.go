package intercept

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// TablePrefix starts the name of every nftables table this package makes.
const TablePrefix = "mosto_tp_"

// Defaults of Config.
const (
	DefaultMark       = 0x4d53 // "MS"
	DefaultRouteTable = 19779
)

// Config says which flows to intercept and where to deliver them.
type Config struct {
	// Name tells interceptions apart (table mosto_tp_<Name>): letters,
	// digits and '_', at most 32. A restart with the same name replaces
	// the rules a crashed run left.
	Name string
	// Port is the local port of the transparent listener.
	Port uint16
	// Scope of the interception; an empty list matches everything.
	Sources []netip.Prefix
	Dests   []netip.Prefix
	Ports   []PortRange // destination ports
	// InIface restricts interception to packets that arrive on this
	// interface; empty: any.
	InIface string
	// FailClosed refuses (TCP reset) in-scope SYNs while no listener is
	// there, instead of forwarding them untouched.
	FailClosed bool
	// NoSACK makes both legs of every intercepted flow run without SACK:
	// the rules strip the SACK-permitted option from the client's SYN (as
	// it is steered to the listener) and from the relay's own SYN towards
	// the server, so each leg's sender detects loss by duplicate ACKs
	// with a reordering threshold that adapts (up to tcp_max_reordering),
	// instead of RACK's time window. It pays on segments with per-packet
	// jitter as large as their delay (docs/tts.md, row 6) and costs on
	// lossy ones (one loss recovered per round trip). Flows out of scope,
	// and in-scope flows that pass untouched, keep their options.
	NoSACK bool
	// InitCwnd, when > 0, is the initial congestion window (segments) of
	// the relay's own legs of intercepted flows: the relay marks those
	// sockets (LegMark), and a policy rule sends their packets to a route
	// table (RouteTable+1) that copies the main table's routes with
	// `initcwnd InitCwnd`. A leg that starts at or above its BDP never
	// leaves slow start below it (CUBIC's HyStart sets ssthresh to the
	// cwnd it exits at), so a relay fed by a slower or equal upstream
	// leg forwards at the rate its data arrives (docs/tts.md, rows 4-5).
	// Forwarded flows and the relay's other sockets keep the kernel's
	// (10). 0: off.
	InitCwnd int
	// Mark and RouteTable select the policy route that delivers marked
	// packets locally; 0 means DefaultMark / DefaultRouteTable.
	Mark       uint32
	RouteTable int
	// NetNS, when set, is the named network namespace (ip netns) to
	// install into; empty: the calling process's.
	NetNS string
	// Managed replaces Sources, Dests and Ports by Scopes (one rule
	// each), as a controller decides them (docs/tts.md); Managed with
	// no scope intercepts no new flow, while the flows already
	// intercepted keep their rule.
	Managed bool
	Scopes  []Scope
}

// Scope is one set of flows to intercept: source prefixes, destination
// prefixes and destination ports; an empty list matches everything.
type Scope struct {
	Sources []netip.Prefix
	Dests   []netip.Prefix
	Ports   []PortRange
}

// scopes returns the scopes the rules match.
func (c *Config) scopes() []Scope {
	if c.Managed {
		return c.Scopes
	}
	return []Scope{{Sources: c.Sources, Dests: c.Dests, Ports: c.Ports}}
}

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Lo, Hi uint16 }

func (r PortRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(int(r.Lo))
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// ParsePorts parses "80,443,8000-8100".
func ParsePorts(s string) ([]PortRange, error) {
	var out []PortRange
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, fmt.Errorf("intercept: ports %q: empty item", s)
		}
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := parsePort(lo)
		if err != nil {
			return nil, fmt.Errorf("intercept: ports %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = parsePort(hi); err != nil {
				return nil, fmt.Errorf("intercept: ports %q: %w", s, err)
			}
			if b < a {
				return nil, fmt.Errorf("intercept: ports %q: range %s is reversed", s, f)
			}
		}
		out = append(out, PortRange{a, b})
	}
	return out, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("bad port %q (1-65535)", s)
	}
	return uint16(n), nil
}

// ParsePrefixes parses addresses or prefixes ("10.77.0.1", "10.0.0.0/8").
// Only IPv4 is supported.
func ParsePrefixes(items []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(items))
	for _, it := range items {
		it = strings.TrimSpace(it)
		var p netip.Prefix
		var err error
		if strings.Contains(it, "/") {
			p, err = netip.ParsePrefix(it)
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(it)
			if err == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil {
			return nil, fmt.Errorf("intercept: bad prefix %q: %w", it, err)
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("intercept: prefix %q: only IPv4 is supported", it)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func validIface(s string) bool {
	if len(s) > 15 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Validate checks the config and fills defaults.
func (c *Config) Validate() error {
	if !validName(c.Name) {
		return fmt.Errorf("intercept: bad name %q (letters, digits, '_'; 1-32)", c.Name)
	}
	if c.Port == 0 {
		return errors.New("intercept: port is 0")
	}
	if !validIface(c.InIface) {
		return fmt.Errorf("intercept: bad interface name %q", c.InIface)
	}
	if c.NetNS != "" && !validIface(c.NetNS) && !validName(strings.ReplaceAll(c.NetNS, "-", "_")) {
		return fmt.Errorf("intercept: bad netns name %q", c.NetNS)
	}
	for _, sc := range append(c.Scopes, Scope{Sources: c.Sources, Dests: c.Dests, Ports: c.Ports}) {
		for _, p := range append(append([]netip.Prefix(nil), sc.Sources...), sc.Dests...) {
			if !p.IsValid() || !p.Addr().Is4() {
				return fmt.Errorf("intercept: prefix %v: want IPv4", p)
			}
		}
		for _, r := range sc.Ports {
			if r.Lo == 0 || r.Hi < r.Lo {
				return fmt.Errorf("intercept: bad port range %d-%d", r.Lo, r.Hi)
			}
			if c.Port >= r.Lo && c.Port <= r.Hi {
				return fmt.Errorf("intercept: port range %s includes the listener's own port %d", r, c.Port)
			}
		}
	}
	if c.Mark == 0 {
		c.Mark = DefaultMark
	}
	if c.RouteTable == 0 {
		c.RouteTable = DefaultRouteTable
	}
	for _, t := range []int{c.RouteTable, c.legTable()} {
		if t < 1 || t > 0x7fffffff || t == 253 || t == 254 || t == 255 {
			return fmt.Errorf("intercept: route table %d is reserved or out of range", t)
		}
	}
	if c.Mark == 0xffffffff {
		return errors.New("intercept: mark 0xffffffff leaves no leg mark (mark+1)")
	}
	if c.InitCwnd < 0 || c.InitCwnd > maxInitCwnd {
		return fmt.Errorf("intercept: initcwnd %d is not in [0, %d]", c.InitCwnd, maxInitCwnd)
	}
	return nil
}

// maxInitCwnd bounds Config.InitCwnd (segments).
const maxInitCwnd = 65535

// LegMark is the socket mark (SO_MARK) of the relay's legs of
// intercepted flows when InitCwnd is set (Mark+1), else 0: the relay sets
// it on its transparent listener (the accepted connections inherit it)
// and on its upstream dial. Validate must have succeeded.
func (c *Config) LegMark() uint32 {
	if c.InitCwnd == 0 {
		return 0
	}
	return c.legMark()
}

func (c *Config) legMark() uint32 { return c.Mark + 1 }
func (c *Config) legTable() int   { return c.RouteTable + 1 }

// Table returns the nftables table name (family ip).
func (c *Config) Table() string { return TablePrefix + c.Name }

// Ruleset returns the nft script that replaces the interception's table
// atomically (one transaction: create if missing, delete, define).
// Validate must have succeeded.
func (c *Config) Ruleset(pid int) string {
	t := c.Table()
	var b strings.Builder
	fmt.Fprintf(&b, "add table ip %s\ndelete table ip %s\n", t, t)
	fmt.Fprintf(&b, "table ip %s {\n\tcomment \"mosto intercept pid=%d port=%d\"\n", t, pid, c.Port)
	b.WriteString("\tchain pre {\n\t\ttype filter hook prerouting priority mangle; policy accept;\n")
	// Packets of intercepted flows (both legs) go to their transparent
	// socket.
	fmt.Fprintf(&b, "\t\tmeta l4proto tcp socket transparent 1 meta mark set 0x%x accept\n", c.Mark)
	strip := ""
	if c.NoSACK {
		// After tproxy: only a SYN that found the listener loses it.
		strip = " reset tcp option sack-perm"
	}
	for _, sc := range c.scopes() {
		m := c.match(sc, true)
		fmt.Fprintf(&b, "\t\t%s tproxy to :%d meta mark set 0x%x%s accept\n", m, c.Port, c.Mark, strip)
		if c.FailClosed {
			// Reached only when tproxy found no listener.
			fmt.Fprintf(&b, "\t\t%s reject with tcp reset\n", m)
		}
	}
	b.WriteString("\t}\n")
	if c.NoSACK {
		// The relay's upstream SYN: sent from this host with a source
		// that is not one of its addresses (the client's).
		b.WriteString("\tchain out {\n\t\ttype filter hook output priority mangle; policy accept;\n")
		for _, sc := range c.scopes() {
			fmt.Fprintf(&b, "\t\t%s fib saddr type != local reset tcp option sack-perm\n", c.match(sc, false))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// match is the rule match of one scope: only a new flow's SYN is
// steered, so packets of flows that exist without a transparent socket
// here pass untouched. in adds the input interface (not in the output
// hook).
func (c *Config) match(sc Scope, in bool) string {
	var match strings.Builder
	match.WriteString("meta l4proto tcp")
	if in && c.InIface != "" {
		fmt.Fprintf(&match, " iifname %q", c.InIface)
	}
	if len(sc.Sources) > 0 {
		fmt.Fprintf(&match, " ip saddr { %s }", joinPrefixes(sc.Sources))
	}
	if len(sc.Dests) > 0 {
		fmt.Fprintf(&match, " ip daddr { %s }", joinPrefixes(sc.Dests))
	}
	if len(sc.Ports) > 0 {
		parts := make([]string, len(sc.Ports))
		for i, r := range sc.Ports {
			parts[i] = r.String()
		}
		fmt.Fprintf(&match, " tcp dport { %s }", strings.Join(parts, ", "))
	}
	match.WriteString(" tcp flags & (syn | ack) == syn")
	return match.String()
}

func joinPrefixes(ps []netip.Prefix) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		if p.IsSingleIP() {
			parts[i] = p.Addr().String()
		} else {
			parts[i] = p.String()
		}
	}
	return strings.Join(parts, ", ")
}

// legRoutes turns `ip -4 route show` output into an `ip -batch` script
// that replaces each route in table with initcwnd set (multipath next
// hops are continuation lines; state flags the kernel reports but does
// not accept are dropped).
func legRoutes(show, table string, initcwnd int) string {
	var routes []string
	for line := range strings.Lines(show) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if (line[0] == ' ' || line[0] == '\t') && len(routes) > 0 {
			routes[len(routes)-1] += " " + strings.TrimSpace(line)
			continue
		}
		routes = append(routes, strings.TrimSpace(line))
	}
	var b strings.Builder
	for _, r := range routes {
		f := strings.Fields(r)
		keep := f[:0]
		for i := 0; i < len(f); i++ {
			switch f[i] {
			case "linkdown", "dead", "offload", "trap", "rt_offload", "rt_trap", "rt_offload_failed", "pervasive", "notify":
				continue
			case "initcwnd":
				i++ // replaced below
				if i < len(f) && f[i] == "lock" {
					i++
				}
				continue
			}
			keep = append(keep, f[i])
		}
		// Route attributes go before the multipath next hops.
		at := slices.Index(keep, "nexthop")
		if at < 0 {
			at = len(keep)
		}
		keep = slices.Insert(keep, at, "initcwnd", strconv.Itoa(initcwnd))
		fmt.Fprintf(&b, "route replace table %s %s\n", table, strings.Join(keep, " "))
	}
	return b.String()
}
