package relay

import (
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestKeyRotation runs a flow while the overlay key rotates: a still signs
// with the old key, b already signs with the new one and accepts both, c
// knows only the new key.
func TestKeyRotation(t *testing.T) {
	testenv.CheckLeaks(t)
	o := newOrigin(t, echo)
	oldKey := &KeyConfig{ID: 1, SecretHex: hexOf("0123456789abcdef0123456789abcdef")}
	newKey := &KeyConfig{ID: 2, SecretHex: hexOf("fedcba9876543210fedcba9876543210")}
	w := newWorld(t, o.addr(), func(c *Config) {
		switch c.ID {
		case "b":
			c.Keys = KeysConfig{Current: newKey, Previous: oldKey}
		case "c":
			c.Keys = KeysConfig{Current: newKey}
		}
	})
	if got := roundTrip(t, w.a.ServiceAddr(0).String(), []byte("rotating")); string(got) != "rotating" {
		t.Fatalf("echo during rotation = %q", got)
	}
	// c alone cannot verify a's old key: a chain a-c must be refused there.
	w.a.SetChains(chainTable{{"a", "c"}: {"a", "c"}})
	roundTripMayFail(t, w.a.ServiceAddr(0).String())
	waitFor(t, 5*time.Second, "auth refusal at c", func() bool { return refusals(w.c.Server, refuseAuth) == 1 })
}

func roundTripMayFail(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer c.Close()
	c.Write([]byte("x"))
	c.(*net.TCPConn).CloseWrite()
	c.Read(make([]byte, 1))
}

// TestSocketOptions checks that the configured options reach the socket.
func TestSocketOptions(t *testing.T) {
	nd := false
	sc := SocketConfig{RcvBuf: 256 << 10, SndBuf: 512 << 10, Congestion: "reno", NotSentLowat: 64 << 10, NoDelay: &nd}
	ln, err := (&net.ListenConfig{Control: sc.control(sockListen)}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen with options: %v", err)
	}
	defer ln.Close()
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) {
		for _, tc := range []struct {
			name       string
			level, opt int
			atLeast    int
		}{
			{"SO_RCVBUF", unix.SOL_SOCKET, unix.SO_RCVBUF, 256 << 10},
			{"SO_SNDBUF", unix.SOL_SOCKET, unix.SO_SNDBUF, 512 << 10},
			{"TCP_NOTSENT_LOWAT", unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, 64 << 10},
		} {
			v, err := unix.GetsockoptInt(int(fd), tc.level, tc.opt)
			if err != nil || v < tc.atLeast {
				t.Errorf("%s = %d, %v; want >= %d", tc.name, v, err, tc.atLeast)
			}
		}
		cc, err := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
		if err != nil || cc != "reno" {
			t.Errorf("TCP_CONGESTION = %q, %v; want reno", cc, err)
		}
	})
	bad := SocketConfig{Congestion: "no-such-cc"}
	if _, err := (&net.ListenConfig{Control: bad.control(sockListen)}).Listen(t.Context(), "tcp", "127.0.0.1:0"); err == nil {
		t.Error("unknown congestion control accepted")
	}
}

// fakeAgent stands for the controller agent: chains, members and keys that
// change at run time.
type fakeAgent struct {
	chains  chainTable
	members map[string]string
	kr      *hop.Keyring
}

func (f *fakeAgent) Lookup(from, to string, size int64) (pathcomp.ChainEntry, bool) {
	return f.chains.Lookup(from, to, size)
}
func (f *fakeAgent) Members() map[string]string { return f.members }
func (f *fakeAgent) Keys() *hop.Keyring         { return f.kr }

// TestSources runs the daemons from an agent-like source of chains,
// members and keys, including a key the config files never held.
func TestSources(t *testing.T) {
	testenv.CheckLeaks(t)
	o := newOrigin(t, echo)
	w := newWorld(t, o.addr(), nil)
	kr, err := hop.NewKeyring(hop.Key{ID: 9, Secret: []byte("distributed by the controller...")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ag := &fakeAgent{
		chains:  chainTable{{"a", "c"}: {"a", "b", "c"}},
		members: map[string]string{"a": w.a.HopAddr().String(), "b": w.b.HopAddr().String(), "c": w.c.HopAddr().String()},
		kr:      kr,
	}
	for _, s := range w.all() {
		s.SetChains(ag)
		s.SetMemberSource(ag)
		s.SetKeySource(ag)
	}
	if got := roundTrip(t, w.a.ServiceAddr(0).String(), []byte("from sources")); string(got) != "from sources" {
		t.Fatalf("echo = %q", got)
	}
	waitFor(t, 5*time.Second, "flow through b", func() bool { return flows(w.b.Server, roleTrP, outcomeOK) == 1 })
	// A header under the configured key is no longer accepted by b.
	c := dialHop(t, w.b)
	defer c.Close()
	c.Write(signed(t, testKeyring(t), []string{"a", "b", "c"}, 1, o.addr(), time.Now()))
	c.(*net.TCPConn).CloseWrite()
	c.Read(make([]byte, 1))
	waitFor(t, 5*time.Second, "auth refusal", func() bool { return refusals(w.b.Server, refuseAuth) == 1 })
}
