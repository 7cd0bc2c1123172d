package agent

import (
	"testing"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
)

// BenchmarkLookup is the relay's per-flow chain lookup through the agent's
// atomically swapped snapshot, from all CPUs at once.
func BenchmarkLookup(b *testing.B) {
	a, err := New(Config{Controller: "https://c:1", DataDir: b.TempDir(), FEP: api.FEP{ID: "fra", HopAddr: "h:1", ProbeAddr: "h:2"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	keys, _ := pki.NewOverlayKeys(benchNow)
	s, err := newSnapshot(testTableB(b, keys), "fra")
	if err != nil {
		b.Fatal(err)
	}
	a.install(s, false)
	// Side by side: the agent (atomic load + index) and the bare index.
	for _, c := range []struct {
		name string
		src  interface {
			Lookup(string, string, int64) (pathcomp.ChainEntry, bool)
		}
	}{{"agent", a}, {"index", s.Index}} {
		b.Run(c.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, ok := c.src.Lookup("fra", "ams", 1<<20); !ok {
						b.Fatal("no chain")
					}
				}
			})
		})
	}
}
