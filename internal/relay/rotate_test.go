package relay_test

import (
	"encoding/hex"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestKeyRotation runs a flow while the overlay key rotates: a still signs
// with the old key, b already signs with the new one and accepts both, c
// knows only the new key.
func TestKeyRotation(t *testing.T) {
	testenv.CheckLeaks(t)
	oldKey := relaytest.Config("a").Keys.Current // the World's key, id 1
	newKey := &relay.KeyConfig{ID: 2, SecretHex: hex.EncodeToString([]byte("fedcba9876543210fedcba9876543210"))}
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
		switch c.ID {
		case "b":
			c.Keys = relay.KeysConfig{Current: newKey, Previous: oldKey}
		case "c":
			c.Keys = relay.KeysConfig{Current: newKey}
		}
	}}, "a", "b", "c")
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), []byte("rotating")); string(got) != "rotating" {
		t.Fatalf("echo during rotation = %q", got)
	}
	// c alone cannot verify a's old key: a chain a-c must be refused there.
	w.Members["a"].SetChains(relaytest.ChainTable{{"a", "c"}: {"a", "c"}})
	roundTripMayFail(t, w.Members["a"].ServiceAddr(0).String())
	testenv.WaitFor(t, 5*time.Second, "auth refusal at c", func() bool { return relay.Refusals(w.Members["c"], relay.RefuseAuth) == 1 })
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

// fakeAgent stands for the controller agent: chains, members and keys that
// change at run time.
type fakeAgent struct {
	chains  relaytest.ChainTable
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
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr()}, "a", "b", "c")
	kr, err := hop.NewKeyring(hop.Key{ID: 9, Secret: []byte("distributed by the controller...")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ag := &fakeAgent{
		chains:  relaytest.ChainTable{{"a", "c"}: {"a", "b", "c"}},
		members: map[string]string{"a": w.Members["a"].HopAddr().String(), "b": w.Members["b"].HopAddr().String(), "c": w.Members["c"].HopAddr().String()},
		kr:      kr,
	}
	for _, s := range w.Members {
		s.SetChains(ag)
		s.SetMemberSource(ag)
		s.SetKeySource(ag)
	}
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), []byte("from sources")); string(got) != "from sources" {
		t.Fatalf("echo = %q", got)
	}
	testenv.WaitFor(t, 5*time.Second, "flow through b", func() bool { return relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeOK) == 1 })
	// A header under the configured key is no longer accepted by b.
	c := dialHop(t, w.Members["b"])
	defer c.Close()
	c.Write(signed(t, relaytest.Keyring(t), []string{"a", "b", "c"}, 1, o.Addr(), time.Now()))
	c.(*net.TCPConn).CloseWrite()
	c.Read(make([]byte, 1))
	testenv.WaitFor(t, 5*time.Second, "auth refusal", func() bool { return relay.Refusals(w.Members["b"], relay.RefuseAuth) == 1 })
}
