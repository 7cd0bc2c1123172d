package controller

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/onpath"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/store"
)

// Controller computes and serves chain tables. Create it with New, run it
// with Run; its api.Backend methods may be called before and while Run runs.
type Controller struct {
	cfg   Config
	st    store.Store
	log   *slog.Logger
	m     *controllerMetrics
	cache *tableCache

	leader      atomic.Bool
	lastCompute atomic.Int64 // nanoseconds of the last computation that wrote tables

	mu      sync.Mutex // guards the fields below
	feps    []api.FEP  // sorted by id
	fepGen  uint64     // bumped by every change of feps made by this controller (see reloadFEPs)
	targets [][]api.Target
	seen    map[[2]string]float64      // newest RTT this controller stored (seenUnreachable: unreachable), for ReportResult.Changed
	dests   map[string]api.Destination // registered through the API, by id (a copy of the store's)
	revoked map[string]string          // revoked certificate serial -> FEP id (a copy of the store's)
	// destTargets are the destinations each FEP (by index in feps)
	// measures; nil: to be chosen again.
	destTargets [][]api.DestTarget

	stMu      sync.Mutex              // guards states and stChanged
	states    map[string]api.FEPState // last report of each FEP to this controller (fepstate.go)
	stChanged chan struct{}           // closed and replaced on every report

	// Owned by the leader goroutine.
	hashes     map[string][32]byte
	lastMatrix *Matrix
	lastEgress []api.Egress
	lastInter  []api.Intercept
	keys       store.Keys

	onpath *onpath.Planner // on-path relays' decisions (onpath.go); nil: no paths

	lastPeerReload atomic.Int64 // unix ns of the last FEP reload caused by an unknown peer in a report
	lastDestReload atomic.Int64 // the same for an unknown destination
	reportLimit    *rateLimiter

	epoch atomic.Pointer[string] // the store's epoch (keys record); nil: not known yet
	// Two-phase key rotation: while a next key is published, nextVersion
	// is the first table version that carries it (0: not written yet) and
	// acks the highest version each LoP polled since (a poll with since=V
	// says the LoP has V). nextServed is when that version was first
	// served (zero: not yet): the KeySwitchAfter fallback counts from it,
	// not from the key's publication in the store, so a slow or failed
	// computation never leaves the LoPs less time to fetch the key.
	ackMu       sync.Mutex
	nextVersion uint64
	nextServed  time.Time
	acks        map[string]uint64
	acked       chan struct{} // every LoP has the next key: switch now

	drainMu  sync.Mutex
	draining map[string]*drain // FEPs being deleted, drained first (drain.go)
	drainCh  chan struct{}     // closed and replaced when a drain may have progressed

	kick     chan struct{} // Trigger: compute now
	dirty    chan struct{} // something changed: compute (debounced)
	computed chan uint64   // test hook: versions written, non-blocking
}

var (
	_ api.Backend     = (*Controller)(nil)
	_ api.CertChecker = (*Controller)(nil)
)

// New checks cfg and returns a Controller.
func New(cfg Config) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := cfg.Topology.Validate(); err != nil {
		return nil, err
	}
	op, err := newOnPath(cfg)
	if err != nil {
		return nil, err
	}
	return &Controller{
		onpath:      op,
		cfg:         cfg,
		st:          cfg.Store,
		log:         cfg.Log,
		m:           newMetrics(cfg.Metrics),
		cache:       newTableCache(),
		seen:        make(map[[2]string]float64),
		dests:       make(map[string]api.Destination),
		revoked:     make(map[string]string),
		states:      make(map[string]api.FEPState),
		stChanged:   make(chan struct{}),
		kick:        make(chan struct{}, 1),
		acks:        make(map[string]uint64),
		reportLimit: newRateLimiter(cfg.ReportRate, cfg.ReportBurst),
		acked:       make(chan struct{}, 1),
		drainCh:     make(chan struct{}),
		dirty:       make(chan struct{}, 1),
	}, nil
}

// Run loads the state, follows the store's changes into the cache and, while
// elected, computes tables. It returns when ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	changes := c.st.Watch(ctx)
	if err := c.reloadFEPs(ctx); err != nil {
		return err
	}
	if err := c.reloadDests(ctx); err != nil {
		return err
	}
	if err := c.reloadTables(ctx); err != nil {
		return err
	}
	if err := c.reloadEpoch(ctx); err != nil {
		return err
	}
	dirty := c.dirty
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		c.follow(ctx, changes, dirty)
	}()
	go func() {
		defer wg.Done()
		c.leadLoop(ctx, dirty)
	}()
	wg.Wait()
	return nil
}

// Trigger asks the leader to compute at once (forced, without debounce);
// it does nothing on a follower.
func (c *Controller) Trigger() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// IsLeader reports whether this controller currently computes tables.
func (c *Controller) IsLeader() bool { return c.leader.Load() }

// LastCompute returns how long the last computation that wrote tables took
// (matrix, chains, encoding, store).
func (c *Controller) LastCompute() time.Duration { return time.Duration(c.lastCompute.Load()) }

// Version returns the highest table version this controller serves.
func (c *Controller) Version() uint64 { return c.cache.maxVersion() }

// reloadFEPs replaces the FEP list with the store's. A registration or
// deletion through this controller between the store read and the swap
// (fepGen moved) makes it read again: the list it read may predate that
// change, and installing it would lose a FEP just registered (its targets
// and the samples about it, until the next notification).
func (c *Controller) reloadFEPs(ctx context.Context) error {
	for {
		c.mu.Lock()
		gen := c.fepGen
		c.mu.Unlock()
		feps, err := c.st.FEPs(ctx)
		if err != nil {
			return fmt.Errorf("load feps: %w", err)
		}
		revs, err := c.st.Revocations(ctx)
		if err != nil {
			return fmt.Errorf("load revocations: %w", err)
		}
		c.mu.Lock()
		if c.fepGen != gen {
			c.mu.Unlock()
			continue
		}
		for _, r := range revs {
			c.revoked[r.Serial] = r.FEP
		}
		c.feps = feps
		c.fepGen++
		c.targets = nil
		c.destTargets = nil
		c.mu.Unlock()
		c.m.feps.Set(float64(len(feps)))
		return nil
	}
}

// reloadEpoch reads the store's epoch (in its keys record).
func (c *Controller) reloadEpoch(ctx context.Context) error {
	k, err := c.st.Keys(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load keys: %w", err)
	}
	if k.Epoch != "" {
		c.epoch.Store(&k.Epoch)
	}
	return nil
}

func (c *Controller) reloadTables(ctx context.Context) error {
	vers, err := c.st.TableVersions(ctx)
	if err != nil {
		return fmt.Errorf("load table versions: %w", err)
	}
	var stale []string
	for lop, v := range vers {
		if v > c.cache.version(lop) {
			stale = append(stale, lop)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	ts, err := c.st.Tables(ctx, stale)
	if err != nil {
		return fmt.Errorf("load tables: %w", err)
	}
	c.cache.put(ts)
	c.m.version.Set(float64(c.cache.maxVersion()))
	return nil
}

// follow applies the store's change notifications: FEPs, destinations and
// tables are reloaded into memory, and FEP, destination or RTT changes mark
// the leader's state dirty.
// A resync runs every period in case a notification was lost.
func (c *Controller) follow(ctx context.Context, changes <-chan store.Change, dirty chan<- struct{}) {
	resync := time.NewTicker(c.cfg.Period)
	defer resync.Stop()
	for {
		var ch store.Change
		select {
		case <-ctx.Done():
			return
		case <-resync.C:
			ch = store.ChangeFEPs | store.ChangeDests | store.ChangeTables
		case got, ok := <-changes:
			if !ok {
				// The store's watch ended (etcd compaction, lost
				// connection): watch again and reload everything.
				if ctx.Err() != nil {
					return
				}
				c.log.Warn("store watch ended; watching again")
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				changes = c.st.Watch(ctx)
				ch = store.ChangeFEPs | store.ChangeDests | store.ChangeRTTs | store.ChangeTables
				break
			}
			ch = got
		}
		if ch&store.ChangeFEPs != 0 {
			if err := c.reloadFEPs(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("reload feps", "err", err)
			}
		}
		if ch&store.ChangeDests != 0 {
			if err := c.reloadDests(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("reload destinations", "err", err)
			}
		}
		if ch&(store.ChangeKeys|store.ChangeTables) != 0 {
			if err := c.reloadEpoch(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("reload epoch", "err", err)
			}
		}
		if ch&store.ChangeTables != 0 {
			if err := c.reloadTables(ctx); err != nil && ctx.Err() == nil {
				c.log.Warn("reload tables", "err", err)
			}
		}
		if ch&(store.ChangeFEPs|store.ChangeDests|store.ChangeRTTs) != 0 {
			select {
			case dirty <- struct{}{}:
			default:
			}
		}
	}
}

func (c *Controller) leadLoop(ctx context.Context, dirty <-chan struct{}) {
	for ctx.Err() == nil {
		lctx, err := c.st.Lead(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("leader election", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		c.log.Info("leading: this controller computes tables")
		c.leader.Store(true)
		c.m.leader.Set(1)
		c.lead(lctx, dirty)
		c.leader.Store(false)
		c.m.leader.Set(0)
		if ctx.Err() == nil {
			c.log.Warn("leadership lost")
		}
	}
}

// lead computes at once, then on the period, on changes (at once after a
// quiet Debounce, else Debounce after the previous computation) and on key
// rotation, until lctx ends.
func (c *Controller) lead(lctx context.Context, dirty <-chan struct{}) {
	c.hashes = make(map[string][32]byte)
	c.lastMatrix = nil
	c.lastEgress = nil
	// A published next key counts as served only once this leadership
	// serves it (its first computation writes every table).
	c.ackMu.Lock()
	c.nextVersion, c.nextServed = 0, time.Time{}
	c.ackMu.Unlock()
	retry := time.Duration(0)
	last := time.Now() // start of the latest computation
	if err := c.ensureKeys(lctx); err != nil {
		c.log.Error("hop keys", "err", err)
		retry = c.cfg.Debounce
	} else if err := c.Compute(lctx, true); err != nil && lctx.Err() == nil {
		c.log.Error("compute tables", "err", err)
		retry = c.cfg.Debounce
	}
	period := time.NewTicker(c.cfg.Period)
	defer period.Stop()
	var debounce <-chan time.Time
	if retry > 0 {
		debounce = time.After(retry)
	}
	for {
		var rotate <-chan time.Time
		if due, ok := c.keyDue(); ok {
			rotate = time.After(max(time.Millisecond, due.Sub(c.cfg.Now())))
		}
		force := false
		select {
		case <-lctx.Done():
			return
		case <-dirty:
			// Leading-edge debounce: a change after a quiet Debounce
			// is computed at once; changes coming within Debounce of
			// a computation are coalesced into one at its end.
			if debounce == nil {
				debounce = time.After(max(0, c.cfg.Debounce-time.Since(last)))
			}
			continue
		case <-debounce:
		case <-period.C:
			force = true
		case <-c.kick:
			force = true
		case <-rotate:
			force = true
		case <-c.acked:
			force = true
		}
		debounce = nil
		last = time.Now()
		err := c.step(lctx, force)
		if err != nil && lctx.Err() == nil {
			c.log.Error("compute tables", "err", err)
			debounce = time.After(max(c.cfg.Debounce, time.Second))
		}
	}
}

// step runs one iteration of the leader: the keys (publish or switch when
// due), then a computation, forced when the keys changed: every table
// carries them, and a published next key must be served even if nothing
// else changed (a computation skipped as insignificant left it unserved).
func (c *Controller) step(ctx context.Context, force bool) error {
	cur, next := c.keys.Current, c.keys.Next
	if err := c.ensureKeys(ctx); err != nil {
		return err
	}
	if !bytes.Equal(cur, c.keys.Current) || !bytes.Equal(next, c.keys.Next) {
		force = true
	}
	return c.Compute(ctx, force)
}

// keyDue returns when the leader must next change the keys: publish a
// next key (Rotated + KeyRotation) or switch to it (switchDue).
func (c *Controller) keyDue() (time.Time, bool) {
	switch {
	case c.cfg.KeyRotation <= 0 || len(c.keys.Current) == 0:
		return time.Time{}, false
	case len(c.keys.Next) > 0:
		// Not served yet: the computation that follows serves it (a
		// failed one is retried); the switch waits for it.
		return c.switchDue()
	}
	return c.keys.Rotated.Add(c.cfg.KeyRotation), true
}

// switchDue returns when the published next key becomes the signing key
// even if not every LoP acknowledged it: KeySwitchAfter after the first
// table carrying it was served. ok is false while no such table was
// served by this leader.
func (c *Controller) switchDue() (due time.Time, ok bool) {
	c.ackMu.Lock()
	defer c.ackMu.Unlock()
	if c.nextVersion == 0 || c.nextServed.IsZero() {
		return time.Time{}, false
	}
	return c.nextServed.Add(c.cfg.KeySwitchAfter), true
}

// newEpoch returns a fresh store epoch.
func newEpoch() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("epoch: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ensureKeys loads the hop HMAC keys, creating them (and the store's epoch)
// on first use, and rotates them in two phases: when Current is older than
// KeyRotation a new key is published as Next (accepted, not used to sign);
// it becomes Current (the old one Previous) once every LoP polled a table
// that has it, or KeySwitchAfter after this leader first served a table
// with it (never before: a key no LoP could have fetched never signs).
func (c *Controller) ensureKeys(ctx context.Context) error {
	k, err := c.st.Keys(ctx)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("load hop keys: %w", err)
	}
	now := c.cfg.Now()
	put := false
	if len(k.Current) == 0 {
		if ik := c.cfg.InitialKeys; ik != nil && len(ik.Current) > 0 {
			k = *ik
			k.Epoch = ""
			c.log.Info("hop key seeded from the initial key set")
		} else {
			nk, err := pki.NewOverlayKey()
			if err != nil {
				return err
			}
			k = store.Keys{Current: nk.Secret, Rotated: now}
			c.log.Info("hop key created")
		}
		put = true
	}
	if k.Epoch == "" {
		// A store without an epoch: new, or written by an older controller.
		if k.Epoch, err = newEpoch(); err != nil {
			return err
		}
		c.log.Info("store epoch created", "epoch", k.Epoch)
		put = true
	}
	if c.cfg.KeyRotation > 0 && len(k.Next) == 0 && !now.Before(k.Rotated.Add(c.cfg.KeyRotation)) {
		// The new key's id (a hash byte) must differ from the ones proxies accept.
		avoid := []uint8{pki.KeyID(k.Current)}
		if len(k.Previous) > 0 {
			avoid = append(avoid, pki.KeyID(k.Previous))
		}
		nk, err := pki.NewOverlayKey(avoid...)
		if err != nil {
			return err
		}
		k.Next, k.NextAt = nk.Secret, now
		c.ackMu.Lock()
		c.nextVersion, c.nextServed = 0, time.Time{}
		c.ackMu.Unlock()
		c.log.Info("hop key published (accept only)", "id", nk.ID)
		put = true
	} else if due, ok := c.switchDue(); len(k.Next) > 0 && ((ok && !now.Before(due)) || c.allAcked()) {
		k = store.Keys{Current: k.Next, Previous: k.Current, Rotated: now, Epoch: k.Epoch}
		c.log.Info("hop key rotated: signing with the published key", "id", pki.KeyID(k.Current))
		put = true
	}
	if put {
		if err := c.st.PutKeys(ctx, k); err != nil {
			return fmt.Errorf("store hop keys: %w", err)
		}
	}
	c.keys = k
	c.m.keysRotated.Set(float64(k.Rotated.UnixNano()) / 1e9)
	c.epoch.Store(&k.Epoch)
	return nil
}

// allAcked reports whether every LoP with a table polled a version that
// carries the published next key.
func (c *Controller) allAcked() bool {
	c.ackMu.Lock()
	nv := c.nextVersion
	c.ackMu.Unlock()
	if nv == 0 {
		return false
	}
	lops := c.cache.lops()
	// A deleted FEP's table stays in the cache; it never polls again.
	c.mu.Lock()
	lops = slices.DeleteFunc(lops, func(lop string) bool {
		_, ok := slices.BinarySearchFunc(c.feps, lop, cmpFEP)
		return !ok
	})
	c.mu.Unlock()
	if len(lops) == 0 {
		return false
	}
	c.ackMu.Lock()
	defer c.ackMu.Unlock()
	for _, lop := range lops {
		if c.acks[lop] < nv {
			return false
		}
	}
	return true
}

// ack records that lop polled with since (it has that version) and wakes
// the leader when every LoP has the published next key.
func (c *Controller) ack(lop string, since uint64) {
	c.ackMu.Lock()
	if since <= c.acks[lop] {
		c.ackMu.Unlock()
		return
	}
	c.acks[lop] = since
	nv := c.nextVersion
	c.ackMu.Unlock()
	c.drainSignal()
	if nv != 0 && since >= nv && c.allAcked() {
		select {
		case c.acked <- struct{}{}:
		default:
		}
	}
}

// Compute runs one computation as the leader: it reads FEPs and RTTs, and
// unless force is false and the matrix did not change significantly since
// the last computation, computes chains and writes the tables whose content
// changed under a new version. Only the leader goroutine calls it (tests
// may call it on a controller that is not running).
func (c *Controller) Compute(ctx context.Context, force bool) error {
	start := time.Now()
	if c.hashes == nil {
		c.hashes = make(map[string][32]byte)
	}
	if len(c.keys.Current) == 0 {
		if err := c.ensureKeys(ctx); err != nil {
			return err
		}
	}
	drain := c.drainingIDs() // before the reads: a drain marked later gets its own computation
	feps, err := c.st.FEPs(ctx)
	if err != nil {
		return fmt.Errorf("load feps: %w", err)
	}
	rtts, err := c.st.RTTs(ctx)
	if err != nil {
		return fmt.Errorf("load rtts: %w", err)
	}
	// The durable set, not only what the watch brought so far: a new leader
	// must not compute without a destination registered a moment ago.
	if err := c.reloadDests(ctx); err != nil {
		return err
	}
	live, rtts := withoutDrained(drain, feps, rtts)
	m := BuildMatrix(feps, rtts)
	egress := egressEntries(chooseEgress(c.destinations(), live, rtts), live)
	inter := c.intercepts()
	if !force && !Significant(c.lastMatrix, m, c.cfg.Rel, c.cfg.AbsMS) && slices.Equal(c.lastEgress, egress) && sameIntercepts(c.lastInter, inter) {
		return nil
	}
	if len(feps) == 0 {
		c.lastMatrix, c.lastEgress, c.lastInter = m, egress, inter
		return nil
	}
	p, err := newPlan(c.cfg, feps, m, c.keys)
	if err != nil {
		return err
	}
	p.egress = egress
	p.intercept = inter
	for id := range drain {
		if x, ok := m.index[id]; ok {
			p.keep = append(p.keep, x) // still a member of every table
		}
	}
	planned := time.Since(start)
	// The version is taken before building (tables embed it); a
	// computation that changes nothing leaves a gap, which is harmless.
	version, err := c.st.NextVersion(ctx)
	if err != nil {
		return fmt.Errorf("next version: %w", err)
	}
	now := c.cfg.Now()
	changed, err := p.tables(c.hashes, version, now)
	if err != nil {
		return err
	}
	c.lastMatrix, c.lastEgress, c.lastInter = m, egress, inter
	if len(changed) == 0 {
		c.log.Debug("computation changed no table", "feps", len(feps))
		c.drained(drain, feps)
		return nil
	}
	ts := make([]store.Table, len(changed))
	for k, bt := range changed {
		ts[k] = store.Table{LoP: bt.lop, Version: version, Data: bt.gz}
	}
	// Serve first, then persist: watchers get the tables without waiting
	// for the store, and the follower loop finds them already cached. A
	// failed write only means the next leader's version is higher.
	// The version carrying the next key is known before it is served: a
	// LoP acknowledging it at once (a poll with since = version) must find
	// it, or its wake-up of the leader is lost and only the fallback
	// switches.
	if len(c.keys.Next) > 0 {
		c.ackMu.Lock()
		if c.nextVersion == 0 {
			c.nextVersion, c.nextServed = version, c.cfg.Now()
		}
		c.ackMu.Unlock()
	}
	c.cache.put(ts)
	written, err := c.st.PutTables(ctx, ts)
	if err != nil {
		return fmt.Errorf("store tables: %w", err)
	}
	for _, bt := range changed {
		c.hashes[bt.lop] = bt.hash
	}
	c.drained(drain, feps)
	c.m.computations.Inc()
	c.m.tablesWritten.Add(float64(written))
	c.m.version.Set(float64(c.cache.maxVersion()))
	c.m.computeSeconds.Set(time.Since(start).Seconds())
	c.lastCompute.Store(int64(time.Since(start)))
	c.log.Info("tables computed", "version", version, "feps", len(feps), "links", p.fronts.Links(),
		"changed", len(changed), "written", written, "plan", planned.Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond))
	if c.computed != nil {
		select {
		case c.computed <- version:
		default:
		}
	}
	return nil
}

// lookupFEP returns the registered FEP id from memory, falling back to the
// store (a FEP registered through another controller a moment ago).
func (c *Controller) lookupFEP(ctx context.Context, id string) (api.FEP, bool, error) {
	c.mu.Lock()
	i, ok := slices.BinarySearchFunc(c.feps, id, cmpFEP)
	var f api.FEP
	if ok {
		f = c.feps[i]
	}
	c.mu.Unlock()
	if ok {
		return f, true, nil
	}
	if err := c.reloadFEPs(ctx); err != nil {
		return api.FEP{}, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok = slices.BinarySearchFunc(c.feps, id, cmpFEP)
	if ok {
		f = c.feps[i]
	}
	return f, ok, nil
}

func cmpFEP(f api.FEP, id string) int { return cmp.Compare(f.ID, id) }

// RegisterFEP implements api.Backend. f.CertSerial names the certificate
// that may act for f from now on (the API sets it at the join); empty keeps
// the one on record. A new serial revokes the one it replaces.
func (c *Controller) RegisterFEP(ctx context.Context, f api.FEP) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	src, fromFEP := api.Source(ctx)
	if err := c.cfg.Members.check(f, src, fromFEP); err != nil {
		c.m.refused.WithLabelValues("member_address").Inc()
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	old, had, err := c.lookupFEP(ctx, f.ID)
	if err != nil {
		return err
	}
	// Two FEPs never share a hop address: a FEP cannot make the others
	// send another member's traffic to itself by registering its address.
	if err := c.reloadFEPs(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	for _, g := range c.feps {
		if g.ID != f.ID && g.HopAddr == f.HopAddr {
			c.mu.Unlock()
			c.m.refused.WithLabelValues("member_address").Inc()
			return fmt.Errorf("%w: fep %s hop_addr %s is already fep %s's", api.ErrInvalid, f.ID, f.HopAddr, g.ID)
		}
	}
	c.mu.Unlock()
	if f.CertSerial == "" {
		f.CertSerial = old.CertSerial
	} else if had && old.CertSerial != "" && old.CertSerial != f.CertSerial {
		if err := c.revoke(ctx, old.CertSerial, f.ID); err != nil {
			return err
		}
	}
	if err := c.st.PutFEP(ctx, f); err != nil {
		return fmt.Errorf("store fep %s: %w", f.ID, err)
	}
	c.mu.Lock()
	i, ok := slices.BinarySearchFunc(c.feps, f.ID, cmpFEP)
	feps := slices.Clone(c.feps)
	if ok {
		feps[i] = f
	} else {
		feps = slices.Insert(feps, i, f)
	}
	c.feps = feps
	c.fepGen++
	c.targets = nil
	c.destTargets = nil
	c.mu.Unlock()
	c.log.Info("fep registered", "fep", f.ID, "hop_addr", f.HopAddr, "location", f.Location)
	return nil
}

// revoke records that the certificate serial may no longer act for fep.
func (c *Controller) revoke(ctx context.Context, serial, fep string) error {
	if err := c.st.PutRevocation(ctx, store.Revocation{Serial: serial, FEP: fep, At: c.cfg.Now().UTC()}); err != nil {
		return fmt.Errorf("revoke certificate %s of fep %s: %w", serial, fep, err)
	}
	c.mu.Lock()
	c.revoked[serial] = fep
	c.mu.Unlock()
	c.m.revocations.Inc()
	c.log.Info("certificate revoked", "fep", fep, "serial", serial)
	return nil
}

// CheckCert implements api.CertChecker: the certificate serial may act for
// FEP id unless it was revoked, or id is registered with another
// certificate (it re-joined with a new key).
func (c *Controller) CheckCert(ctx context.Context, id, serial string) error {
	// Memory only: a request never costs a store read here.
	c.mu.Lock()
	_, revoked := c.revoked[serial]
	i, ok := slices.BinarySearchFunc(c.feps, id, cmpFEP)
	replaced := ok && c.feps[i].CertSerial != "" && c.feps[i].CertSerial != serial
	c.mu.Unlock()
	if !revoked && !replaced {
		return nil
	}
	c.m.refused.WithLabelValues("revoked_cert").Inc()
	return fmt.Errorf("%w: the certificate %s of fep %s is revoked", api.ErrForbidden, serial, id)
}

// Revoked reports whether the certificate serial (hex) was revoked; the
// controller's TLS configuration refuses such certificates at the
// handshake.
func (c *Controller) Revoked(serial string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.revoked[serial]
	return ok
}

// DeleteFEP implements api.Backend. On the leader the FEP is drained
// first (drain.go: tables avoiding it, every LoP holding them); then its
// certificate is revoked: a deleted FEP can neither re-register nor read
// anything.
func (c *Controller) DeleteFEP(ctx context.Context, id string) error {
	f, ok, err := c.lookupFEP(ctx, id)
	if err != nil {
		return err
	}
	if ok {
		defer c.endDrain(id) // after the deletion: no computation in between puts it back in chains
		if err := c.drainFEP(ctx, id); err != nil {
			return fmt.Errorf("drain fep %s: %w", id, err)
		}
	}
	if ok && f.CertSerial != "" {
		if err := c.revoke(ctx, f.CertSerial, id); err != nil {
			return err
		}
	}
	if err := c.st.DeleteFEP(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("fep %s: %w", id, api.ErrNotFound)
		}
		return fmt.Errorf("delete fep %s: %w", id, err)
	}
	c.mu.Lock()
	if i, ok := slices.BinarySearchFunc(c.feps, id, cmpFEP); ok {
		c.feps = slices.Delete(slices.Clone(c.feps), i, i+1)
		c.fepGen++
		c.targets = nil
		c.destTargets = nil
	}
	for k := range c.seen {
		if k[0] == id || k[1] == id {
			delete(c.seen, k)
		}
	}
	c.mu.Unlock()
	c.forgetFEP(id)
	c.log.Info("fep deleted", "fep", id)
	return nil
}

// FEPs implements api.Backend.
func (c *Controller) FEPs(ctx context.Context) ([]api.FEP, error) {
	return c.st.FEPs(ctx)
}

// lockFEP checks that FEP id is registered and returns its index in c.feps
// with c.mu held; the caller unlocks. On error c.mu is not held.
func (c *Controller) lockFEP(ctx context.Context, id string) (int, error) {
	if _, ok, err := c.lookupFEP(ctx, id); err != nil {
		return 0, err
	} else if !ok {
		return 0, fmt.Errorf("fep %s: %w", id, api.ErrNotFound)
	}
	c.mu.Lock()
	i, ok := slices.BinarySearchFunc(c.feps, id, cmpFEP)
	if !ok {
		c.mu.Unlock()
		return 0, fmt.Errorf("fep %s: %w", id, api.ErrNotFound)
	}
	return i, nil
}

// Targets implements api.Backend.
func (c *Controller) Targets(ctx context.Context, id string) ([]api.Target, error) {
	i, err := c.lockFEP(ctx, id)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	if c.targets == nil {
		c.targets = ChooseTargets(c.feps, c.cfg.Targets)
	}
	return slices.Clone(c.targets[i]), nil
}

// hasCoords reports whether f registered coordinates (0, 0 means none).
func hasCoords(f api.FEP) bool { return f.Lat != 0 || f.Lon != 0 }

// seenUnreachable is the value of Controller.seen for a pair last reported
// unreachable.
const seenUnreachable = -1

// Report implements api.Backend: it stores the samples of a registered FEP
// about the peers and destinations it was asked to measure (its targets);
// samples about others, and with LightBound RTTs below the speed of light
// in fibre between the two FEPs, are refused and counted. An
// unreachable sample is stored as such (store.RTT.Unreachable): it replaces
// the pair's RTT, BuildMatrix then leaves the pair out, and the change (like
// the peer answering again) counts as significant.
func (c *Controller) Report(ctx context.Context, r api.Report) (api.ReportResult, error) {
	if err := r.Validate(c.cfg.Now()); err != nil {
		return api.ReportResult{}, fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	if _, ok, err := c.lookupFEP(ctx, r.FEP); err != nil {
		return api.ReportResult{}, err
	} else if !ok {
		return api.ReportResult{}, fmt.Errorf("%w: fep %s is not registered", api.ErrForbidden, r.FEP)
	}
	if !c.reportLimit.allow(r.FEP, c.cfg.Now()) {
		c.m.refused.WithLabelValues("rate_limited").Inc()
		return api.ReportResult{}, fmt.Errorf("%w: fep %s sends more than %g reports/s", api.ErrTooMany, r.FEP, c.cfg.ReportRate)
	}
	rtts := make([]store.RTT, 0, len(r.Samples)+len(r.Destinations))
	var res api.ReportResult
	known := map[string]bool{}
	for _, d := range c.destinations() {
		known[d.ID] = d.ID != ""
	}
	for _, s := range r.Destinations {
		if !known[s.Dest] {
			// Perhaps registered through another controller a
			// moment ago: look at the store once (at most once per
			// second).
			if last := c.lastDestReload.Load(); time.Since(time.Unix(0, last)) > time.Second && c.lastDestReload.CompareAndSwap(last, time.Now().UnixNano()) {
				if err := c.reloadDests(ctx); err != nil {
					return api.ReportResult{}, err
				}
			}
			for _, d := range c.destinations() {
				known[d.ID] = d.ID != ""
			}
			break
		}
	}
	// A peer this controller does not know may have registered a moment
	// ago (through another controller, or its notification is not applied
	// yet): look at the store once before dropping samples about it, at
	// most once per second (a report naming bogus peers must not cost a
	// store read each).
	c.mu.Lock()
	for _, s := range r.Samples {
		if _, ok := slices.BinarySearchFunc(c.feps, s.Peer, cmpFEP); !ok {
			c.mu.Unlock()
			if last := c.lastPeerReload.Load(); time.Since(time.Unix(0, last)) > time.Second && c.lastPeerReload.CompareAndSwap(last, time.Now().UnixNano()) {
				if err := c.reloadFEPs(ctx); err != nil {
					return api.ReportResult{}, err
				}
			}
			c.mu.Lock()
			break
		}
	}
	me, ok := slices.BinarySearchFunc(c.feps, r.FEP, cmpFEP)
	if !ok {
		c.mu.Unlock()
		return api.ReportResult{}, fmt.Errorf("%w: fep %s is not registered", api.ErrForbidden, r.FEP)
	}
	if c.targets == nil {
		c.targets = ChooseTargets(c.feps, c.cfg.Targets)
	}
	from := c.feps[me]
	assigned := c.targets[me]
	for _, s := range r.Samples {
		j, ok := slices.BinarySearchFunc(c.feps, s.Peer, cmpFEP)
		if !ok {
			res.Refused++
			c.m.refused.WithLabelValues("unknown_peer").Inc()
			continue
		}
		// Only the peers this FEP was asked to measure: a FEP cannot
		// report on pairs nobody else measures and become their hub.
		if !slices.ContainsFunc(assigned, func(t api.Target) bool { return t.ID == s.Peer }) {
			res.Refused++
			c.m.refused.WithLabelValues("unassigned_target").Inc()
			continue
		}
		if to := c.feps[j]; !s.Unreachable && c.cfg.LightBound && hasCoords(from) && hasCoords(to) {
			if lo := MinRTTms(from.Lat, from.Lon, to.Lat, to.Lon); s.RTTMS < lo {
				res.Refused++
				c.m.refused.WithLabelValues("faster_than_light").Inc()
				c.log.Warn("rtt below the speed of light refused", "fep", r.FEP, "peer", s.Peer, "rtt_ms", s.RTTMS, "min_ms", lo)
				continue
			}
		}
		at := s.At
		if at.IsZero() {
			at = c.cfg.Now()
		}
		rtts = append(rtts, store.RTT{From: r.FEP, To: s.Peer, MS: s.RTTMS, At: at.UTC(), Unreachable: s.Unreachable})
		k := [2]string{r.FEP, s.Peer}
		v := s.RTTMS
		if s.Unreachable {
			v = seenUnreachable
		}
		if old, ok := c.seen[k]; !ok || (old == seenUnreachable) != s.Unreachable ||
			!s.Unreachable && SignificantChange(old, v, c.cfg.Rel, c.cfg.AbsMS) {
			res.Changed++
		}
		c.seen[k] = v
	}
	if c.destTargets == nil {
		c.destTargets = chooseDestTargets(c.feps, c.destinationsLocked(), max(0, c.cfg.Targets.Dests))
	}
	destAssigned := c.destTargets[me]
	for _, s := range r.Destinations {
		if !known[s.Dest] {
			continue // an unknown (or deleted) destination
		}
		if !slices.ContainsFunc(destAssigned, func(d api.DestTarget) bool { return d.ID == s.Dest }) {
			res.Refused++
			c.m.refused.WithLabelValues("unassigned_target").Inc()
			continue
		}
		at := s.At
		if at.IsZero() {
			at = c.cfg.Now()
		}
		rtts = append(rtts, store.RTT{From: r.FEP, To: destKey(s.Dest), MS: s.RTTMS, At: at.UTC()})
		k := [2]string{r.FEP, destKey(s.Dest)}
		if old, ok := c.seen[k]; !ok || SignificantChange(old, s.RTTMS, c.cfg.Rel, c.cfg.AbsMS) {
			res.Changed++
		}
		c.seen[k] = s.RTTMS
	}
	c.mu.Unlock()
	if len(rtts) > 0 {
		if err := c.st.PutRTTs(ctx, rtts); err != nil {
			return api.ReportResult{}, fmt.Errorf("store rtts: %w", err)
		}
	}
	res.Accepted = len(rtts)
	c.noteReport(r.FEP, r.Stats)
	c.noteSegments(r.FEP, r.Segments)
	c.m.reports.Inc()
	c.m.samples.Add(float64(len(rtts)))
	return res, nil
}

// WaitTable implements api.Backend.
func (c *Controller) WaitTable(ctx context.Context, lop string, since uint64, epoch string) (*api.EncodedTable, error) {
	if cur := c.epoch.Load(); epoch != "" && cur != nil && *cur != epoch {
		since = 0 // the caller's table is from a store this one replaced
	} else if since > 0 {
		c.ack(lop, since)
	}
	t, err := c.cache.wait(ctx, lop, since, func() bool {
		// Not bounded by the poll's wait (which may be a millisecond): an
		// unknown LoP must get its 404 whatever the wait.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, ok, err := c.lookupFEP(lctx, lop)
		return ok || err != nil
	})
	if errors.Is(err, api.ErrNotFound) {
		return nil, fmt.Errorf("lop %s: no such fep: %w", lop, api.ErrNotFound)
	}
	return t, err
}

// Matrix implements api.Backend: the RTTs as measured, per direction.
func (c *Controller) Matrix(ctx context.Context) (api.Matrix, error) {
	feps, err := c.st.FEPs(ctx)
	if err != nil {
		return api.Matrix{}, err
	}
	rtts, err := c.st.RTTs(ctx)
	if err != nil {
		return api.Matrix{}, err
	}
	out := api.Matrix{Names: make([]string, len(feps)), RTTMS: make([][]*float64, len(feps))}
	idx := make(map[string]int, len(feps))
	for i, f := range feps {
		out.Names[i] = f.ID
		idx[f.ID] = i
		out.RTTMS[i] = make([]*float64, len(feps))
		zero := 0.0
		out.RTTMS[i][i] = &zero
	}
	for _, r := range rtts {
		i, ok1 := idx[r.From]
		j, ok2 := idx[r.To]
		if ok1 && ok2 && i != j && !r.Unreachable {
			v := r.MS
			out.RTTMS[i][j] = &v
		}
	}
	return out, nil
}

// Health implements api.Backend.
func (c *Controller) Health(ctx context.Context) api.Health {
	c.mu.Lock()
	n := len(c.feps)
	c.mu.Unlock()
	return api.Health{Status: "ok", Leader: c.IsLeader(), Version: c.cache.maxVersion(), FEPs: n}
}
