package controller

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// Drain then delete. A FEP deleted at once leaves every proxy that still
// holds an older table free to set up a flow through it, which the proxies
// already on the newer table refuse (the FEP is no longer a member). So a
// deletion first publishes tables whose chains avoid the FEP while it stays
// a member of every table, waits until every LoP polling this controller
// holds them (a long-poll with since >= that version), waits DrainGrace for
// the hop set-ups begun on older tables, and only then revokes and deletes.

// drain is one FEP being drained.
type drain struct {
	// need is the table version each LoP must hold (poll with since >=
	// it); nil until the leader computed tables with the FEP drained.
	need map[string]uint64
}

// drainingIDs returns the FEPs being drained (nil: none).
func (c *Controller) drainingIDs() map[string]bool {
	c.drainMu.Lock()
	defer c.drainMu.Unlock()
	if len(c.draining) == 0 {
		return nil
	}
	ids := make(map[string]bool, len(c.draining))
	for id := range c.draining {
		ids[id] = true
	}
	return ids
}

// drainSignal wakes the deletions waiting for their drain.
func (c *Controller) drainSignal() {
	c.drainMu.Lock()
	if len(c.draining) > 0 {
		close(c.drainCh)
		c.drainCh = make(chan struct{})
	}
	c.drainMu.Unlock()
}

// drained records, after a computation made with the FEPs ids drained,
// which version every other LoP must acknowledge: the version of its table
// now in the cache (the one just written, or an identical older one).
// Only LoPs that poll this controller (acks) are waited for.
func (c *Controller) drained(ids map[string]bool, feps []api.FEP) {
	if len(ids) == 0 {
		return
	}
	need := make(map[string]uint64)
	c.ackMu.Lock()
	polling := maps.Clone(c.acks)
	c.ackMu.Unlock()
	for _, lop := range c.cache.lops() {
		if _, ok := polling[lop]; !ok || ids[lop] {
			continue
		}
		if _, ok := slices.BinarySearchFunc(feps, lop, cmpFEP); !ok {
			continue
		}
		need[lop] = c.cache.version(lop)
	}
	c.drainMu.Lock()
	for id := range ids {
		if d := c.draining[id]; d != nil && d.need == nil {
			d.need = need
		}
	}
	c.drainMu.Unlock()
	c.drainSignal()
}

// withoutDrained returns feps and rtts as a computation sees them while
// the FEPs ids drain: no RTT from or to them (no chain goes through them
// and none of them is chosen as an EgP), so live lists the FEPs that may
// be chosen as EgPs.
func withoutDrained(ids map[string]bool, feps []api.FEP, rtts []store.RTT) (live []api.FEP, kept []store.RTT) {
	if len(ids) == 0 {
		return feps, rtts
	}
	live = slices.DeleteFunc(slices.Clone(feps), func(f api.FEP) bool { return ids[f.ID] })
	kept = slices.DeleteFunc(slices.Clone(rtts), func(r store.RTT) bool { return ids[r.From] || ids[r.To] })
	return live, kept
}

// drainFEP drains FEP id before its deletion (see above). It returns once
// every polling LoP holds tables without chains through id and DrainGrace
// passed, or after DrainTimeout (logged), or with ctx's error. The FEP
// stays marked as draining until endDrain.
func (c *Controller) drainFEP(ctx context.Context, id string) error {
	if c.cfg.DrainTimeout < 0 || !c.IsLeader() {
		return nil
	}
	d := &drain{}
	c.drainMu.Lock()
	if c.draining == nil {
		c.draining = make(map[string]*drain)
	}
	c.draining[id] = d
	c.drainMu.Unlock()
	c.Trigger()
	start := time.Now()
	timeout := time.NewTimer(c.cfg.DrainTimeout)
	defer timeout.Stop()
	for {
		c.drainMu.Lock()
		need, ch := d.need, c.drainCh
		c.drainMu.Unlock()
		if need != nil && c.acknowledged(need) {
			c.log.Info("fep drained: every LoP holds tables without it", "fep", id, "lops", len(need), "after", time.Since(start).Round(time.Millisecond))
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			c.log.Warn("fep drain timed out: deleting it anyway", "fep", id, "timeout", c.cfg.DrainTimeout, "tables_computed", need != nil)
			c.m.drainTimeouts.Inc()
			return nil
		case <-ch:
		}
	}
	grace := time.NewTimer(c.cfg.DrainGrace)
	defer grace.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-grace.C:
		return nil
	}
}

// endDrain forgets the drain of id (deleted, or the deletion failed).
func (c *Controller) endDrain(id string) {
	c.drainMu.Lock()
	delete(c.draining, id)
	c.drainMu.Unlock()
}

// acknowledged reports whether every LoP in need polled at least its
// version.
func (c *Controller) acknowledged(need map[string]uint64) bool {
	c.ackMu.Lock()
	defer c.ackMu.Unlock()
	for lop, v := range need {
		if c.acks[lop] < v {
			return false
		}
	}
	return true
}
