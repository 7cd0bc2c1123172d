package relay_test

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// signed returns a header for route signed under kr.
func signed(t *testing.T, kr *hop.Keyring, route []string, hopIdx int, target string, at time.Time) []byte {
	t.Helper()
	h := &hop.Header{
		Source: netip.MustParseAddrPort("192.0.2.1:5555"),
		Dest:   netip.MustParseAddrPort("192.0.2.2:80"),
		Route:  route, Hop: hopIdx, Target: target, Size: 1000, Time: at,
	}
	rand.Read(h.FlowID[:])
	b, err := h.Marshal(kr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRefusals sends hostile hop headers to the transit and egress
// proxies: each must be refused with the right counter, the connection
// closed promptly, and the daemons must keep serving; the same with the
// hop listener on the event loops and on goroutines.
func TestRefusals(t *testing.T) {
	for _, loops := range []int{0, -1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) { testRefusals(t, loops) })
	}
}

func testRefusals(t *testing.T, loops int) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) { c.Timeouts.Header = relay.Duration(time.Second); c.Loops = loops }, Setup: func(s *relay.Server) {
		s.SetResolver(relay.FakeResolver{"mail.example.com": {netip.MustParseAddr("10.0.0.25")}})
	}}, "a", "b", "c")
	kr := relaytest.Keyring(t)
	other, err := hop.NewKeyring(hop.Key{ID: 1, Secret: []byte("another secret of 32 bytes......")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	abc := []string{"a", "b", "c"}
	replayed := signed(t, kr, abc, 1, o.Addr(), now)
	altered := bytes.Replace(signed(t, kr, abc, 1, o.Addr(), now), []byte("\x01a\x01b\x01c"), []byte("\x01a\x01b\x01x"), 1)
	if !bytes.Contains(altered, []byte("\x01x")) {
		t.Fatal("route bytes not found to alter")
	}
	valid := signed(t, kr, abc, 1, o.Addr(), now)
	oversized := append(append([]byte{}, valid[:14]...), 0xff, 0xff)
	toInP := bytes.Replace(signed(t, kr, abc, 1, o.Addr(), now), []byte{hop.TLVHop, 0, 1, 1}, []byte{hop.TLVHop, 0, 1, 0}, 1)
	if bytes.Equal(toInP, valid) {
		t.Fatal("hop TLV not found to alter")
	}

	for _, tc := range []struct {
		name   string
		to     *relay.Server
		send   []byte
		first  []byte // sent and answered before send, on its own connection
		hold   bool   // keep the connection open after sending (slowloris)
		reason string
	}{
		{"garbage", w.Members["b"], []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), nil, false, relay.RefuseMalformed},
		{"wrong-key", w.Members["b"], signed(t, other, abc, 1, o.Addr(), now), nil, false, relay.RefuseAuth},
		{"altered-route", w.Members["b"], altered, nil, false, relay.RefuseAuth},
		{"replayed", w.Members["b"], replayed, replayed, false, relay.RefuseReplay},
		{"oversized", w.Members["b"], oversized, nil, false, relay.RefuseTooLarge},
		{"truncated", w.Members["b"], valid[:40], nil, false, relay.RefuseMalformed},
		{"slowloris", w.Members["b"], valid[:10], nil, true, relay.RefuseHeaderTimeout},
		{"expired", w.Members["b"], signed(t, kr, abc, 1, o.Addr(), now.Add(-time.Hour)), nil, false, relay.RefuseExpired},
		{"not-self", w.Members["b"], signed(t, kr, []string{"a", "c"}, 1, o.Addr(), now), nil, false, relay.RefuseNotSelf},
		{"to-inp", w.Members["a"], toInP, nil, false, relay.RefuseMalformed}, // hop 0: no sender
		{"next-not-member", w.Members["b"], signed(t, kr, []string{"a", "b", "x"}, 1, o.Addr(), now), nil, false, relay.RefuseNotMember},
		{"open-relay", w.Members["c"], signed(t, kr, abc, 2, "10.9.9.9:25", now), nil, false, relay.RefusePolicy},
		{"open-relay-name", w.Members["c"], signed(t, kr, abc, 2, "mail.example.com:25", now), nil, false, relay.RefusePolicy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := relay.Refusals(tc.to, tc.reason)
			if tc.first != nil {
				c := dialHop(t, tc.to)
				c.Write(tc.first)
				c.Write([]byte("ok"))
				c.(*net.TCPConn).CloseWrite()
				if got, _ := io.ReadAll(c); string(got) != "ok" {
					t.Fatalf("first use of the header: echo %q; want ok", got)
				}
				c.Close()
			}
			c := dialHop(t, tc.to)
			defer c.Close()
			c.Write(tc.send)
			if !tc.hold {
				c.(*net.TCPConn).CloseWrite()
			}
			start := time.Now()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(make([]byte, 64))
			if n > 0 {
				t.Fatalf("refused connection answered %d bytes", n)
			}
			if err == nil || isTimeoutErr(err) {
				t.Fatalf("connection not closed: %v", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("closed after %v", d)
			}
			testenv.WaitFor(t, 2*time.Second, "refusal "+tc.reason, func() bool {
				return relay.Refusals(tc.to, tc.reason) == before+1
			})
		})
	}
	// Still serving.
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), []byte("alive")); string(got) != "alive" {
		t.Fatalf("after refusals: echo %q", got)
	}
}

func dialHop(t *testing.T, s *relay.Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.HopAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func isTimeoutErr(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestLimits floods an entry: connections past the per-source and global
// limits are refused and counted, and the daemon serves again once
// connections close.
func TestLimits(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, func(c *net.TCPConn) { io.Copy(c, c) })
	for _, tc := range []struct {
		name       string
		global, ps int
		reason     string
	}{
		{"per-source", 100, 4, relay.RefuseLimitSource},
		{"global", 4, 100, relay.RefuseLimitGlobal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := relaytest.Config("a")
			cfg.Hop.Listen = ""
			cfg.Limits = relay.LimitConfig{MaxConns: tc.global, MaxConnsPerSource: tc.ps}
			cfg.Services = []relay.ServiceConfig{{Listen: "127.0.0.1:0", Origin: o.Addr()}}
			a := relaytest.Run(t, cfg)
			addr := a.ServiceAddr(0).String()
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for range 4 {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
			}
			testenv.WaitFor(t, 5*time.Second, "4 admitted", func() bool { return a.ActiveConns() == 4 })
			for i := range 20 {
				c, err := net.Dial("tcp", addr)
				if relay.IsReset(err) {
					continue // refused so fast that connect saw the reset
				}
				if err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				c.Write([]byte("x"))
				if n, err := c.Read(make([]byte, 1)); n > 0 || err == nil || isTimeoutErr(err) {
					t.Fatalf("flood connection %d: read %d, %v; want closed", i, n, err)
				}
				c.Close()
			}
			testenv.WaitFor(t, 5*time.Second, "20 refusals", func() bool { return relay.Refusals(a.Server, tc.reason) == 20 })
			held[0].Close()
			held = held[1:]
			testenv.WaitFor(t, 5*time.Second, "slot freed", func() bool { return a.ActiveConns() == 3 })
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write([]byte("y"))
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil || b[0] != 'y' {
				t.Fatalf("after flood: %q, %v", b, err)
			}
		})
	}
}

// TestSOCKS5 runs SOCKS5 CONNECT with username/password through the chain,
// and checks the refusals for a bad password and a disallowed destination.
func TestSOCKS5(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
		if c.ID == "a" {
			c.SOCKS5 = &relay.SOCKS5Config{Listen: "127.0.0.1:0", Users: map[string]string{"alice": "secret"}, Allow: []string{"127.0.0.0/8"}}
		}
	}}, "a", "b", "c")
	oa := net.TCPAddrFromAddrPort(netip.MustParseAddrPort(o.Addr()))
	socks := func(user, pass string, ip net.IP, port int) (net.Conn, byte) {
		t.Helper()
		c, err := net.Dial("tcp", w.Members["a"].SOCKS5Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte{5, 1, 2})
		b := make([]byte, 2)
		if _, err := io.ReadFull(c, b); err != nil || b[1] != 2 {
			t.Fatalf("method reply %v, %v", b, err)
		}
		c.Write(append(append(append([]byte{1, byte(len(user))}, user...), byte(len(pass))), pass...))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("auth reply: %v", err)
		}
		if b[1] != 0 {
			return c, 0xff
		}
		req := append([]byte{5, 1, 0, 1}, ip.To4()...)
		req = binary.BigEndian.AppendUint16(req, uint16(port))
		c.Write(req)
		rep := make([]byte, 10)
		if _, err := io.ReadFull(c, rep); err != nil {
			t.Fatalf("connect reply: %v", err)
		}
		return c, rep[1]
	}
	c, code := socks("alice", "secret", oa.IP, oa.Port)
	if code != 0 {
		t.Fatalf("CONNECT reply code %d; want 0", code)
	}
	c.Write([]byte("via socks"))
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(c); string(got) != "via socks" || err != nil {
		t.Errorf("echo = %q, %v", got, err)
	}
	c.Close()
	testenv.WaitFor(t, 5*time.Second, "chained flow", func() bool { return relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK) == 1 })

	c, code = socks("alice", "wrong", oa.IP, oa.Port)
	c.Close()
	if code != 0xff {
		t.Errorf("bad password accepted")
	}
	c, code = socks("alice", "secret", net.IPv4(10, 1, 1, 1), 80)
	c.Close()
	if code != 2 {
		t.Errorf("disallowed destination: reply %d; want 2 (not allowed)", code)
	}
	testenv.WaitFor(t, 5*time.Second, "entry refusals", func() bool {
		return relay.Refusals(w.Members["a"], relay.RefuseEntryAuth) == 1 && relay.Refusals(w.Members["a"], relay.RefuseEntryAllow) == 1
	})
	// A client that stalls in the handshake is cut off at the header timeout.
	slow, err := net.Dial("tcp", w.Members["a"].SOCKS5Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slow.Write([]byte{5})
	slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(slow); isTimeoutErr(err) {
		t.Fatal("stalled SOCKS5 handshake not closed")
	}
	testenv.WaitFor(t, 5*time.Second, "header timeout", func() bool { return relay.Refusals(w.Members["a"], relay.RefuseHeaderTimeout) == 1 })
}

// TestHTTPConnect runs CONNECT with Basic auth and pipelined early data
// through the chain, and checks 407 and 403.
func TestHTTPConnect(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
		if c.ID == "a" {
			c.HTTPConnect = &relay.ConnectConfig{Listen: "127.0.0.1:0", Users: map[string]string{"bob": "pw"}, Allow: []string{"127.0.0.1"}}
		}
	}}, "a", "b", "c")
	connect := func(target, auth, early string) (net.Conn, string) {
		t.Helper()
		c, err := net.Dial("tcp", w.Members["a"].HTTPConnectAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
		if auth != "" {
			req += "Proxy-Authorization: Basic " + auth + "\r\n"
		}
		c.Write([]byte(req + "\r\n" + early))
		return c, readHead(c)
	}
	c, status := connect(o.Addr(), "Ym9iOnB3", "early bytes|") // bob:pw
	if status != "HTTP/1.1 200 Connection established\r\n\r\n" {
		t.Fatalf("status %q", status)
	}
	c.Write([]byte("later"))
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(c); string(got) != "early bytes|later" || err != nil {
		t.Errorf("echo = %q, %v", got, err)
	}
	c.Close()
	testenv.WaitFor(t, 5*time.Second, "chained flow", func() bool { return relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK) == 1 })

	for _, tc := range []struct{ target, auth, want, reason string }{
		{o.Addr(), "", "HTTP/1.1 407", relay.RefuseEntryAuth},
		{o.Addr(), "Ym9iOnd4", "HTTP/1.1 407", relay.RefuseEntryAuth}, // bob:wx
		{"10.1.1.1:80", "Ym9iOnB3", "HTTP/1.1 403", relay.RefuseEntryAllow},
	} {
		before := relay.Refusals(w.Members["a"], tc.reason)
		c, status := connect(tc.target, tc.auth, "")
		c.Close()
		if !bytes.HasPrefix([]byte(status), []byte(tc.want)) {
			t.Errorf("CONNECT %s auth %q: %q; want %s", tc.target, tc.auth, status, tc.want)
		}
		testenv.WaitFor(t, 5*time.Second, tc.reason, func() bool { return relay.Refusals(w.Members["a"], tc.reason) == before+1 })
	}
}

// readHead reads c up to the end of an HTTP response head (CRLF CRLF),
// one byte at a time so that nothing after it is consumed, and returns
// what it read (less at an error).
func readHead(c net.Conn) string {
	var head []byte
	b := make([]byte, 1)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		if _, err := c.Read(b); err != nil {
			break
		}
		head = append(head, b[0])
	}
	return string(head)
}
