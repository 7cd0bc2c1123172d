package relay

import (
	"errors"
	"net/netip"
	"testing"
)

// TestMemberAddrAllowed (issue 13 item 5): a member address in a range no
// overlay uses (the cloud metadata service's link-local range, multicast,
// unspecified) is never dialled unless the destination policy names it.
func TestMemberAddrAllowed(t *testing.T) {
	s, err := New(baseConfig("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for addr, ok := range map[string]bool{
		"169.254.169.254:80": false,
		"[fe80::1]:7000":     false,
		"224.0.0.1:7000":     false,
		"0.0.0.0:7000":       false,
		"127.0.0.1:7000":     true,
		"10.77.0.2:7000":     true,
		"192.0.2.10:7000":    true,
		"fra.example:7000":   true,
	} {
		err := s.memberAddrAllowed(addr)
		if ok != (err == nil) || !ok && !errors.Is(err, errPolicy) {
			t.Errorf("memberAddrAllowed(%s) = %v; want allowed %v", addr, err, ok)
		}
	}
	cfg := baseConfig("a")
	cfg.Destinations.Allow = append(cfg.Destinations.Allow, "169.254.0.0/16")
	s2, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.memberAddrAllowed("169.254.10.1:7000"); err != nil {
		t.Errorf("link-local member named by the policy: %v", err)
	}
}

// TestMemberAllowPolicy (issue 13 item 5, relay side): with
// hop.member_allow, member dials follow the full destination policy: only
// listed ranges (or names resolving into them), special ranges only when
// named (TestMemberAllowChain: a chain through a refused member).
func TestMemberAllowPolicy(t *testing.T) {
	cfg := baseConfig("a")
	cfg.Hop.MemberAllow = []string{"192.0.2.0/24", "10.77.0.0/16:7000", "fra.example"}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.origin.res = fakeResolver{"fra.example": {netip.MustParseAddr("192.0.2.7")}, "evil.example": {netip.MustParseAddr("169.254.169.254")}}
	for addr, ok := range map[string]bool{
		"192.0.2.10:7000":    true,
		"10.77.0.2:7000":     true,
		"10.77.0.2:22":       false, // the entry names port 7000
		"10.1.0.2:7000":      false, // private, not named
		"127.0.0.1:7000":     false,
		"198.51.100.1:7000":  false, // public but not listed
		"169.254.169.254:80": false,
		"fra.example:7000":   true,
		"evil.example:7000":  false,
	} {
		err := s.memberAddrAllowed(addr)
		if ok != (err == nil) || !ok && !errors.Is(err, errPolicy) {
			t.Errorf("memberAddrAllowed(%s) = %v; want allowed %v", addr, err, ok)
		}
	}
	cfg.Hop.MemberAllow = []string{"not a pattern/99"}
	if _, err := New(cfg, nil); err == nil {
		t.Error("a bad hop.member_allow entry was accepted")
	}

}

// policyMembers is a member source that carries a member policy, as the
// controller agent does with the controller's (api.Table member_allow).
type policyMembers struct {
	staticMembers
	policy []string
}

func (m policyMembers) MemberPolicy() []string { return m.policy }

// TestControllerMemberPolicy (issue 13 item 5, relay side by default): a
// proxy following a controller applies the member policy of its table to
// member dials without any configuration: a private, loopback or
// link-local member address is refused unless the controller allowed its
// range; hop.member_allow, when set, overrides the table's policy.
func TestControllerMemberPolicy(t *testing.T) {
	s, err := New(baseConfig("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	members := staticMembers{"b": "127.0.0.1:7000"}
	check := func(what string, want map[string]bool) {
		t.Helper()
		for addr, ok := range want {
			err := s.memberAddrAllowed(addr)
			if ok != (err == nil) || !ok && !errors.Is(err, errPolicy) {
				t.Errorf("%s: memberAddrAllowed(%s) = %v; want allowed %v", what, addr, err, ok)
			}
		}
	}
	// A table without a policy (the controller's member check off) or a
	// static member list: only never-legitimate addresses are refused.
	s.SetMemberSource(policyMembers{staticMembers: members})
	check("no policy", map[string]bool{"127.0.0.1:7000": true, "10.1.0.2:7000": true, "169.254.169.254:80": false, "198.51.100.1:7000": true})
	// The controller's default policy: public addresses only.
	s.SetMemberSource(policyMembers{members, []string{"*"}})
	check("policy [*]", map[string]bool{"127.0.0.1:7000": false, "10.1.0.2:7000": false, "169.254.169.254:80": false, "100.64.0.1:7000": false, "198.51.100.1:7000": true, "[2a00::1]:7000": true})
	if hs := s.hopPoolTargets(); len(hs) != 0 {
		t.Errorf("hop pool targets %v; want none (the only member is refused)", hs)
	}
	// With --allow-member-net 10.1.0.0/16.
	s.SetMemberSource(policyMembers{members, []string{"*", "10.1.0.0/16"}})
	check("policy [* 10.1.0.0/16]", map[string]bool{"127.0.0.1:7000": false, "10.1.0.2:7000": true, "10.2.0.2:7000": false, "198.51.100.1:7000": true})
	// A policy that does not parse refuses every member dial.
	s.SetMemberSource(policyMembers{members, []string{"not a pattern/99"}})
	check("bad policy", map[string]bool{"198.51.100.1:7000": false})

	// The operator's override.
	cfg := baseConfig("a")
	cfg.Hop.MemberAllow = []string{"127.0.0.0/8"}
	o, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.SetMemberSource(policyMembers{members, []string{"*"}})
	for addr, ok := range map[string]bool{"127.0.0.1:7000": true, "198.51.100.1:7000": false} {
		if err := o.memberAddrAllowed(addr); ok != (err == nil) {
			t.Errorf("hop.member_allow [127.0.0.0/8] over the table's [*]: memberAddrAllowed(%s) = %v; want allowed %v", addr, err, ok)
		}
	}
	// The documented "allow every member address" override.
	cfg.Hop.MemberAllow = []string{"0.0.0.0/0", "::/0"}
	if o, err = New(cfg, nil); err != nil {
		t.Fatal(err)
	}
	o.SetMemberSource(policyMembers{members, []string{"*"}})
	for _, addr := range []string{"127.0.0.1:7000", "10.1.0.2:7000", "169.254.169.254:80", "[::1]:7000", "198.51.100.1:7000"} {
		if err := o.memberAddrAllowed(addr); err != nil {
			t.Errorf("hop.member_allow [0.0.0.0/0 ::/0]: memberAddrAllowed(%s) = %v; want allowed", addr, err)
		}
	}
}
