package relay_test

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

type fixedKeys struct{ kr *hop.Keyring }

func (f fixedKeys) Keys() *hop.Keyring { return f.kr }

// fepShare is FEP self's share of master, as the controller hands it out.
func fepShare(master hop.Key, self string, members ...string) hop.FEPKey {
	k := hop.FEPKey{ID: master.ID, Recv: hop.RecvKey(master.Secret, self), Send: map[string][]byte{}}
	for _, m := range members {
		if m != self {
			k.Send[m] = hop.SendKey(hop.RecvKey(master.Secret, m), self)
		}
	}
	return k
}

// TestPerFEPKeys (issue 13 item 11): proxies holding only their own share
// of the overlay key (as the controller's tables give them) carry a chain
// a -> b -> c; a compromised c cannot pass a header as a's to b, and a
// header addressed to b is refused by c, on goroutines and on event loops.
func TestPerFEPKeys(t *testing.T) {
	for _, loops := range []int{0, -1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) { testPerFEPKeys(t, loops) })
	}
}

func testPerFEPKeys(t *testing.T, loops int) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) { c.Loops = loops }}, "a", "b", "c")
	master := hop.Key{ID: 1, Secret: []byte("0123456789abcdef0123456789abcdef")}
	shares := map[string]hop.FEPKey{}
	for _, r := range w.Members {
		id := r.ID()
		shares[id] = fepShare(master, id, "a", "b", "c")
		kr, err := hop.NewFEPKeyring(id, shares[id], nil)
		if err != nil {
			t.Fatal(err)
		}
		r.SetKeySource(fixedKeys{kr})
	}
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), []byte("per-FEP keys")); string(got) != "per-FEP keys" {
		t.Fatalf("echo through a-b-c with per-FEP keys = %q", got)
	}
	c := shares["c"]
	forgers := map[string]hop.FEPKey{
		"c's send key to b": {ID: 1, Recv: c.Recv, Send: map[string][]byte{"b": c.Send["b"]}},
		"c's receive key":   {ID: 1, Recv: c.Recv, Send: map[string][]byte{"b": c.Recv}},
	}
	for name, fk := range forgers {
		forger, err := hop.NewFEPKeyring("a", fk, nil)
		if err != nil {
			t.Fatal(err)
		}
		sendRefused(t, w.Members["b"], signed(t, forger, []string{"a", "b", "c"}, 1, o.Addr(), time.Now()), relay.RefuseAuth, "a header forged as a's with "+name)
	}
	// a's genuine header to b, presented to c instead.
	aKR, _ := hop.NewFEPKeyring("a", shares["a"], nil)
	sendRefused(t, w.Members["c"], signed(t, aKR, []string{"a", "b", "c"}, 1, o.Addr(), time.Now()), relay.RefuseAuth, "a header addressed to b")
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), []byte("still")); string(got) != "still" {
		t.Fatalf("after the forgeries: echo %q", got)
	}
}

// sendRefused sends b on a fresh hop connection to r and waits for r to
// close it and count one refusal for reason.
func sendRefused(t *testing.T, r *relay.Server, b []byte, reason, what string) {
	t.Helper()
	before := relay.Refusals(r, reason)
	conn := dialHop(t, r)
	defer conn.Close()
	conn.Write(b)
	conn.Write([]byte("payload"))
	conn.(*net.TCPConn).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, _ := io.ReadAll(conn); len(got) > 0 {
		t.Errorf("%s: answered %q", what, got)
	}
	testenv.WaitFor(t, 5*time.Second, what+" refused ("+reason+")", func() bool { return relay.Refusals(r, reason) == before+1 })
}
