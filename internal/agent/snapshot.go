package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/probe"
)

// Snapshot is one immutable table of the LoP as the proxy uses it. Never
// modify a Snapshot or anything it points to: readers share it without locks.
type Snapshot struct {
	Version uint64
	Epoch   string            // the controller store's epoch ("" from older controllers)
	Table   *api.Table        // as received (and persisted)
	Index   *pathcomp.Index   // chain lookups over Table.Table
	Members map[string]string // FEP id -> hop address
	Keys    pki.OverlayKeys   // zero when the controller sent none
	Keyring *hop.Keyring      // nil when the controller sent no keys
	// ProbeKeys are the same keys for probe tags, current first; nil when
	// the controller sent none.
	ProbeKeys []probe.Key
}

// newSnapshot validates t and builds the snapshot of it. lop, when not
// empty, must be the table's LoP.
func newSnapshot(t *api.Table, lop string) (*Snapshot, error) {
	if t == nil {
		return nil, errors.New("no table")
	}
	if t.Version == 0 {
		return nil, errors.New("table version 0")
	}
	if lop != "" && t.LoP != lop {
		return nil, fmt.Errorf("table is for LoP %q, not %q", t.LoP, lop)
	}
	ix, err := pathcomp.NewIndex(&t.Table)
	if err != nil {
		return nil, fmt.Errorf("table version %d: %w", t.Version, err)
	}
	for id, addr := range t.Members {
		if err := api.ValidateID(id); err != nil {
			return nil, fmt.Errorf("table version %d: member id: %w", t.Version, err)
		}
		if addr == "" {
			return nil, fmt.Errorf("table version %d: member %s has no hop address", t.Version, id)
		}
	}
	s := &Snapshot{Version: t.Version, Epoch: t.Epoch, Table: t, Index: ix, Members: maps.Clone(t.Members)}
	if s.Members == nil {
		s.Members = map[string]string{}
	}
	if t.Keys.Current != "" {
		ks, err := pki.ParseOverlayKeys(t.Keys.Current, t.Keys.Previous)
		if err != nil {
			return nil, fmt.Errorf("table version %d: keys: %w", t.Version, err)
		}
		cur := hop.Key{ID: ks.Current.ID, Secret: ks.Current.Secret}
		var prev *hop.Key
		if ks.Previous != nil {
			prev = &hop.Key{ID: ks.Previous.ID, Secret: ks.Previous.Secret}
		}
		var accept []hop.Key
		var next *pki.OverlayKey
		if t.Keys.Next != "" {
			nk, err := pki.ParseOverlayKey(t.Keys.Next)
			if err != nil {
				return nil, fmt.Errorf("table version %d: next key: %w", t.Version, err)
			}
			next = &nk
			accept = append(accept, hop.Key{ID: nk.ID, Secret: nk.Secret})
		}
		kr, err := hop.NewKeyringAccepting(cur, prev, accept...)
		if err != nil {
			return nil, fmt.Errorf("table version %d: keys: %w", t.Version, err)
		}
		s.Keys, s.Keyring = ks, kr
		s.ProbeKeys = []probe.Key{probe.NewKey(ks.Current.ID, ks.Current.Secret)}
		if ks.Previous != nil {
			s.ProbeKeys = append(s.ProbeKeys, probe.NewKey(ks.Previous.ID, ks.Previous.Secret))
		}
		if next != nil {
			s.ProbeKeys = append(s.ProbeKeys, probe.NewKey(next.ID, next.Secret))
		}
	}
	return s, nil
}

// decodeTable decodes a persisted table.
func decodeTable(b []byte) (*api.Table, error) {
	var t api.Table
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, err
	}
	return &t, nil
}
