package relay

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
)

func TestParseMatcher(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want matcher
		ok   bool
	}{
		{"*", matcher{kind: kindAny}, true},
		{"*:443", matcher{kind: kindAny, port: 443}, true},
		{"10.0.0.0/8", matcher{kind: kindPrefix, prefix: netip.MustParsePrefix("10.0.0.0/8")}, true},
		{"10.1.2.3/8", matcher{kind: kindPrefix, prefix: netip.MustParsePrefix("10.0.0.0/8")}, true},
		{"192.0.2.7:80", matcher{kind: kindPrefix, prefix: netip.MustParsePrefix("192.0.2.7/32"), port: 80}, true},
		{"::1", matcher{kind: kindPrefix, prefix: netip.MustParsePrefix("::1/128")}, true},
		{"[2001:db8::]:443", matcher{kind: kindPrefix, prefix: netip.MustParsePrefix("2001:db8::/128"), port: 443}, true},
		{"::ffff:10.0.0.0/104", matcher{kind: kindPrefix, prefix: netip.MustParsePrefix("10.0.0.0/8")}, true},
		{"Example.COM.", matcher{kind: kindName, name: "example.com"}, true},
		{"*.example.com:8443", matcher{kind: kindSuffix, name: "example.com", port: 8443}, true},
		{"", matcher{}, false},
		{"10.0.0.0/33", matcher{}, false},
		{"host:0", matcher{}, false},
		{"host:99999", matcher{}, false},
		{"bad host!", matcher{}, false},
		{"-x.com", matcher{}, false},
		{"*.", matcher{}, false},
	} {
		got, err := parseMatcher(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseMatcher(%q) = %+v, %v; want %+v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"Example.com:80", "example.com:80"},
		{"[::ffff:10.0.0.1]:443", "10.0.0.1:443"},
		{"[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"1.2.3.4:1", "1.2.3.4:1"},
		{"x:0", ""}, {"x", ""}, {"[fe80::1%eth0]:80", ""}, {"a b:80", ""}, {":80", ""},
	} {
		got, err := ParseTarget(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("ParseTarget(%q) = %v; want error", tc.in, got)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("ParseTarget(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestEgressMap(t *testing.T) {
	em, err := newEgressMap("fra", EgressConfig{Routes: []EgressRoute{
		{"203.0.113.0/24", "ams"}, {"*.example.org", "lon"}, {"origin.example.com:443", "ams"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ target, want string }{
		{"203.0.113.9:80", "ams"}, {"203.0.114.9:80", "fra"}, {"www.example.org:80", "lon"},
		{"example.org:80", "fra"}, {"origin.example.com:443", "ams"}, {"origin.example.com:80", "fra"},
	} {
		tg, _ := ParseTarget(tc.target)
		if got := em.lookup(tg); got != tc.want {
			t.Errorf("egress(%s) = %s; want %s", tc.target, got, tc.want)
		}
	}
}

func TestPolicy(t *testing.T) {
	res := fakeResolver{
		"public.test":   {netip.MustParseAddr("93.184.216.34")},
		"internal.test": {netip.MustParseAddr("10.0.0.5")},
		"mixed.test":    {netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("93.184.216.34")},
		"loop.test":     {netip.MustParseAddr("127.0.0.1")},
	}
	for _, tc := range []struct {
		name   string
		allow  []string
		target string
		want   string // address dialed, "" for a refusal
	}{
		{"open public", nil, "93.184.216.34:80", "93.184.216.34:80"},
		{"open public name", nil, "public.test:80", "93.184.216.34:80"},
		{"open private", nil, "10.0.0.5:80", ""},
		{"open loopback", nil, "127.0.0.1:80", ""},
		{"open mapped loopback", nil, "[::ffff:127.0.0.1]:80", ""},
		{"open v6 loopback", nil, "[::1]:80", ""},
		{"open link-local", nil, "169.254.169.254:80", ""},
		{"open cgnat", nil, "100.64.1.1:80", ""},
		{"open name to private", nil, "internal.test:80", ""},
		{"open name to loopback", nil, "loop.test:80", ""},
		{"mixed picks public", nil, "mixed.test:80", "93.184.216.34:80"},
		{"star keeps private out", []string{"*"}, "10.0.0.5:80", ""},
		{"cidr allows private", []string{"10.0.0.0/8"}, "10.0.0.5:80", "10.0.0.5:80"},
		{"cidr allows name to private", []string{"10.0.0.0/8"}, "internal.test:80", "10.0.0.5:80"},
		{"named host allows private", []string{"internal.test"}, "internal.test:80", "10.0.0.5:80"},
		{"list excludes others", []string{"10.0.0.0/8"}, "93.184.216.34:80", ""},
		{"port mismatch", []string{"*:443"}, "93.184.216.34:80", ""},
		{"port match", []string{"*:443"}, "93.184.216.34:443", "93.184.216.34:443"},
		{"suffix", []string{"*.test"}, "public.test:80", "93.184.216.34:80"},
		{"name not matching, no dns", []string{"*.example.org"}, "unknown.test:80", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := parseMatchers(tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			p := policy{allow: ms}
			tg, err := ParseTarget(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.resolve(context.Background(), res, tg)
			if tc.want == "" {
				if !errors.Is(err, errPolicy) {
					t.Errorf("resolve(%s) = %v, %v; want refusal", tc.target, got, err)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Errorf("resolve(%s) = %v, %v; want %s", tc.target, got, err, tc.want)
			}
		})
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"example.com:80", "[::1]:443", "1.2.3.4:1", "x:0", "[fe80::1%25eth0]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseTarget(s)
		if err != nil {
			return
		}
		again, err := ParseTarget(tg.String())
		if err != nil || again != tg {
			t.Fatalf("ParseTarget(%q) = %v; reparse of %q = %v, %v", s, tg, tg.String(), again, err)
		}
	})
}

func FuzzParseMatcher(f *testing.F) {
	for _, s := range []string{"*", "10.0.0.0/8", "[::1]:80", "*.example.com:443", "host"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseMatcher(s)
		if err != nil {
			return
		}
		m.matches("example.com", netip.MustParseAddr("10.1.2.3"), 80)
	})
}

type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if ips, ok := f[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
