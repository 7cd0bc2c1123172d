package etcdstore

import (
	"context"
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

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// Config configures Open.
type Config struct {
	Endpoints   []string
	Prefix      string        // default "/mosto/"
	ID          string        // this controller's name in the election; default the hostname-free "controller"
	SessionTTL  time.Duration // leader lease; a crashed leader is replaced after at most this; default 5s
	DialTimeout time.Duration // default 5s
	Log         *slog.Logger
}

// Store is an etcd-backed store.
type Store struct {
	cli    *clientv3.Client
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
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:          cfg.Endpoints,
		DialTimeout:        cfg.DialTimeout,
		MaxCallRecvMsgSize: 1 << 30,
		Logger:             nopZap(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client %v: %w", cfg.Endpoints, err)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
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
	return s.cli.Close()
}

func (s *Store) k(parts ...string) string { return s.prefix + strings.Join(parts, "/") }

// PutFEP registers or updates f.
func (s *Store) PutFEP(ctx context.Context, f api.FEP) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.k("fep", f.ID), string(b)); err != nil {
		return fmt.Errorf("etcd put fep %s: %w", f.ID, err)
	}
	return nil
}

// DeleteFEP removes the FEP id and every RTT from or to it.
func (s *Store) DeleteFEP(ctx context.Context, id string) error {
	keys, err := s.cli.Get(ctx, s.k("rtt")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("etcd list rtts: %w", err)
	}
	ops := []clientv3.Op{clientv3.OpDelete(s.k("fep", id)), clientv3.OpDelete(s.k("rtt", id)+"/", clientv3.WithPrefix())}
	suffix := "/" + id
	for _, kv := range keys.Kvs {
		k := string(kv.Key)
		if strings.HasSuffix(k, suffix) && !strings.HasPrefix(k, s.k("rtt", id)+"/") {
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	// A transaction holds at most 128 operations by default: delete the FEP
	// (guarded by its existence) first, then the rest in chunks.
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(s.k("fep", id)), ">", 0)).Then(ops[:2]...).Commit()
	if err != nil {
		return fmt.Errorf("etcd delete fep %s: %w", id, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("fep %s: %w", id, store.ErrNotFound)
	}
	for rest := ops[2:]; len(rest) > 0; {
		n := min(len(rest), 100)
		if _, err := s.cli.Txn(ctx).Then(rest[:n]...).Commit(); err != nil {
			return fmt.Errorf("etcd delete rtts to %s: %w", id, err)
		}
		rest = rest[n:]
	}
	return nil
}

// FEPs lists the FEPs sorted by id.
func (s *Store) FEPs(ctx context.Context) ([]api.FEP, error) {
	resp, err := s.cli.Get(ctx, s.k("fep")+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
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
	ops := make([]clientv3.Op, 0, len(rtts))
	for _, r := range rtts {
		ops = append(ops, clientv3.OpGet(s.k("rtt", r.From, r.To)))
	}
	for attempt := 0; attempt < 10; attempt++ {
		got, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("etcd read rtts: %w", err)
		}
		var cmps []clientv3.Cmp
		var puts []clientv3.Op
		for i, r := range rtts {
			key := s.k("rtt", r.From, r.To)
			kvs := got.Responses[i].GetResponseRange().Kvs
			if len(kvs) > 0 {
				var old store.RTT
				if json.Unmarshal(kvs[0].Value, &old) == nil && old.At.After(r.At) {
					continue
				}
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision))
			} else {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			}
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			puts = append(puts, clientv3.OpPut(key, string(b)))
		}
		if len(puts) == 0 {
			return nil
		}
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
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
	resp, err := s.cli.Get(ctx, s.k("rtt")+"/", clientv3.WithPrefix())
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
	resp, err := s.cli.Put(ctx, s.k("version"), s.id)
	if err != nil {
		return 0, fmt.Errorf("etcd next version: %w", err)
	}
	// Every computation rewrites large tables: drop the history older than
	// the previous version, so etcd does not grow to its quota. Watches start
	// at the current revision and do not need it.
	if prev := s.lastVersion.Swap(resp.Header.Revision); prev > 0 {
		if _, err := s.cli.Compact(ctx, prev); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
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
	puts := []clientv3.Op{clientv3.OpPut(tv, padVersion(t.Version)), clientv3.OpPut(tk, string(val))}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(tv), "=", 0)).
		Then(puts...).
		Else(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(tv), "<", padVersion(t.Version))}, puts, nil)).
		Commit()
	if err != nil {
		return false, fmt.Errorf("etcd put table %s: %w", t.LoP, err)
	}
	if resp.Succeeded {
		return true, nil
	}
	return resp.Responses[0].GetResponseTxn().Succeeded, nil
}

// TableVersions returns the stored version of every LoP's table, from the
// small tv/ index.
func (s *Store) TableVersions(ctx context.Context) (map[string]uint64, error) {
	idx, err := s.cli.Get(ctx, s.k("tv")+"/", clientv3.WithPrefix())
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
		ops := make([]clientv3.Op, n)
		for i, lop := range lops[:n] {
			ops[i] = clientv3.OpGet(s.k("table", lop))
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("etcd get tables: %w", err)
		}
		for i, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().Kvs {
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
	if _, err := s.cli.Put(ctx, s.k("keys"), string(b)); err != nil {
		return fmt.Errorf("etcd put keys: %w", err)
	}
	return nil
}

// PutToken stores a join token record.
func (s *Store) PutToken(ctx context.Context, t store.Token) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.k("token", t.ID), string(b)); err != nil {
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
		txn, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return store.Token{}, fmt.Errorf("etcd use token: %w", err)
		}
		if txn.Succeeded {
			return t, nil
		}
	}
}

// Watch merges etcd watches on FEPs, RTTs, table versions and keys into
// coalesced notifications until ctx is done, the store is closed or one of
// the etcd watches ends (then the caller should watch again and reload).
func (s *Store) Watch(ctx context.Context) <-chan store.Change {
	out := make(chan store.Change, 1)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	stop := context.AfterFunc(s.ctx, cancel)
	type src struct {
		ch   clientv3.WatchChan
		kind store.Change
	}
	srcs := []src{
		{s.cli.Watch(wctx, s.k("fep")+"/", clientv3.WithPrefix()), store.ChangeFEPs},
		{s.cli.Watch(wctx, s.k("rtt")+"/", clientv3.WithPrefix()), store.ChangeRTTs},
		{s.cli.Watch(wctx, s.k("tv")+"/", clientv3.WithPrefix()), store.ChangeTables},
		{s.cli.Watch(wctx, s.k("keys")), store.ChangeKeys},
	}
	var fan sync.WaitGroup
	merged := make(chan store.Change)
	for _, sr := range srcs {
		fan.Add(1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer fan.Done()
			for resp := range sr.ch {
				if resp.Err() != nil {
					s.log.Warn("etcd watch error", "err", resp.Err())
					continue
				}
				select {
				case merged <- sr.kind:
				case <-wctx.Done():
					return
				}
			}
			// One watch ended (compaction, lost connection): end them
			// all, so the caller sees the channel close and watches again.
			cancel()
		}()
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
			sendChange(out, c)
		}
	}()
	return out
}

func sendChange(ch chan store.Change, c store.Change) {
	for {
		select {
		case ch <- c:
			return
		default:
		}
		select {
		case old := <-ch:
			c |= old
		default:
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
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(int(max(1, s.ttl/time.Second))))
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	el := concurrency.NewElection(sess, s.k("election"))
	cctx, ccancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, ccancel)
	err = el.Campaign(cctx, s.id)
	stop()
	ccancel()
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("etcd campaign: %w", err)
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
		el.Resign(rctx)
		rcancel()
		sess.Close()
	}()
	return lctx, nil
}
