package relay_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestEntryReplyAfterVerdict (issue 13 item 9): a SOCKS5 or HTTP CONNECT
// entry answers its client only after the EgP, two hops away, decided: the
// destination its policy refuses gets "not allowed" (SOCKS5 2, HTTP 403), a
// closed port "connection refused" (SOCKS5 5, HTTP 502), and never a
// success first. With the EgP's hop listener on goroutines and on loops.
func TestEntryReplyAfterVerdict(t *testing.T) {
	for _, loops := range []int{0, -1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) { testEntryReplyAfterVerdict(t, loops) })
	}
}

func testEntryReplyAfterVerdict(t *testing.T, loops int) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	// A listening origin the EgP's policy refuses (127.0.0.2), and a
	// closed port on an allowed address.
	refusedLn, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		testenv.Unmet(t, "no 127.0.0.2: %v", err)
	}
	defer refusedLn.Close()
	closedLn, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := closedLn.Addr().String()
	closedLn.Close()
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
		c.Loops = loops
		switch c.ID {
		case "a":
			c.SOCKS5 = &relay.SOCKS5Config{Listen: "127.0.0.1:0", Allow: []string{"127.0.0.0/8"}}
			c.HTTPConnect = &relay.ConnectConfig{Listen: "127.0.0.1:0", Allow: []string{"127.0.0.0/8"}}
		case "c":
			c.Destinations = relay.PolicyConfig{Allow: []string{"127.0.0.1/32"}}
		}
	}}, "a", "b", "c")
	socks := func(target string) (net.Conn, byte) {
		t.Helper()
		c, err := net.Dial("tcp", w.Members["a"].SOCKS5Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		ap := netip.MustParseAddrPort(target)
		req := append([]byte{5, 1, 0, 5, 1, 0, 1}, ap.Addr().AsSlice()...)
		c.Write(binary.BigEndian.AppendUint16(req, ap.Port()))
		rep := make([]byte, 12)
		if _, err := io.ReadFull(c, rep); err != nil {
			t.Fatalf("SOCKS5 %s: reply: %v", target, err)
		}
		return c, rep[3]
	}
	connect := func(target string) (net.Conn, string) {
		t.Helper()
		c, err := net.Dial("tcp", w.Members["a"].HTTPConnectAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("CONNECT %s: status: %v", target, err)
		}
		return c, strings.TrimSpace(line)
	}

	c, code := socks(o.Addr())
	if code != 0 {
		t.Fatalf("SOCKS5 to the allowed origin: reply %d; want 0", code)
	}
	c.Write([]byte("verdict ok"))
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(c); string(got) != "verdict ok" || err != nil {
		t.Errorf("echo after the verdict = %q, %v", got, err)
	}
	c.Close()

	before := relay.Refusals(w.Members["c"], relay.RefusePolicy)
	for _, tc := range []struct {
		target string
		socks  byte
		http   string
	}{
		{refusedLn.Addr().String(), 2, "HTTP/1.1 403"},
		{closed, 5, "HTTP/1.1 502"},
	} {
		c, code := socks(tc.target)
		c.Close()
		if code != tc.socks {
			t.Errorf("SOCKS5 to %s: reply %d; want %d", tc.target, code, tc.socks)
		}
		c, status := connect(tc.target)
		c.Close()
		if !strings.HasPrefix(status, tc.http) {
			t.Errorf("CONNECT %s: %q; want %s", tc.target, status, tc.http)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "two policy refusals at the EgP", func() bool { return relay.Refusals(w.Members["c"], relay.RefusePolicy) == before+2 })
	// The chain was used (the EgP decided), not a direct dial by the InP.
	// The InP counts a refusal after it replied to the client: wait.
	testenv.WaitFor(t, 5*time.Second, "two policy refusals at the InP (from the EgP's verdicts)", func() bool { return relay.Refusals(w.Members["a"], relay.RefusePolicy) == 2 })
}
