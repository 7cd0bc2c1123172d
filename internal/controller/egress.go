package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// destPrefix marks the RTT records to destinations in the store: a FEP's
// RTT to destination d is the record (FEP, "@"+d). "@" is never in a FEP
// id, so BuildMatrix and Matrix ignore these records; DeleteFEP removes
// them with the FEP and DeleteDestination with the destination. Keeping
// them in the store (not in one controller's memory) lets every
// controller, the leader included, see reports taken by any of them.
const destPrefix = store.DestPrefix

func destKey(id string) string { return destPrefix + id }

// egressChoice is the EgP chosen for one destination.
type egressChoice struct {
	dest api.Destination
	fep  int                // index in feps; -1 when there is no FEP
	by   string             // "rtt" or "distance"
	rtts map[string]float64 // FEP id -> ms, measured to the destination
}

// chooseEgress picks the EgP of every destination: among the FEPs that
// measured an RTT to it, the lowest (ties to the lower id); when none did,
// the FEP nearest to its coordinates. Measured RTTs are not mixed with
// distance estimates: an estimate is a guess, and a guess lower than every
// measurement would win for no reason. A FEP every peer that measures it
// reports unreachable (deadFEPs) is not chosen while another FEP can be.
func chooseEgress(dests []api.Destination, feps []api.FEP, rtts []store.RTT) []egressChoice {
	if len(dests) == 0 {
		return nil
	}
	dead := deadFEPs(rtts)
	var avoid func(k int) (float64, bool) // dead FEPs last when by distance
	if len(dead) > 0 {
		avoid = func(k int) (float64, bool) {
			if dead[feps[k].ID] {
				return math.Inf(1), true
			}
			return 0, false
		}
	}
	byID := make(map[string]int, len(dests))
	for i, d := range dests {
		if d.ID != "" {
			byID[d.ID] = i
		}
	}
	measured := make([]map[string]float64, len(dests))
	for _, r := range rtts {
		id, ok := strings.CutPrefix(r.To, destPrefix)
		if !ok {
			continue
		}
		i, ok := byID[id]
		if !ok {
			continue
		}
		if _, ok := slices.BinarySearchFunc(feps, r.From, cmpFEP); !ok || r.Unreachable {
			continue
		}
		if measured[i] == nil {
			measured[i] = map[string]float64{}
		}
		measured[i][r.From] = r.MS
	}
	out := make([]egressChoice, len(dests))
	for i, d := range dests {
		ch := egressChoice{dest: d, fep: -1, rtts: measured[i]}
		best, bestMS := "", math.Inf(1)
		for id, ms := range measured[i] {
			if dead[id] {
				continue
			}
			if ms < bestMS || ms == bestMS && id < best {
				best, bestMS = id, ms
			}
		}
		if best != "" {
			ch.fep, _ = slices.BinarySearchFunc(feps, best, cmpFEP)
			ch.by = "rtt"
		} else if k := Closest(d.Lat, d.Lon, feps, avoid); k >= 0 {
			ch.fep, ch.by = k, "distance"
		}
		out[i] = ch
	}
	return out
}

// deadFEPs returns the FEPs that every peer measuring them reports
// unreachable: at least one FEP-to-FEP record to it, all of them
// unreachable. (Its own records about its peers are ignored: a dead FEP
// sends no report, so they are stale.)
func deadFEPs(rtts []store.RTT) map[string]bool {
	var down, up map[string]bool
	for _, r := range rtts {
		if strings.HasPrefix(r.To, destPrefix) {
			continue
		}
		if r.Unreachable {
			if down == nil {
				down = map[string]bool{}
			}
			down[r.To] = true
		} else {
			if up == nil {
				up = map[string]bool{}
			}
			up[r.To] = true
		}
	}
	for id := range down {
		if up[id] {
			delete(down, id)
		}
	}
	return down
}

// egressEntries is the egress list tables carry for choices.
func egressEntries(choices []egressChoice, feps []api.FEP) []api.Egress {
	var out []api.Egress
	for _, ch := range choices {
		if ch.fep >= 0 {
			out = append(out, api.Egress{Prefix: ch.dest.Prefix, FEP: feps[ch.fep].ID})
		}
	}
	return out
}

// destinations returns the topology's destinations followed by the
// registered ones (a registered destination replaces a topology one with
// the same id), the registered ones sorted by id.
func (c *Controller) destinations() []api.Destination {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.destinationsLocked()
}

func (c *Controller) destinationsLocked() []api.Destination {
	out := make([]api.Destination, 0, len(c.cfg.Topology.Egress)+len(c.dests))
	for _, d := range c.cfg.Topology.Egress {
		if _, ok := c.dests[d.ID]; d.ID == "" || !ok {
			out = append(out, d.api())
		}
	}
	reg := make([]api.Destination, 0, len(c.dests))
	for _, d := range c.dests {
		reg = append(reg, d)
	}
	slices.SortFunc(reg, func(a, b api.Destination) int { return cmp.Compare(a.ID, b.ID) })
	return append(out, reg...)
}

// chooseDestTargets returns, for every FEP (by index in feps), the
// destinations it must measure: each destination with a probe address is
// measured by its n nearest FEPs by distance.
func chooseDestTargets(feps []api.FEP, dests []api.Destination, n int) [][]api.DestTarget {
	out := make([][]api.DestTarget, len(feps))
	if n <= 0 || len(feps) == 0 {
		return out
	}
	type cand struct {
		i int
		d float64
	}
	cands := make([]cand, len(feps))
	for _, d := range dests {
		if d.ID == "" || d.ProbeAddr == "" {
			continue
		}
		for i, f := range feps {
			cands[i] = cand{i, DistanceKm(d.Lat, d.Lon, f.Lat, f.Lon)}
		}
		slices.SortFunc(cands, func(a, b cand) int {
			if c := cmp.Compare(a.d, b.d); c != 0 {
				return c
			}
			return cmp.Compare(a.i, b.i)
		})
		for _, cd := range cands[:min(n, len(cands))] {
			out[cd.i] = append(out[cd.i], api.DestTarget{ID: d.ID, ProbeAddr: d.ProbeAddr})
		}
	}
	return out
}

// DestTargets returns the destinations FEP id must measure.
func (c *Controller) DestTargets(ctx context.Context, id string) ([]api.DestTarget, error) {
	i, err := c.lockFEP(ctx, id)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	if c.destTargets == nil {
		c.destTargets = chooseDestTargets(c.feps, c.destinationsLocked(), max(0, c.cfg.Targets.Dests))
	}
	return slices.Clone(c.destTargets[i]), nil
}

// reloadDests replaces the registered destinations in memory with the
// store's; the destinations FEPs measure are chosen again if they changed.
func (c *Controller) reloadDests(ctx context.Context) error {
	ds, err := c.st.Destinations(ctx)
	if err != nil {
		return fmt.Errorf("load destinations: %w", err)
	}
	m := make(map[string]api.Destination, len(ds))
	for _, d := range ds {
		m[d.ID] = d
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !maps.Equal(m, c.dests) {
		c.dests = m
		c.destTargets = nil
	}
	return nil
}

// RegisterDestination implements api.Backend. The destination is written
// to the store first (it survives a restart and every controller sharing
// the store sees it), then applied in memory; a store error leaves nothing
// changed and is answered with a 5xx. A new or changed one causes a
// computation.
func (c *Controller) RegisterDestination(ctx context.Context, d api.Destination) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	c.mu.Lock()
	_, had := c.dests[d.ID]
	full := len(c.dests) >= api.MaxDestinations && !had
	c.mu.Unlock()
	if full {
		return fmt.Errorf("%w: already %d destinations", api.ErrInvalid, api.MaxDestinations)
	}
	if err := c.st.PutDestination(ctx, d); err != nil {
		return fmt.Errorf("store destination %s (not registered): %w", d.ID, err)
	}
	c.mu.Lock()
	old, had := c.dests[d.ID]
	if !had || old != d {
		dests := maps.Clone(c.dests)
		if dests == nil {
			dests = map[string]api.Destination{}
		}
		dests[d.ID] = d
		c.dests = dests
		c.destTargets = nil
	}
	c.mu.Unlock()
	if !had || old != d {
		c.log.Info("destination registered", "dest", d.ID, "prefix", d.Prefix, "probe_addr", d.ProbeAddr)
		c.markDirty()
	}
	return nil
}

// DeleteDestination implements api.Backend: it removes a destination
// registered through the API, and its measured RTTs, from the store, then
// from memory.
func (c *Controller) DeleteDestination(ctx context.Context, id string) error {
	if err := c.st.DeleteDestination(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			// Perhaps deleted through another controller: forget it
			// here too without waiting for the watch.
			if rerr := c.reloadDests(ctx); rerr != nil {
				c.log.Warn("reload destinations", "err", rerr)
			}
			return fmt.Errorf("destination %s (registered through the API): %w", id, api.ErrNotFound)
		}
		return fmt.Errorf("delete destination %s (still registered): %w", id, err)
	}
	key := destKey(id)
	c.mu.Lock()
	if _, ok := c.dests[id]; ok {
		dests := maps.Clone(c.dests)
		delete(dests, id)
		c.dests = dests
		c.destTargets = nil
	}
	for k := range c.seen {
		if k[1] == key {
			delete(c.seen, k)
		}
	}
	c.mu.Unlock()
	c.log.Info("destination deleted", "dest", id)
	c.markDirty()
	return nil
}

// Destinations implements api.Backend: every destination with the EgP a
// computation would choose now. Registered destinations are read from the
// store, so a controller serves those registered through another one at
// once.
func (c *Controller) Destinations(ctx context.Context) ([]api.DestinationStatus, error) {
	feps, err := c.st.FEPs(ctx)
	if err != nil {
		return nil, fmt.Errorf("load feps: %w", err)
	}
	rtts, err := c.st.RTTs(ctx)
	if err != nil {
		return nil, fmt.Errorf("load rtts: %w", err)
	}
	if err := c.reloadDests(ctx); err != nil {
		return nil, err
	}
	choices := chooseEgress(c.destinations(), feps, rtts)
	out := make([]api.DestinationStatus, len(choices))
	for i, ch := range choices {
		out[i] = api.DestinationStatus{Destination: ch.dest, By: ch.by, RTTMS: ch.rtts}
		if ch.fep >= 0 {
			out[i].EgP = feps[ch.fep].ID
		}
	}
	return out, nil
}

// markDirty asks the leader loop for a (debounced) computation.
func (c *Controller) markDirty() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}
