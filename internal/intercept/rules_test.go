package intercept

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts("80, 443,8000-8100")
	if err != nil {
		t.Fatal(err)
	}
	if want := []PortRange{{80, 80}, {443, 443}, {8000, 8100}}; !slices.Equal(got, want) {
		t.Errorf("ParsePorts = %v; want %v", got, want)
	}
	for _, bad := range []string{"", "0", "65536", "a", "80,", "90-80", "1-2-3", "-5"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) = nil error; want one", bad)
		}
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes([]string{"10.77.0.1", "10.1.2.3/8"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.77.0.1/32"), netip.MustParsePrefix("10.0.0.0/8")}
	if !slices.Equal(got, want) {
		t.Errorf("ParsePrefixes = %v; want %v", got, want)
	}
	for _, bad := range []string{"::1", "10.0.0.0/33", "x", ""} {
		if _, err := ParsePrefixes([]string{bad}); err == nil {
			t.Errorf("ParsePrefixes(%q) = nil error; want one", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no name", Config{Port: 1}, "bad name"},
		{"bad name", Config{Name: "a;b", Port: 1}, "bad name"},
		{"no port", Config{Name: "a"}, "port is 0"},
		{"bad iface", Config{Name: "a", Port: 1, InIface: `x" accept`}, "interface"},
		{"reserved table", Config{Name: "a", Port: 1, RouteTable: 254}, "reserved"},
		{"v6 prefix", Config{Name: "a", Port: 1, Dests: []netip.Prefix{netip.MustParsePrefix("::/0")}}, "IPv4"},
		{"bad range", Config{Name: "a", Port: 1, Ports: []PortRange{{9, 8}}}, "port range"},
		{"legs' table reserved", Config{Name: "a", Port: 1, RouteTable: 252}, "route table 253"},
		{"initcwnd", Config{Name: "a", Port: 1, InitCwnd: -1}, "initcwnd"},
		{"initcwnd too large", Config{Name: "a", Port: 1, InitCwnd: 1 << 20}, "initcwnd"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestRuleset(t *testing.T) {
	cfg := Config{
		Name: "t1", Port: 9999, InIface: "eth0",
		Sources: []netip.Prefix{netip.MustParsePrefix("10.77.0.1/32")},
		Dests:   []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")},
		Ports:   []PortRange{{80, 80}, {8000, 8100}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rs := cfg.Ruleset(42)
	for _, want := range []string{
		"add table ip mosto_tp_t1\ndelete table ip mosto_tp_t1\n", // replaces leftovers atomically
		"pid=42",
		"socket transparent 1 meta mark set 0x4d53 accept",
		`iifname "eth0" ip saddr { 10.77.0.1 } ip daddr { 10.77.0.0/24 } tcp dport { 80, 8000-8100 } tcp flags & (syn | ack) == syn tproxy to :9999 meta mark set 0x4d53 accept`,
	} {
		if !strings.Contains(rs, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "reject") {
		t.Errorf("fail-open ruleset rejects:\n%s", rs)
	}
	cfg.FailClosed = true
	if rs := cfg.Ruleset(42); !strings.Contains(rs, "tcp dport { 80, 8000-8100 } tcp flags & (syn | ack) == syn reject with tcp reset") {
		t.Errorf("fail-closed ruleset lacks the reject rule:\n%s", rs)
	}
	if strings.Contains(rs, "sack-perm") || strings.Contains(rs, "chain out") {
		t.Errorf("ruleset without NoSACK strips SACK:\n%s", rs)
	}
	cfg.NoSACK = true
	rs = cfg.Ruleset(42)
	for _, want := range []string{
		// Only a SYN that the listener takes loses SACK-permitted.
		"tcp flags & (syn | ack) == syn tproxy to :9999 meta mark set 0x4d53 reset tcp option sack-perm accept",
		// The relay's own SYN upstream (no input interface in output).
		"type filter hook output priority mangle; policy accept;\n\t\tmeta l4proto tcp ip saddr { 10.77.0.1 } ip daddr { 10.77.0.0/24 } tcp dport { 80, 8000-8100 } tcp flags & (syn | ack) == syn fib saddr type != local reset tcp option sack-perm",
	} {
		if !strings.Contains(rs, want) {
			t.Errorf("NoSACK ruleset lacks %q:\n%s", want, rs)
		}
	}
}

func TestRulesetManaged(t *testing.T) {
	cfg := Config{Name: "t2", Port: 9999, Ports: []PortRange{{80, 80}}, Managed: true}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Managed without scopes: no new flow is steered, the rule of the
	// established flows stays; the static Ports are not used.
	rs := cfg.Ruleset(1)
	if !strings.Contains(rs, "socket transparent 1 meta mark set 0x4d53 accept") || strings.Contains(rs, "tproxy to") {
		t.Errorf("managed ruleset without scopes:\n%s", rs)
	}
	cfg.Scopes = []Scope{
		{Dests: []netip.Prefix{netip.MustParsePrefix("10.77.0.3/32")}, Ports: []PortRange{{8080, 8080}}},
		{Sources: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")}},
	}
	rs = cfg.Ruleset(1)
	for _, want := range []string{
		"ip daddr { 10.77.0.3 } tcp dport { 8080 } tcp flags & (syn | ack) == syn tproxy to :9999",
		"ip saddr { 10.77.0.0/24 } tcp flags & (syn | ack) == syn tproxy to :9999",
	} {
		if !strings.Contains(rs, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "dport { 80 }") {
		t.Errorf("managed ruleset uses the static ports:\n%s", rs)
	}
	cfg.Scopes = []Scope{{Ports: []PortRange{{9000, 10000}}}}
	if err := cfg.Validate(); err == nil {
		t.Error("a scope including the listener's port passed validation")
	}
}

func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{"80", "1-65535", "80,443", " 9 - 10 ", "0", "a-b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rs, err := ParsePorts(s)
		if err != nil {
			return
		}
		for _, r := range rs {
			if r.Lo == 0 || r.Hi < r.Lo {
				t.Fatalf("ParsePorts(%q) gave bad range %v", s, r)
			}
			again, err := ParsePorts(r.String())
			if err != nil || len(again) != 1 || again[0] != r {
				t.Fatalf("range %v does not round-trip: %v, %v", r, again, err)
			}
		}
	})
}

func FuzzParsePrefixes(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "10.0.0.0/8", "::1", "1.2.3.4/33", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParsePrefixes([]string{s})
		if err != nil {
			return
		}
		if len(ps) != 1 || !ps[0].Addr().Is4() || ps[0] != ps[0].Masked() {
			t.Fatalf("ParsePrefixes(%q) = %v", s, ps)
		}
		cfg := Config{Name: "f", Port: 1, Sources: ps, Dests: ps}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("prefix %v from ParsePrefixes fails Validate: %v", ps[0], err)
		}
	})
}

func TestLegRoutes(t *testing.T) {
	show := "default via 10.0.0.1 dev eth0 proto dhcp metric 100 linkdown\n" +
		"10.77.0.0/16 dev tun0 scope link src 10.77.0.2 initcwnd lock 20\n" +
		"10.9.0.0/16 proto static metric 5\n" +
		"\tnexthop via 10.0.0.2 dev eth0 weight 1\n" +
		"\tnexthop via 10.0.0.3 dev eth1 weight 1 dead\n"
	want := "route replace table 7 default via 10.0.0.1 dev eth0 proto dhcp metric 100 initcwnd 500\n" +
		"route replace table 7 10.77.0.0/16 dev tun0 scope link src 10.77.0.2 initcwnd 500\n" +
		"route replace table 7 10.9.0.0/16 proto static metric 5 initcwnd 500 nexthop via 10.0.0.2 dev eth0 weight 1 nexthop via 10.0.0.3 dev eth1 weight 1\n"
	if got := legRoutes(show, "7", 500); got != want {
		t.Errorf("legRoutes =\n%s\nwant\n%s", got, want)
	}
	if got := legRoutes("", "7", 500); got != "" {
		t.Errorf("legRoutes of no route = %q; want empty", got)
	}
	c := Config{Name: "a", Port: 1}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if m := c.LegMark(); m != 0 {
		t.Errorf("LegMark without InitCwnd = %#x; want 0", m)
	}
	c.InitCwnd = 100
	if m := c.LegMark(); m != DefaultMark+1 {
		t.Errorf("LegMark = %#x; want %#x", m, DefaultMark+1)
	}
}
