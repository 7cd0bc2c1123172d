package controller

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// noteReport remembers when FEP id last reported to this controller and the
// relay counters it pushed, for the dashboard and `mosto status`. The state
// is per controller (in memory, not in the store): with several controllers
// each shows the FEPs that report to it.
func (c *Controller) noteReport(id string, st *api.ProxyStats) {
	now := c.cfg.Now()
	c.stMu.Lock()
	s := c.states[id]
	s.LastReport = now
	if st != nil {
		cp := *st
		s.Stats = &cp
	}
	c.states[id] = s
	close(c.stChanged)
	c.stChanged = make(chan struct{})
	c.stMu.Unlock()
	c.m.fepReport.WithLabelValues(id).Set(float64(now.UnixNano()) / 1e9)
}

// FEPStates returns, by FEP id, when each FEP last reported to this
// controller and the counters it last pushed. FEPs that never reported are
// absent. The stats are shared: do not modify them.
func (c *Controller) FEPStates() map[string]api.FEPState {
	c.stMu.Lock()
	defer c.stMu.Unlock()
	return maps.Clone(c.states)
}

// forgetFEP drops the report state of a deleted FEP.
func (c *Controller) forgetFEP(id string) {
	c.stMu.Lock()
	delete(c.states, id)
	c.stMu.Unlock()
	c.m.fepReport.DeleteLabelValues(id)
}

// Changed returns a channel closed at the next report (RTTs or counters)
// this controller accepts: the dashboard waits on it to push a change
// without polling fast.
func (c *Controller) Changed() <-chan struct{} {
	c.stMu.Lock()
	defer c.stMu.Unlock()
	return c.stChanged
}

// Tables returns the newest table of every LoP this controller serves.
func (c *Controller) Tables() map[string]*api.EncodedTable {
	c.cache.mu.Lock()
	defer c.cache.mu.Unlock()
	return maps.Clone(c.cache.tables)
}

// KeysRotated returns when the current hop key was made (zero: no key yet).
func (c *Controller) KeysRotated(ctx context.Context) (time.Time, error) {
	k, err := c.st.Keys(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return time.Time{}, nil
	}
	return k.Rotated, err
}
