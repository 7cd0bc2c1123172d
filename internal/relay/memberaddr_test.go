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
