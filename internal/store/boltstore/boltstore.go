package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

var (
	bFEPs    = []byte("feps")
	bRTTs    = []byte("rtts")   // from \x00 to -> RTT JSON
	bTables  = []byte("tables") // lop -> 8-byte big-endian version + data
	bMeta    = []byte("meta")
	bTokens  = []byte("tokens")
	bDests   = []byte("dests")   // id -> api.Destination JSON
	bRevoked = []byte("revoked") // certificate serial -> store.Revocation JSON

	kVersion = []byte("version")
	kKeys    = []byte("keys")
)

// Store is a bbolt-backed store.
type Store struct {
	db  *bolt.DB
	hub store.Hub
}

// Open opens (creating if needed) the store file at path. It fails after
// timeout if another process holds the file.
func Open(path string, timeout time.Duration) (*Store, error) {
	if timeout <= 0 {
		timeout = time.Second
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, NoFreelistSync: true})
	if err != nil {
		return nil, fmt.Errorf("open bolt store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bFEPs, bRTTs, bTables, bMeta, bTokens, bDests, bRevoked} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init bolt store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) update(ctx context.Context, c store.Change, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.db.Update(fn); err != nil {
		if errors.Is(err, bolt.ErrDatabaseNotOpen) {
			return store.ErrClosed
		}
		return err
	}
	if c != 0 {
		s.hub.Publish(c)
	}
	return nil
}

func (s *Store) view(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.db.View(fn)
	if errors.Is(err, bolt.ErrDatabaseNotOpen) {
		return store.ErrClosed
	}
	return err
}

// PutFEP registers or updates f.
func (s *Store) PutFEP(ctx context.Context, f api.FEP) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.update(ctx, store.ChangeFEPs, func(tx *bolt.Tx) error {
		return tx.Bucket(bFEPs).Put([]byte(f.ID), b)
	})
}

// DeleteFEP removes the FEP id and every RTT from or to it.
func (s *Store) DeleteFEP(ctx context.Context, id string) error {
	return s.update(ctx, store.ChangeFEPs|store.ChangeRTTs, func(tx *bolt.Tx) error {
		fb := tx.Bucket(bFEPs)
		if fb.Get([]byte(id)) == nil {
			return fmt.Errorf("fep %s: %w", id, store.ErrNotFound)
		}
		if err := fb.Delete([]byte(id)); err != nil {
			return err
		}
		rb := tx.Bucket(bRTTs)
		var dead [][]byte
		c := rb.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			from, to, _ := bytes.Cut(k, []byte{0})
			if string(from) == id || string(to) == id {
				dead = append(dead, append([]byte(nil), k...))
			}
		}
		for _, k := range dead {
			if err := rb.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// FEPs lists the FEPs sorted by id.
func (s *Store) FEPs(ctx context.Context) ([]api.FEP, error) {
	var out []api.FEP
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bFEPs).ForEach(func(k, v []byte) error {
			var f api.FEP
			if err := json.Unmarshal(v, &f); err != nil {
				return fmt.Errorf("decode fep %s: %w", k, err)
			}
			out = append(out, f)
			return nil
		})
	})
	return out, err
}

// PutDestination registers or replaces the destination d.ID.
func (s *Store) PutDestination(ctx context.Context, d api.Destination) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return s.update(ctx, store.ChangeDests, func(tx *bolt.Tx) error {
		return tx.Bucket(bDests).Put([]byte(d.ID), b)
	})
}

// DeleteDestination removes the destination id and every RTT to it, in one
// transaction.
func (s *Store) DeleteDestination(ctx context.Context, id string) error {
	return s.update(ctx, store.ChangeDests|store.ChangeRTTs, func(tx *bolt.Tx) error {
		db := tx.Bucket(bDests)
		if db.Get([]byte(id)) == nil {
			return fmt.Errorf("destination %s: %w", id, store.ErrNotFound)
		}
		if err := db.Delete([]byte(id)); err != nil {
			return err
		}
		rb := tx.Bucket(bRTTs)
		to := []byte(store.DestPrefix + id)
		var dead [][]byte
		c := rb.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if _, t, _ := bytes.Cut(k, []byte{0}); bytes.Equal(t, to) {
				dead = append(dead, append([]byte(nil), k...))
			}
		}
		for _, k := range dead {
			if err := rb.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// Destinations lists the registered destinations sorted by id.
func (s *Store) Destinations(ctx context.Context) ([]api.Destination, error) {
	var out []api.Destination
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bDests).ForEach(func(k, v []byte) error {
			var d api.Destination
			if err := json.Unmarshal(v, &d); err != nil {
				return fmt.Errorf("decode destination %s: %w", k, err)
			}
			out = append(out, d)
			return nil
		})
	})
	return out, err
}

func rttKey(from, to string) []byte { return []byte(from + "\x00" + to) }

// PutRTTs stores the latest RTT of each pair (an older sample than the one
// stored is ignored).
func (s *Store) PutRTTs(ctx context.Context, rtts []store.RTT) error {
	return s.update(ctx, store.ChangeRTTs, func(tx *bolt.Tx) error {
		b := tx.Bucket(bRTTs)
		for _, r := range rtts {
			k := rttKey(r.From, r.To)
			if old := b.Get(k); old != nil {
				var o store.RTT
				if json.Unmarshal(old, &o) == nil && o.At.After(r.At) {
					continue
				}
			}
			v, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := b.Put(k, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// RTTs returns every stored RTT.
func (s *Store) RTTs(ctx context.Context) ([]store.RTT, error) {
	var out []store.RTT
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bRTTs).ForEach(func(k, v []byte) error {
			var r store.RTT
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode rtt %q: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// NextVersion returns a version greater than any returned before.
func (s *Store) NextVersion(ctx context.Context) (uint64, error) {
	var v uint64
	err := s.update(ctx, 0, func(tx *bolt.Tx) error {
		b := tx.Bucket(bMeta)
		if old := b.Get(kVersion); len(old) == 8 {
			v = binary.BigEndian.Uint64(old)
		}
		v++
		return b.Put(kVersion, binary.BigEndian.AppendUint64(nil, v))
	})
	return v, err
}

// PutTables writes each table whose version is greater than the stored one
// for its LoP and returns how many it wrote. Tables are written in
// transactions of about 16 MB, so that a full set of large tables is never
// copied into one transaction's memory at once; each table is written
// atomically, and versions never move backwards.
func (s *Store) PutTables(ctx context.Context, ts []store.Table) (int, error) {
	total := 0
	for len(ts) > 0 {
		k, size := 0, 0
		for k < len(ts) && (k == 0 || size+len(ts[k].Data) <= 16<<20) {
			size += len(ts[k].Data)
			k++
		}
		n, err := s.putTables(ctx, ts[:k])
		total += n
		if err != nil {
			return total, err
		}
		ts = ts[k:]
	}
	return total, nil
}

func (s *Store) putTables(ctx context.Context, ts []store.Table) (int, error) {
	n := 0
	err := s.update(ctx, store.ChangeTables, func(tx *bolt.Tx) error {
		n = 0
		b := tx.Bucket(bTables)
		for _, t := range ts {
			if old := b.Get([]byte(t.LoP)); len(old) >= 8 && binary.BigEndian.Uint64(old) >= t.Version {
				continue
			}
			v := make([]byte, 8+len(t.Data))
			binary.BigEndian.PutUint64(v, t.Version)
			copy(v[8:], t.Data)
			if err := b.Put([]byte(t.LoP), v); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// TableVersions returns the stored version of every LoP's table.
func (s *Store) TableVersions(ctx context.Context) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bTables).ForEach(func(k, v []byte) error {
			if len(v) < 8 {
				return fmt.Errorf("table %s: short record", k)
			}
			out[string(k)] = binary.BigEndian.Uint64(v)
			return nil
		})
	})
	return out, err
}

// Tables returns the stored tables of lops, sorted by LoP.
func (s *Store) Tables(ctx context.Context, lops []string) ([]store.Table, error) {
	var out []store.Table
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bTables)
		for _, lop := range lops {
			v := b.Get([]byte(lop))
			if v == nil {
				continue
			}
			if len(v) < 8 {
				return fmt.Errorf("table %s: short record", lop)
			}
			out = append(out, store.Table{LoP: lop, Version: binary.BigEndian.Uint64(v), Data: append([]byte(nil), v[8:]...)})
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].LoP < out[j].LoP })
	return out, err
}

// Keys returns the HMAC keys, or store.ErrNotFound.
func (s *Store) Keys(ctx context.Context) (store.Keys, error) {
	var k store.Keys
	err := s.view(ctx, func(tx *bolt.Tx) error {
		v := tx.Bucket(bMeta).Get(kKeys)
		if v == nil {
			return fmt.Errorf("keys: %w", store.ErrNotFound)
		}
		return json.Unmarshal(v, &k)
	})
	return k, err
}

// PutKeys replaces the HMAC keys.
func (s *Store) PutKeys(ctx context.Context, k store.Keys) error {
	b, err := json.Marshal(k)
	if err != nil {
		return err
	}
	return s.update(ctx, store.ChangeKeys, func(tx *bolt.Tx) error {
		return tx.Bucket(bMeta).Put(kKeys, b)
	})
}

// PutRevocation records a revoked certificate.
func (s *Store) PutRevocation(ctx context.Context, r store.Revocation) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.update(ctx, store.ChangeFEPs, func(tx *bolt.Tx) error {
		return tx.Bucket(bRevoked).Put([]byte(r.Serial), b)
	})
}

// Revocations lists the revoked certificates.
func (s *Store) Revocations(ctx context.Context) ([]store.Revocation, error) {
	var out []store.Revocation
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bRevoked).ForEach(func(k, v []byte) error {
			var r store.Revocation
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode revocation %s: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

// PutToken stores a join token record.
func (s *Store) PutToken(ctx context.Context, t store.Token) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return s.update(ctx, 0, func(tx *bolt.Tx) error {
		return tx.Bucket(bTokens).Put([]byte(t.ID), b)
	})
}

// UseToken marks the token id used and returns it; it fails with
// store.ErrNotFound, store.ErrTokenUsed or store.ErrTokenExpired.
func (s *Store) UseToken(ctx context.Context, id string, now time.Time) (store.Token, error) {
	var t store.Token
	err := s.update(ctx, 0, func(tx *bolt.Tx) error {
		b := tx.Bucket(bTokens)
		v := b.Get([]byte(id))
		if v == nil {
			return fmt.Errorf("token: %w", store.ErrNotFound)
		}
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decode token: %w", err)
		}
		if t.Used {
			return fmt.Errorf("token: %w", store.ErrTokenUsed)
		}
		if !now.Before(t.Expires) {
			return fmt.Errorf("token: %w", store.ErrTokenExpired)
		}
		t.Used = true
		nb, err := json.Marshal(t)
		if err != nil {
			return err
		}
		return b.Put([]byte(id), nb)
	})
	return t, err
}

// Watch returns coalesced change notifications until ctx is done.
func (s *Store) Watch(ctx context.Context) <-chan store.Change { return s.hub.Subscribe(ctx) }

// Lead returns at once: a bolt store has a single controller.
func (s *Store) Lead(ctx context.Context) (context.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return ctx, nil
}
