package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestMemberAllowChain (issue 13 item 5, relay side): with
// hop.member_allow, on goroutines and on loops a chain through a refused
// member fails at the proxy that would dial it.
func TestMemberAllowChain(t *testing.T) {
	for _, loops := range []int{0, -1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			testenv.CheckLeaks(t)
			w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
				c.Loops = loops
				if c.ID == "b" {
					c.Hop.MemberAllow = []string{"127.0.0.2/32"} // c is on 127.0.0.1
				}
			}}, "a", "b", "c")
			roundTripMayFail(t, w.Service())
			testenv.WaitFor(t, 5*time.Second, "b's refused dial to c", func() bool {
				return relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeDialError) == 1
			})
			if n := relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK); n != 0 {
				t.Errorf("c served %v flows; want none", n)
			}
		})
	}
}
