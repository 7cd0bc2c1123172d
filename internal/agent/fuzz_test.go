package agent

import (
	"encoding/json"
	"testing"

	"github.com/mosto-net/mosto/internal/pki"
)

// FuzzSnapshot feeds arbitrary table documents (as a controller or a
// corrupted table.json could) to the decoder and validator: no panic, and an
// accepted table answers lookups from its own chains.
func FuzzSnapshot(f *testing.F) {
	keys, _ := pki.NewOverlayKeys(benchNow)
	good, _ := json.Marshal(testTableB(f, keys))
	f.Add(good)
	f.Add([]byte(`{"lop":"fra","version":1,"table":{"locations":["fra"],"chains":[]}}`))
	f.Add([]byte(`{"lop":"fra","version":1,"keys":{"current":"zz"},"table":{"locations":[],"chains":[]}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := decodeTable(b)
		if err != nil {
			return
		}
		s, err := newSnapshot(tab, "fra")
		if err != nil {
			return
		}
		if s.Version == 0 || s.Index == nil || s.Members == nil {
			t.Fatalf("accepted snapshot %+v", s)
		}
		for _, c := range tab.Table.Chains {
			if _, ok := s.Index.Lookup(c.From, c.To, c.Size); !ok {
				t.Fatalf("accepted table has no chain %s -> %s", c.From, c.To)
			}
		}
	})
}
