package agent

import (
	"encoding/json"
	"testing"

	ctlpkg "github.com/mosto-net/mosto/internal/controller"
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
	f.Add([]byte(`{"lop":"fra","version":1,"keys":{"current":{"id":1,"recv":"zz"}},"table":{"locations":[],"chains":[]}}`))
	f.Add([]byte(`{}`))
	withNext := testTableB(f, keys)
	next, _ := pki.NewOverlayKey(keys.Current.ID)
	withNext.Keys.Next, withNext.Epoch = ctlpkg.FEPKeyOf(next.Secret, "fra", []string{"par"}), "00ff"
	b, _ := json.Marshal(withNext)
	f.Add(b)
	withNext.Keys.Next = withNext.Keys.Current // the next key equals the current one
	b, _ = json.Marshal(withNext)
	f.Add(b)
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
