package relay

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestPinnedRoute: a CONNECT with a Mosto-Route header takes the named
// chain (here a-c, a-b-c, a-b with b as the EgP, or a alone) instead of
// the looked-up one; a route that names a non-member, does not start at
// the InP, loops, or comes without the entry's authentication is refused.
func TestPinnedRoute(t *testing.T) {
	testenv.CheckLeaks(t)
	o := newOrigin(t, echo)
	w := newWorld(t, o.addr(), func(c *Config) {
		if c.ID == "a" {
			c.HTTPConnect = &ConnectConfig{Listen: "127.0.0.1:0", Users: map[string]string{"bob": "pw"}}
		}
	})
	connect := func(route, auth string) (net.Conn, string) {
		t.Helper()
		c, err := net.Dial("tcp", w.a.HTTPConnectAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		req := "CONNECT " + o.addr() + " HTTP/1.1\r\nHost: " + o.addr() + "\r\n"
		if auth != "" {
			req += "Proxy-Authorization: Basic " + auth + "\r\n"
		}
		if route != "" {
			req += RouteHeader + ": " + route + "\r\n"
		}
		c.Write([]byte(req + "\r\n"))
		var status []byte
		b := make([]byte, 1)
		for !bytes.HasSuffix(status, []byte("\r\n\r\n")) {
			if _, err := c.Read(b); err != nil {
				break
			}
			status = append(status, b[0])
		}
		return c, string(status)
	}
	const bob = "Ym9iOnB3" // bob:pw
	for _, tc := range []struct {
		route      string
		trp, egp   *running // the members that must see the flow as TrP, EgP
		noTrP      []*running
		directFrom bool // a connects to the origin itself
	}{
		{route: "a,c", egp: w.c, noTrP: []*running{w.b}},
		{route: "a, b, c", trp: w.b, egp: w.c},
		{route: "a,b", egp: w.b, noTrP: []*running{w.c}},
		{route: "a", directFrom: true},
	} {
		var trpBefore, egpBefore float64
		if tc.trp != nil {
			trpBefore = flows(tc.trp.Server, roleTrP, outcomeOK)
		}
		if tc.egp != nil {
			egpBefore = flows(tc.egp.Server, roleEgP, outcomeOK)
		}
		var noTrP []float64
		for _, r := range tc.noTrP {
			noTrP = append(noTrP, flows(r.Server, roleTrP, outcomeOK)+flows(r.Server, roleEgP, outcomeOK))
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
			waitFor(t, 5*time.Second, "TrP flow of "+tc.route, func() bool { return flows(tc.trp.Server, roleTrP, outcomeOK) == trpBefore+1 })
		}
		if tc.egp != nil {
			waitFor(t, 5*time.Second, "EgP flow of "+tc.route, func() bool { return flows(tc.egp.Server, roleEgP, outcomeOK) == egpBefore+1 })
		}
		if tc.directFrom {
			waitFor(t, 5*time.Second, "pinned direct flow", func() bool { return counterValue(w.a.m.directFor("pinned")) == 1 })
		}
		for i, r := range tc.noTrP {
			if got := flows(r.Server, roleTrP, outcomeOK) + flows(r.Server, roleEgP, outcomeOK); got != noTrP[i] {
				t.Errorf("route %q: a member off the route relayed the flow", tc.route)
			}
		}
	}

	for _, tc := range []struct{ route, auth, want, reason string }{
		{"a,x", bob, "HTTP/1.1 400", refuseEntryProto},   // not a member
		{"b,c", bob, "HTTP/1.1 400", refuseEntryProto},   // not starting here
		{"a,b,a", bob, "HTTP/1.1 400", refuseEntryProto}, // loop
		{"a,,c", bob, "HTTP/1.1 400", refuseEntryProto},  // empty id
		{"a,c", "", "HTTP/1.1 407", refuseEntryAuth},     // the pin needs the entry's authentication
	} {
		before := refusals(w.a.Server, tc.reason)
		c, status := connect(tc.route, tc.auth)
		c.Close()
		if !bytes.HasPrefix([]byte(status), []byte(tc.want)) {
			t.Errorf("route %q auth %q: %q; want %s", tc.route, tc.auth, status, tc.want)
		}
		waitFor(t, 5*time.Second, tc.reason, func() bool { return refusals(w.a.Server, tc.reason) == before+1 })
	}
}
