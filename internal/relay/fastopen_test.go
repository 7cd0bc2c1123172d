package relay_test

import (
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// fastOpenChild marks the re-executed test binary running inside a fresh
// network namespace with net.ipv4.tcp_fastopen=3.
const fastOpenChild = "MOSTO_RELAY_FASTOPEN_CHILD"

// TestFastOpen runs a chain with socket.fastopen in a private network
// namespace (the sysctl is per namespace): after the first flow got the
// cookies, the hop headers of later flows ride in the SYN (the kernel's
// TCPFastOpenPassive counter grows) and the bytes still arrive intact.
func TestFastOpen(t *testing.T) {
	if !inFastOpenNetns(t) {
		return
	}
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) { c.Socket.FastOpen = true }}, "a", "b", "c")
	relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 10000) // gets the cookies
	before := testenv.TCPExt(t, "TCPFastOpenPassive")
	for i := range 3 {
		relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 20000+i)
	}
	// Each flow has two hop connections (a->b, b->c) that carry data in
	// the SYN.
	if got := testenv.TCPExt(t, "TCPFastOpenPassive") - before; got < 6 {
		t.Errorf("TCPFastOpenPassive grew by %d over 3 flows; want >= 6 (hop headers in SYNs)", got)
	}
	// The EgP counts a flow just after the client saw its end.
	testenv.WaitFor(t, 5*time.Second, "4 ok flows at the EgP", func() bool { return relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK) == 4 })
}

// inFastOpenNetns re-runs the calling test in a new network namespace with
// net.ipv4.tcp_fastopen=3 and reports whether this process is that child.
func inFastOpenNetns(t *testing.T) bool { return testenv.InFastOpenNetns(t, fastOpenChild) }

// TestFastOpenUnreachableFirstHop: with Fast Open, connect() returns before
// any packet left and the first write only queues the request in the SYN,
// so a first hop that refuses connections, or drops them (no answer at
// all), shows only after the request was written. The InP must notice it
// before relaying and serve the flow directly instead of resetting the
// client or leaving it waiting.
func TestFastOpenUnreachableFirstHop(t *testing.T) {
	if !inFastOpenNetns(t) {
		return
	}
	nft := testenv.RequireCommand(t, "nft")
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
		c.Socket.FastOpen = true
		c.Timeouts.Connect = relay.Duration(500 * time.Millisecond)
	}}, "a", "b", "c")
	closedPort := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	// A first flow gets the Fast Open cookie of 127.0.0.1 (cookies are
	// kept per address, not per port), so the later SYNs carry data and the
	// writes succeed before the SYN is answered.
	relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 1000)
	if got := relay.DirectCount(w.Members["a"], "hop_unreachable"); got != 0 {
		t.Fatalf("the first flow without a cookie went direct (%v): want the chain", got)
	}
	refused, dropped := closedPort(), closedPort()
	_, port, _ := net.SplitHostPort(dropped)
	for _, args := range [][]string{
		{"add", "table", "inet", "fotest"},
		{"add", "chain", "inet", "fotest", "in", "{ type filter hook input priority 0; }"},
		{"add", "rule", "inet", "fotest", "in", "tcp", "dport", port, "drop"},
	} {
		if out, err := exec.Command(nft, args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
	}
	for i, dead := range []string{refused, dropped} {
		w.Members["a"].SetMembers(map[string]string{"a": w.Members["a"].HopAddr().String(), "b": dead, "c": w.Members["c"].HopAddr().String()})
		for j := range 2 {
			relay.HashTrip(t, w.Members["a"].ServiceAddr(0).String(), 5000+10*i+j)
		}
	}
	if got := relay.DirectCount(w.Members["a"], "hop_unreachable"); got != 4 {
		t.Errorf("flows served directly after the first hop failed = %v; want 4", got)
	}
	// The InP counts a flow just after the client saw its end.
	testenv.WaitFor(t, 5*time.Second, "5 ok flows at the InP", func() bool { return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeOK) == 5 })
}
