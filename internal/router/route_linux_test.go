//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package router

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// The join's route cache answers the routing table's device and reuses it
// for routeTTL only.
func TestRouteCache(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		testenv.Unmet(t, "no loopback interface: %v", err)
	}
	var c routeCache
	dst := netip.MustParseAddr("127.0.0.1")
	for range 2 {
		idx, err := c.ifindex(dst)
		if err != nil {
			t.Fatal(err)
		}
		if idx != lo.Index {
			t.Fatalf("ifindex(%s) = %d; want lo's %d", dst, idx, lo.Index)
		}
	}
	if len(c.m) != 1 {
		t.Fatalf("%d cached routes; want 1", len(c.m))
	}
	// An expired entry is looked up again (a wrong cached device is
	// replaced by the table's).
	c.m[dst] = cachedRoute{ifindex: 9999, at: time.Now().Add(-2 * routeTTL)}
	if idx, err := c.ifindex(dst); err != nil || idx != lo.Index {
		t.Fatalf("after expiry ifindex(%s) = %d, %v; want %d", dst, idx, err, lo.Index)
	}
	c.m[dst] = cachedRoute{ifindex: 9999, at: time.Now()}
	if idx, _ := c.ifindex(dst); idx != 9999 {
		t.Fatalf("fresh entry not reused: %d", idx)
	}
}
