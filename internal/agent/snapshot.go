package agent

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

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
	// MemberAllow is the controller's member policy (api.Table); nil:
	// none.
	MemberAllow []string
	Keyring     *hop.Keyring // nil when the controller sent no keys
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
	s := &Snapshot{Version: t.Version, Epoch: t.Epoch, Table: t, Index: ix, Members: maps.Clone(t.Members), MemberAllow: slices.Clone(t.MemberAllow)}
	if s.Members == nil {
		s.Members = map[string]string{}
	}
	if t.Keys.Current != nil {
		if err := s.setKeys(t.LoP, t.Keys); err != nil {
			return nil, fmt.Errorf("table version %d: keys: %w", t.Version, err)
		}
	} else if t.Keys.Previous != nil || t.Keys.Next != nil {
		return nil, fmt.Errorf("table version %d: keys: previous or next key without a current one", t.Version)
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

// setKeys builds the FEP keyring of self (the table's LoP) and the probe
// keys from the table's keys.
func (s *Snapshot) setKeys(self string, ks api.Keys) error {
	parse := func(name string, k *api.FEPKey) (hop.FEPKey, probe.Key, error) {
		fk := hop.FEPKey{ID: k.ID, Send: make(map[string][]byte, len(k.Send))}
		var err error
		if fk.Recv, err = hexKey(k.Recv); err != nil {
			return fk, probe.Key{}, fmt.Errorf("%s recv: %w", name, err)
		}
		for m, h := range k.Send {
			if err := api.ValidateID(m); err != nil {
				return fk, probe.Key{}, fmt.Errorf("%s send: %w", name, err)
			}
			if fk.Send[m], err = hexKey(h); err != nil {
				return fk, probe.Key{}, fmt.Errorf("%s send to %s: %w", name, m, err)
			}
		}
		ps, err := hexKey(k.Probe)
		if err != nil {
			return fk, probe.Key{}, fmt.Errorf("%s probe: %w", name, err)
		}
		return fk, probe.NewKey(k.ID, ps), nil
	}
	cur, pcur, err := parse("current", ks.Current)
	if err != nil {
		return err
	}
	s.ProbeKeys = []probe.Key{pcur}
	var prev *hop.FEPKey
	if ks.Previous != nil {
		p, pp, err := parse("previous", ks.Previous)
		if err != nil {
			return err
		}
		prev = &p
		s.ProbeKeys = append(s.ProbeKeys, pp)
	}
	var accept []hop.FEPKey
	if ks.Next != nil {
		n, pn, err := parse("next", ks.Next)
		if err != nil {
			return err
		}
		accept = append(accept, n)
		s.ProbeKeys = append(s.ProbeKeys, pn)
	}
	kr, err := hop.NewFEPKeyring(self, cur, prev, accept...)
	if err != nil {
		return err
	}
	s.Keyring = kr
	return nil
}

// hexKey decodes a hex key of pki.OverlayKeySize bytes.
func hexKey(h string) ([]byte, error) {
	b, err := hex.DecodeString(h)
	if err != nil {
		return nil, err
	}
	if len(b) != pki.OverlayKeySize {
		return nil, fmt.Errorf("%d bytes, want %d", len(b), pki.OverlayKeySize)
	}
	return b, nil
}
