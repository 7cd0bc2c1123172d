package mget

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
)

// TestGetCoupledGroup: two sub-flows of one Group (paths that share links)
// never request at once: one leads, the other is parked; an uncoupled
// sub-flow beside them runs on. When the leader's source goes silent the
// parked one takes over at once and the file is complete.
func TestGetCoupledGroup(t *testing.T) {
	const size = 4 << 20
	oa, a := startOrigin(t, 2<<20)
	ob, b := startOrigin(t, 2<<20)
	_, c := startOrigin(t, 1<<20)
	obj := fmt.Sprintf("/obj?size=%d", size)
	byHost := map[string]*origin.Server{strings.TrimPrefix(a, "http://"): oa, strings.TrimPrefix(b, "http://"): ob}
	for _, silence := range []bool{false, true} {
		t.Run(fmt.Sprintf("leader silent %v", silence), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "f")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srcs := []Source{{URL: a + obj, Group: "g"}, {URL: b + obj, Group: "g"}, {URL: c + obj}}
			cfg := Config{Sources: srcs, Out: out, Block: 64 << 10, Stall: 300 * time.Millisecond}
			var silenced *origin.Server
			cfg.Progress = func(s Snapshot) {
				if silence && silenced == nil && s.Received > size/5 {
					lead := 0
					if s.MBps[1] > s.MBps[0] {
						lead = 1
					}
					silenced = byHost[strings.Fields(s.Names[lead])[0]]
					silenced.Silence(2 * time.Second)
				}
			}
			st, err := Get(ctx, cfg)
			if silenced != nil {
				silenced.Silence(0)
			}
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, out, size)
			ga, gb := st.Subflows[0].Bytes+st.Subflows[0].DupBytes, st.Subflows[1].Bytes+st.Subflows[1].DupBytes
			if st.Subflows[2].Bytes == 0 {
				t.Errorf("the uncoupled sub-flow received nothing")
			}
			if !silence {
				if ga > 0 && gb > 0 {
					t.Errorf("both coupled sub-flows received bytes (%d, %d): want one leader at a time", ga, gb)
				}
				return
			}
			if ga == 0 || gb == 0 {
				t.Errorf("coupled sub-flows received %d and %d bytes: want the parked one to take over from the silent leader", ga, gb)
			}
			if st.Subflows[0].Led+st.Subflows[1].Led == 0 {
				t.Errorf("no lead time recorded")
			}
		})
	}
}
