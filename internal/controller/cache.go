package controller

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"sync"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// tableCache holds the newest encoded table of every LoP and wakes the
// long-polls waiting for a newer one. Versions only move forward: an older
// table offered to the cache is ignored.
type tableCache struct {
	mu      sync.Mutex
	tables  map[string]*api.EncodedTable
	max     uint64
	changed chan struct{} // closed and replaced on every change
	waiting int           // long-polls blocked in wait
}

func newTableCache() *tableCache {
	return &tableCache{tables: make(map[string]*api.EncodedTable), changed: make(chan struct{})}
}

// put offers tables (gzip data) and returns how many were newer.
func (c *tableCache) put(ts []store.Table) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range ts {
		if old, ok := c.tables[t.LoP]; ok && old.Version >= t.Version {
			continue
		}
		c.tables[t.LoP] = encoded(t)
		c.max = max(c.max, t.Version)
		n++
	}
	if n > 0 {
		close(c.changed)
		c.changed = make(chan struct{})
	}
	return n
}

func encoded(t store.Table) *api.EncodedTable {
	gz := t.Data
	var once sync.Once
	var plain []byte
	return &api.EncodedTable{
		Version: t.Version,
		Gzip:    func() []byte { return gz },
		JSON: func() []byte {
			once.Do(func() {
				zr, err := gzip.NewReader(bytes.NewReader(gz))
				if err != nil {
					return
				}
				plain, _ = io.ReadAll(zr)
			})
			return plain
		},
	}
}

// maxVersion returns the highest version in the cache.
func (c *tableCache) maxVersion() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.max
}

// version returns the cached version of lop's table (0: none).
func (c *tableCache) version(lop string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.tables[lop]; t != nil {
		return t.Version
	}
	return 0
}

// lops returns the LoPs that have a table.
func (c *tableCache) lops() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.tables))
	for lop := range c.tables {
		out = append(out, lop)
	}
	return out
}

func (c *tableCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.tables)
}

// wait returns the table of lop once its version is greater than since; a
// watcher that was slow gets the newest version, never an intermediate one.
// known reports whether lop may ever get a table (a registered FEP).
func (c *tableCache) wait(ctx context.Context, lop string, since uint64, known func() bool) (*api.EncodedTable, error) {
	checked := false
	for {
		c.mu.Lock()
		t := c.tables[lop]
		ch := c.changed
		c.mu.Unlock()
		if t != nil && t.Version > since {
			return t, nil
		}
		if t == nil && !checked {
			if !known() {
				return nil, api.ErrNotFound
			}
			checked = true
		}
		c.mu.Lock()
		c.waiting++
		c.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-ch:
		}
		c.mu.Lock()
		c.waiting--
		c.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// waiters returns the number of long-polls blocked waiting for a change.
func (c *tableCache) waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting
}
