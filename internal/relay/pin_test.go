package relay_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestPinnedRoute: a CONNECT with a Mosto-Route header takes the named
// chain (here a-c, a-b-c, a-b with b as the EgP, or a alone) instead of
// the looked-up one; a route that names a non-member, does not start at
// the InP, loops, or comes without the entry's authentication is refused.
func TestPinnedRoute(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
		if c.ID == "a" {
			c.HTTPConnect = &relay.ConnectConfig{Listen: "127.0.0.1:0", Users: map[string]string{"bob": "pw"}}
		}
	}}, "a", "b", "c")
	connect := func(route, auth string) (net.Conn, string) {
		t.Helper()
		c, err := net.Dial("tcp", w.Members["a"].HTTPConnectAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		req := "CONNECT " + o.Addr() + " HTTP/1.1\r\nHost: " + o.Addr() + "\r\n"
		if auth != "" {
			req += "Proxy-Authorization: Basic " + auth + "\r\n"
		}
		if route != "" {
			req += relay.RouteHeader + ": " + route + "\r\n"
		}
		c.Write([]byte(req + "\r\n"))
		return c, readHead(c)
	}
	const bob = "Ym9iOnB3" // bob:pw
	for _, tc := range []struct {
		route      string
		trp, egp   *relay.Server // the members that must see the flow as TrP, EgP
		noTrP      []*relay.Server
		directFrom bool // a connects to the origin itself
	}{
		{route: "a,c", egp: w.Members["c"], noTrP: []*relay.Server{w.Members["b"]}},
		{route: "a, b, c", trp: w.Members["b"], egp: w.Members["c"]},
		{route: "a,b", egp: w.Members["b"], noTrP: []*relay.Server{w.Members["c"]}},
		{route: "a", directFrom: true},
	} {
		var trpBefore, egpBefore float64
		if tc.trp != nil {
			trpBefore = relay.Flows(tc.trp, relay.RoleTrP, relay.OutcomeOK)
		}
		if tc.egp != nil {
			egpBefore = relay.Flows(tc.egp, relay.RoleEgP, relay.OutcomeOK)
		}
		var noTrP []float64
		for _, r := range tc.noTrP {
			noTrP = append(noTrP, relay.Flows(r, relay.RoleTrP, relay.OutcomeOK)+relay.Flows(r, relay.RoleEgP, relay.OutcomeOK))
		}
		c, status := connect(tc.route, bob)
		if status != "HTTP/1.1 200 Connection established\r\n\r\n" {
			t.Fatalf("route %q: status %q", tc.route, status)
		}
		c.Write([]byte("ping " + tc.route))
		c.(*net.TCPConn).CloseWrite()
		if got, err := io.ReadAll(c); string(got) != "ping "+tc.route || err != nil {
			t.Errorf("route %q: echo = %q, %v", tc.route, got, err)
		}
		c.Close()
		if tc.trp != nil {
			testenv.WaitFor(t, 5*time.Second, "TrP flow of "+tc.route, func() bool { return relay.Flows(tc.trp, relay.RoleTrP, relay.OutcomeOK) == trpBefore+1 })
		}
		if tc.egp != nil {
			testenv.WaitFor(t, 5*time.Second, "EgP flow of "+tc.route, func() bool { return relay.Flows(tc.egp, relay.RoleEgP, relay.OutcomeOK) == egpBefore+1 })
		}
		if tc.directFrom {
			testenv.WaitFor(t, 5*time.Second, "pinned direct flow", func() bool { return relay.DirectCount(w.Members["a"], "pinned") == 1 })
		}
		for i, r := range tc.noTrP {
			if got := relay.Flows(r, relay.RoleTrP, relay.OutcomeOK) + relay.Flows(r, relay.RoleEgP, relay.OutcomeOK); got != noTrP[i] {
				t.Errorf("route %q: a member off the route relayed the flow", tc.route)
			}
		}
	}

	for _, tc := range []struct{ route, auth, want, reason string }{
		{"a,x", bob, "HTTP/1.1 400", relay.RefuseEntryProto},   // not a member
		{"b,c", bob, "HTTP/1.1 400", relay.RefuseEntryProto},   // not starting here
		{"a,b,a", bob, "HTTP/1.1 400", relay.RefuseEntryProto}, // loop
		{"a,,c", bob, "HTTP/1.1 400", relay.RefuseEntryProto},  // empty id
		{"a,c", "", "HTTP/1.1 407", relay.RefuseEntryAuth},     // the pin needs the entry's authentication
	} {
		before := relay.Refusals(w.Members["a"], tc.reason)
		c, status := connect(tc.route, tc.auth)
		c.Close()
		if !bytes.HasPrefix([]byte(status), []byte(tc.want)) {
			t.Errorf("route %q auth %q: %q; want %s", tc.route, tc.auth, status, tc.want)
		}
		testenv.WaitFor(t, 5*time.Second, tc.reason, func() bool { return relay.Refusals(w.Members["a"], tc.reason) == before+1 })
	}
}
