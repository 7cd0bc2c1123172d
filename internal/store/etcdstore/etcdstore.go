package etcdstore

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/etcdhttp"
	"github.com/mosto-net/mosto/internal/store"
)

// Config configures Open.
type Config struct {
	Endpoints   []string
	Prefix      string        // default "/mosto/"
	ID          string        // this controller's name in the election; default the hostname-free "controller"
	SessionTTL  time.Duration // leader lease; a crashed leader is replaced after at most this; default 5s
	DialTimeout time.Duration // per endpoint; default 5s
	// RequestTimeout bounds one etcd request; default 30s.
	RequestTimeout time.Duration
	// TLS, if set, is used for https endpoints (etcd's CA in RootCAs, a
	// client certificate in Certificates); see etcdhttp.TLSConfig.
	TLS *tls.Config
	Log *slog.Logger
}

// Store is an etcd-backed store.
type Store struct {
	cli    *etcdhttp.Client
	prefix string
	id     string
	ttl    time.Duration
	log    *slog.Logger

	lastVersion atomic.Int64 // revision of the previous NextVersion, compacted at the next

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // leadership and watch goroutines
}

// Open connects to etcd and checks that it answers.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcdstore: no endpoints")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/mosto/"
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.ID == "" {
		cfg.ID = "controller"
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 5 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cli, err := etcdhttp.New(etcdhttp.Config{
		Endpoints:      cfg.Endpoints,
		TLS:            cfg.TLS,
		DialTimeout:    cfg.DialTimeout,
		RequestTimeout: cfg.RequestTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client %v: %w", cfg.Endpoints, err)
	}
	// Enough time to try every endpoint, each of which may time out.
	pctx, cancel := context.WithTimeout(ctx, time.Duration(len(cfg.Endpoints)+1)*cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, cfg.Prefix+"version"); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd %v: %w", cfg.Endpoints, err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	return &Store{cli: cli, prefix: cfg.Prefix, id: cfg.ID, ttl: cfg.SessionTTL, log: cfg.Log, ctx: sctx, cancel: scancel}, nil
}

// Close stops leadership and watches and closes the client.
func (s *Store) Close() error {
	s.cancel()
	s.wg.Wait()
	s.cli.Close()
	return nil
}

func (s *Store) k(parts ...string) string { return s.prefix + strings.Join(parts, "/") }

// PutFEP registers or updates f.
func (s *Store) PutFEP(ctx context.Context, f api.FEP) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.k("fep", f.ID), string(b), 0); err != nil {
		return fmt.Errorf("etcd put fep %s: %w", f.ID, err)
	}
	return nil
}

// DeleteFEP removes the FEP id and every RTT from or to it.
func (s *Store) DeleteFEP(ctx context.Context, id string) error {
	keys, err := s.cli.GetPrefix(ctx, s.k("rtt")+"/", true)
	if err != nil {
		return fmt.Errorf("etcd list rtts: %w", err)
	}
	ops := []etcdhttp.RequestOp{etcdhttp.OpDelete(s.k("fep", id)), etcdhttp.OpDeletePrefix(s.k("rtt", id) + "/")}
	suffix := "/" + id
	for _, kv := range keys.Kvs {
		k := string(kv.Key)
		if strings.HasSuffix(k, suffix) && !strings.HasPrefix(k, s.k("rtt", id)+"/") {
			ops = append(ops, etcdhttp.OpDelete(k))
		}
	}
	// A transaction holds at most 128 operations by default: delete the FEP
	// (guarded by its existence) first, then the rest in chunks.
	resp, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{
		Compare: []etcdhttp.Compare{etcdhttp.CmpCreate(s.k("fep", id), etcdhttp.Greater, 0)},
		Success: ops[:2],
	})
	if err != nil {
		return fmt.Errorf("etcd delete fep %s: %w", id, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("fep %s: %w", id, store.ErrNotFound)
	}
	for rest := ops[2:]; len(rest) > 0; {
		n := min(len(rest), 100)
		if _, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{Success: rest[:n]}); err != nil {
			return fmt.Errorf("etcd delete rtts to %s: %w", id, err)
		}
		rest = rest[n:]
	}
	return nil
}

// FEPs lists the FEPs sorted by id.
func (s *Store) FEPs(ctx context.Context) ([]api.FEP, error) {
	resp, err := s.cli.GetPrefix(ctx, s.k("fep")+"/", false)
	if err != nil {
		return nil, fmt.Errorf("etcd list feps: %w", err)
	}
	out := make([]api.FEP, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var f api.FEP
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			return nil, fmt.Errorf("decode fep %s: %w", kv.Key, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// PutDestination registers or replaces the destination d.ID.
func (s *Store) PutDestination(ctx context.Context, d api.Destination) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.k("dest", d.ID), string(b), 0); err != nil {
		return fmt.Errorf("etcd put destination %s: %w", d.ID, err)
	}
	return nil
}

// DeleteDestination removes the destination id and every RTT to it. The
// RTTs go first, in transactions of up to 100 keys, and the destination
// last (guarded by its existence): a failure part way leaves the
// destination registered, so the caller sees the error and may retry, and
// a destination is never gone while RTTs to it stay behind (they would
// come back with a destination registered again under the same id).
func (s *Store) DeleteDestination(ctx context.Context, id string) error {
	key := s.k("dest", id)
	got, err := s.cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("etcd get destination %s: %w", id, err)
	}
	if len(got.Kvs) == 0 {
		return fmt.Errorf("destination %s: %w", id, store.ErrNotFound)
	}
	keys, err := s.cli.GetPrefix(ctx, s.k("rtt")+"/", true)
	if err != nil {
		return fmt.Errorf("etcd list rtts: %w", err)
	}
	var ops []etcdhttp.RequestOp
	suffix := "/" + store.DestPrefix + id
	for _, kv := range keys.Kvs {
		if k := string(kv.Key); strings.HasSuffix(k, suffix) {
			ops = append(ops, etcdhttp.OpDelete(k))
		}
	}
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{Success: ops[:n]}); err != nil {
			return fmt.Errorf("etcd delete rtts to destination %s: %w", id, err)
		}
		ops = ops[n:]
	}
	resp, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{
		Compare: []etcdhttp.Compare{etcdhttp.CmpCreate(key, etcdhttp.Greater, 0)},
		Success: []etcdhttp.RequestOp{etcdhttp.OpDelete(key)},
	})
	if err != nil {
		return fmt.Errorf("etcd delete destination %s: %w", id, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("destination %s: %w", id, store.ErrNotFound)
	}
	return nil
}

// Destinations lists the registered destinations sorted by id.
func (s *Store) Destinations(ctx context.Context) ([]api.Destination, error) {
	resp, err := s.cli.GetPrefix(ctx, s.k("dest")+"/", false)
	if err != nil {
		return nil, fmt.Errorf("etcd list destinations: %w", err)
	}
	out := make([]api.Destination, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var d api.Destination
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			return nil, fmt.Errorf("decode destination %s: %w", kv.Key, err)
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// PutRTTs stores the newest RTT of each pair. Samples are written in
// transactions of up to 100 keys; a sample older than the stored one is
// skipped (checked per key, so concurrent writers never go backwards).
func (s *Store) PutRTTs(ctx context.Context, rtts []store.RTT) error {
	for len(rtts) > 0 {
		n := min(len(rtts), 100)
		if err := s.putRTTChunk(ctx, rtts[:n]); err != nil {
			return err
		}
		rtts = rtts[n:]
	}
	return nil
}

func (s *Store) putRTTChunk(ctx context.Context, rtts []store.RTT) error {
	ops := make([]etcdhttp.RequestOp, 0, len(rtts))
	for _, r := range rtts {
		ops = append(ops, etcdhttp.OpGet(s.k("rtt", r.From, r.To)))
	}
	for attempt := 0; attempt < 10; attempt++ {
		got, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{Success: ops})
		if err != nil {
			return fmt.Errorf("etcd read rtts: %w", err)
		}
		if len(got.Responses) != len(rtts) {
			return fmt.Errorf("etcd read rtts: %d answers to %d reads", len(got.Responses), len(rtts))
		}
		var cmps []etcdhttp.Compare
		var puts []etcdhttp.RequestOp
		for i, r := range rtts {
			key := s.k("rtt", r.From, r.To)
			kvs := rangeKvs(got.Responses[i])
			if len(kvs) > 0 {
				var old store.RTT
				if json.Unmarshal(kvs[0].Value, &old) == nil && old.At.After(r.At) {
					continue
				}
				cmps = append(cmps, etcdhttp.CmpMod(key, etcdhttp.Equal, kvs[0].ModRevision))
			} else {
				cmps = append(cmps, etcdhttp.CmpCreate(key, etcdhttp.Equal, 0))
			}
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			puts = append(puts, etcdhttp.OpPut(key, string(b)))
		}
		if len(puts) == 0 {
			return nil
		}
		resp, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{Compare: cmps, Success: puts})
		if err != nil {
			return fmt.Errorf("etcd put rtts: %w", err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return errors.New("etcd put rtts: too much contention")
}

// RTTs returns every stored RTT.
func (s *Store) RTTs(ctx context.Context) ([]store.RTT, error) {
	resp, err := s.cli.GetPrefix(ctx, s.k("rtt")+"/", false)
	if err != nil {
		return nil, fmt.Errorf("etcd list rtts: %w", err)
	}
	out := make([]store.RTT, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r store.RTT
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("decode rtt %s: %w", kv.Key, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// NextVersion writes the version key; the etcd revision of that write is
// unique and greater than every earlier one, whoever wrote it.
func (s *Store) NextVersion(ctx context.Context) (uint64, error) {
	resp, err := s.cli.Put(ctx, s.k("version"), s.id, 0)
	if err != nil {
		return 0, fmt.Errorf("etcd next version: %w", err)
	}
	// Every computation rewrites large tables: drop the history older than
	// the previous version, so etcd does not grow to its quota. Watches start
	// at the current revision and do not need it.
	if prev := s.lastVersion.Swap(resp.Header.Revision); prev > 0 {
		if err := s.cli.Compact(ctx, prev); err != nil && !etcdhttp.IsCompacted(err) {
			s.log.Warn("etcd compaction", "revision", prev, "err", err)
		}
	}
	return uint64(resp.Header.Revision), nil
}

func padVersion(v uint64) string { return fmt.Sprintf("%020d", v) }

// PutTables writes each table whose version is greater than the stored one
// (compared inside an etcd transaction), eight at a time.
func (s *Store) PutTables(ctx context.Context, ts []store.Table) (int, error) {
	var (
		mu       sync.Mutex
		written  int
		firstErr error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, 8)
	for _, t := range ts {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ok, err := s.putTable(ctx, t)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if ok {
				written++
			}
		}()
	}
	wg.Wait()
	return written, firstErr
}

func (s *Store) putTable(ctx context.Context, t store.Table) (bool, error) {
	tv, tk := s.k("tv", t.LoP), s.k("table", t.LoP)
	val := make([]byte, 8+len(t.Data))
	binary.BigEndian.PutUint64(val, t.Version)
	copy(val[8:], t.Data)
	puts := []etcdhttp.RequestOp{etcdhttp.OpPut(tv, padVersion(t.Version)), etcdhttp.OpPut(tk, string(val))}
	resp, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{
		Compare: []etcdhttp.Compare{etcdhttp.CmpCreate(tv, etcdhttp.Equal, 0)},
		Success: puts,
		Failure: []etcdhttp.RequestOp{etcdhttp.OpTxn([]etcdhttp.Compare{etcdhttp.CmpValue(tv, etcdhttp.Less, padVersion(t.Version))}, puts, nil)},
	})
	if err != nil {
		return false, fmt.Errorf("etcd put table %s: %w", t.LoP, err)
	}
	if resp.Succeeded {
		return true, nil
	}
	if len(resp.Responses) != 1 || resp.Responses[0].Txn == nil {
		return false, fmt.Errorf("etcd put table %s: malformed answer", t.LoP)
	}
	return resp.Responses[0].Txn.Succeeded, nil
}

// TableVersions returns the stored version of every LoP's table, from the
// small tv/ index.
func (s *Store) TableVersions(ctx context.Context) (map[string]uint64, error) {
	idx, err := s.cli.GetPrefix(ctx, s.k("tv")+"/", false)
	if err != nil {
		return nil, fmt.Errorf("etcd list table versions: %w", err)
	}
	out := make(map[string]uint64, len(idx.Kvs))
	for _, kv := range idx.Kvs {
		v, err := strconv.ParseUint(string(kv.Value), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("table version %s: %w", kv.Key, err)
		}
		out[strings.TrimPrefix(string(kv.Key), s.k("tv")+"/")] = v
	}
	return out, nil
}

// Tables returns the stored tables of lops, sorted by LoP, fetched in
// transactions of up to 64 reads.
func (s *Store) Tables(ctx context.Context, lops []string) ([]store.Table, error) {
	out := make([]store.Table, 0, len(lops))
	for len(lops) > 0 {
		n := min(len(lops), 64)
		ops := make([]etcdhttp.RequestOp, n)
		for i, lop := range lops[:n] {
			ops[i] = etcdhttp.OpGet(s.k("table", lop))
		}
		resp, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{Success: ops})
		if err != nil {
			return nil, fmt.Errorf("etcd get tables: %w", err)
		}
		if len(resp.Responses) != n {
			return nil, fmt.Errorf("etcd get tables: %d answers to %d reads", len(resp.Responses), n)
		}
		for i, r := range resp.Responses {
			for _, kv := range rangeKvs(r) {
				if len(kv.Value) < 8 {
					return nil, fmt.Errorf("table %s: short record", lops[i])
				}
				out = append(out, store.Table{LoP: lops[i], Version: binary.BigEndian.Uint64(kv.Value), Data: kv.Value[8:]})
			}
		}
		lops = lops[n:]
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LoP < out[j].LoP })
	return out, nil
}

// Keys returns the HMAC keys, or store.ErrNotFound.
func (s *Store) Keys(ctx context.Context) (store.Keys, error) {
	var k store.Keys
	resp, err := s.cli.Get(ctx, s.k("keys"))
	if err != nil {
		return k, fmt.Errorf("etcd get keys: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return k, fmt.Errorf("keys: %w", store.ErrNotFound)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &k); err != nil {
		return k, fmt.Errorf("decode keys: %w", err)
	}
	return k, nil
}

// PutKeys replaces the HMAC keys.
func (s *Store) PutKeys(ctx context.Context, k store.Keys) error {
	b, err := json.Marshal(k)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.k("keys"), string(b), 0); err != nil {
		return fmt.Errorf("etcd put keys: %w", err)
	}
	return nil
}

// PutRevocation records a revoked certificate.
func (s *Store) PutRevocation(ctx context.Context, r store.Revocation) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.k("revoked", r.Serial), string(b), 0); err != nil {
		return fmt.Errorf("etcd put revocation: %w", err)
	}
	return nil
}

// Revocations lists the revoked certificates.
func (s *Store) Revocations(ctx context.Context) ([]store.Revocation, error) {
	resp, err := s.cli.GetPrefix(ctx, s.k("revoked")+"/", false)
	if err != nil {
		return nil, fmt.Errorf("etcd list revocations: %w", err)
	}
	out := make([]store.Revocation, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r store.Revocation
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("decode revocation %s: %w", kv.Key, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// PutToken stores a join token record.
func (s *Store) PutToken(ctx context.Context, t store.Token) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.k("token", t.ID), string(b), 0); err != nil {
		return fmt.Errorf("etcd put token: %w", err)
	}
	return nil
}

// UseToken marks the token id used (compare-and-swap on its revision).
func (s *Store) UseToken(ctx context.Context, id string, now time.Time) (store.Token, error) {
	key := s.k("token", id)
	for {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return store.Token{}, fmt.Errorf("etcd get token: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return store.Token{}, fmt.Errorf("token: %w", store.ErrNotFound)
		}
		var t store.Token
		if err := json.Unmarshal(resp.Kvs[0].Value, &t); err != nil {
			return store.Token{}, fmt.Errorf("decode token: %w", err)
		}
		if t.Used {
			return store.Token{}, fmt.Errorf("token: %w", store.ErrTokenUsed)
		}
		if !now.Before(t.Expires) {
			return store.Token{}, fmt.Errorf("token: %w", store.ErrTokenExpired)
		}
		t.Used = true
		b, err := json.Marshal(t)
		if err != nil {
			return store.Token{}, err
		}
		txn, err := s.cli.Txn(ctx, etcdhttp.TxnRequest{
			Compare: []etcdhttp.Compare{etcdhttp.CmpMod(key, etcdhttp.Equal, resp.Kvs[0].ModRevision)},
			Success: []etcdhttp.RequestOp{etcdhttp.OpPut(key, string(b))},
		})
		if err != nil {
			return store.Token{}, fmt.Errorf("etcd use token: %w", err)
		}
		if txn.Succeeded {
			return t, nil
		}
	}
}

// Watch merges etcd watches on FEPs, RTTs, table versions, keys and
// destinations into coalesced notifications until ctx is done, the store is
// closed or one of the etcd watches ends (then the caller should watch
// again and reload). The etcd watches are created before Watch returns; if one cannot be, the
// channel is closed at once.
func (s *Store) Watch(ctx context.Context) <-chan store.Change {
	out := make(chan store.Change, 1)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	srcs := []struct {
		prefix bool
		key    string
		kind   store.Change
	}{
		{true, s.k("fep") + "/", store.ChangeFEPs},
		{true, s.k("rtt") + "/", store.ChangeRTTs},
		{true, s.k("tv") + "/", store.ChangeTables},
		{false, s.k("keys"), store.ChangeKeys},
		{true, s.k("dest") + "/", store.ChangeDests},
		{true, s.k("revoked") + "/", store.ChangeFEPs},
	}
	var fan sync.WaitGroup
	merged := make(chan store.Change)
	for _, sr := range srcs {
		req := etcdhttp.WatchRequest{Key: []byte(sr.key)}
		if sr.prefix {
			req.RangeEnd = etcdhttp.PrefixEnd(req.Key)
		}
		w, err := s.cli.Watch(wctx, req)
		if err != nil {
			if wctx.Err() == nil {
				s.log.Warn("etcd watch", "key", sr.key, "err", err)
			}
			cancel()
			break
		}
		fan.Add(1)
		s.wg.Add(1)
		go s.forward(wctx, cancel, w, sr.kind, merged, &fan)
	}
	s.wg.Add(2)
	go func() { // closes merged once every source ended
		defer s.wg.Done()
		fan.Wait()
		close(merged)
	}()
	go func() { // owned by ctx: forwards, coalescing, to out
		defer s.wg.Done()
		defer close(out)
		defer stop()
		defer cancel()
		for c := range merged {
			store.SendMerged(out, c)
		}
	}()
	return out
}

// forward sends kind to merged for every event of w. When w ends
// (compaction, lost connection) it cancels every watch of the set, so the
// caller sees the channel close and watches again.
func (s *Store) forward(ctx context.Context, cancel context.CancelFunc, w *etcdhttp.Watcher, kind store.Change, merged chan<- store.Change, fan *sync.WaitGroup) {
	defer s.wg.Done()
	defer fan.Done()
	defer cancel()
	defer w.Close()
	for {
		resp, err := w.Recv()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("etcd watch ended", "err", err)
			}
			return
		}
		if len(resp.Events) == 0 {
			continue
		}
		select {
		case merged <- kind:
		case <-ctx.Done():
			return
		}
	}
}

// Lead campaigns in the election and returns once this controller leads. The
// returned context ends when ctx ends (the controller resigns), when the
// lease is lost or when the store is closed.
func (s *Store) Lead(ctx context.Context) (context.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sess, err := etcdhttp.NewSession(ctx, s.cli, s.ttl, s.log)
	if err != nil {
		return nil, err
	}
	closeSession := func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer rcancel()
		if err := sess.Close(rctx); err != nil {
			s.log.Debug("etcd session close", "err", err)
		}
	}
	el := etcdhttp.NewElection(sess, s.k("election"))
	cctx, ccancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, ccancel)
	err = el.Campaign(cctx, s.id)
	stop()
	ccancel()
	if err != nil {
		closeSession()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("etcd campaign: %w", ctx.Err())
		}
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	s.wg.Add(1)
	go func() { // owned by ctx, the session and the store
		defer s.wg.Done()
		select {
		case <-lctx.Done():
		case <-sess.Done():
			s.log.Warn("etcd leader lease lost", "id", s.id)
		case <-s.ctx.Done():
		}
		cancel()
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := el.Resign(rctx); err != nil {
			s.log.Debug("etcd resign", "err", err)
		}
		rcancel()
		closeSession()
	}()
	return lctx, nil
}

// rangeKvs returns the keys read by one read of a transaction (none if the
// answer is not a read).
func rangeKvs(r etcdhttp.ResponseOp) []etcdhttp.KeyValue {
	if r.Range == nil {
		return nil
	}
	return r.Range.Kvs
}
