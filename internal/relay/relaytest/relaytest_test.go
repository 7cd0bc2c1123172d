package relaytest

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestOverlay checks that a flow to the World's service crosses every
// member to the origin and back intact, for chains of two and four
// members, and that the World stops without leaks.
func TestOverlay(t *testing.T) {
	for _, ids := range [][]string{{"a", "b"}, {"a", "b", "c", "d"}} {
		t.Run(ids[len(ids)-1], func(t *testing.T) {
			testenv.CheckLeaks(t)
			var got []string
			w := OverlayWith(t, Options{Tweak: func(c *relay.Config) { got = append(got, c.ID) }}, ids...)
			if len(got) != len(ids) || len(w.Members) != len(ids) {
				t.Fatalf("tweaked %v, members %d; want %v", got, len(w.Members), ids)
			}
			c, err := net.DialTimeout("tcp", w.Service(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			msg := bytes.Repeat([]byte("relaytest "), 10000)
			go c.Write(msg)
			back := make([]byte, len(msg))
			if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, msg) {
				t.Fatalf("echo through %v: %d bytes, %v", ids, len(back), err)
			}
			// Every member relayed it: each one's registry counted a flow.
			c.Close()
			for _, id := range ids {
				waitFlow(t, w, id)
			}
		})
	}
}

// waitFlow waits until member id counted a flow that ended ok.
func waitFlow(t *testing.T, w *World, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for okFlows(t, w.Members[id]) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no ok flow counted", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func okFlows(t *testing.T, s *relay.Server) float64 {
	f, _ := metrics.Find(s.Registry().Gather(), "mosto_relay_flows_total")
	var n float64
	for _, m := range f.Series {
		if m.Label("outcome") == "ok" {
			n += m.Value
		}
	}
	return n
}
