package etcdhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Session is a lease kept alive in the background until Close, or until
// etcd cannot be reached for longer than its TTL (the lease then expired:
// Done closes).
type Session struct {
	c     *Client
	lease int64
	ttl   time.Duration
	log   *slog.Logger

	ctx    context.Context // ends when the session does
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewSession grants a lease of ttl (whole seconds, at least 1s) and keeps it
// alive, renewing every third of the TTL.
func NewSession(ctx context.Context, c *Client, ttl time.Duration, log *slog.Logger) (*Session, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ttl = max(time.Second, ttl.Round(time.Second))
	granted := time.Now()
	id, err := c.Grant(ctx, ttl)
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Session{c: c, lease: id, ttl: ttl, log: log, ctx: sctx, cancel: cancel}
	s.wg.Add(1)
	go s.keepAlive(granted)
	return s, nil
}

// Lease returns the lease id.
func (s *Session) Lease() int64 { return s.lease }

// Done is closed when the session ends (Close or lease lost).
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// keepAlive renews the lease until the session ends. expiry is the latest
// moment the lease is known to live until.
func (s *Session) keepAlive(granted time.Time) {
	defer s.wg.Done()
	defer s.cancel()
	expiry := granted.Add(s.ttl)
	wait := s.ttl / 3
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		rctx, rcancel := context.WithDeadline(s.ctx, expiry)
		ttl, err := s.c.KeepAliveOnce(rctx, s.lease)
		rcancel()
		switch {
		case err == nil:
			expiry, wait = sent.Add(ttl), ttl/3
		case errors.Is(err, ErrLeaseNotFound):
			s.log.Warn("etcd lease expired", "lease", strconv.FormatInt(s.lease, 16))
			return
		case s.ctx.Err() != nil:
			return
		case !time.Now().Before(expiry):
			s.log.Warn("etcd lease lost: not renewed within its TTL", "lease", strconv.FormatInt(s.lease, 16), "err", err)
			return
		default:
			s.log.Debug("etcd lease keepalive", "err", err)
			wait = min(s.ttl/10, time.Until(expiry))
		}
		t.Reset(max(wait, 50*time.Millisecond))
	}
}

// Close stops renewing and revokes the lease (deleting its keys), waiting
// at most until ctx ends for etcd's answer.
func (s *Session) Close(ctx context.Context) error {
	s.cancel()
	s.wg.Wait()
	if err := s.c.Revoke(ctx, s.lease); err != nil && !errors.Is(err, ErrLeaseNotFound) {
		return fmt.Errorf("etcd session close: %w", err)
	}
	return nil
}

// Election is a leader election under a key prefix, with the semantics of
// etcd's concurrency.Election: every candidate writes a key bound to its
// session's lease, the candidate whose key has the lowest create revision
// leads, and every other candidate waits for the deletion of the key just
// before its own. A crashed leader's key goes with its lease (after the
// TTL); a resigning leader deletes its key at once.
type Election struct {
	s      *Session
	prefix string
	key    string
	rev    int64 // create revision of key
}

// NewElection returns an election under prefix (keys are prefix + lease id
// in hex; a "/" is appended to prefix if missing).
func NewElection(s *Session, prefix string) *Election {
	if prefix == "" || prefix[len(prefix)-1] != '/' {
		prefix += "/"
	}
	return &Election{s: s, prefix: prefix}
}

// Key returns the candidate's key once Campaign has written it.
func (e *Election) Key() string { return e.key }

// Campaign enters the election with value val and returns once this
// candidate leads. If ctx ends or the session ends first, the candidate's
// key is deleted and an error returned.
func (e *Election) Campaign(ctx context.Context, val string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.s.ctx, cancel)
	defer stop()

	key := e.prefix + strconv.FormatInt(e.s.lease, 16)
	resp, err := e.s.c.Txn(ctx, TxnRequest{
		Compare: []Compare{CmpCreate(key, Equal, 0)},
		Success: []RequestOp{{Put: &PutRequest{Key: []byte(key), Value: []byte(val), Lease: e.s.lease}}},
		Failure: []RequestOp{OpGet(key)},
	})
	if err != nil {
		return e.campaignErr(ctx, fmt.Errorf("etcd campaign: %w", err))
	}
	e.key, e.rev = key, resp.Header.Revision
	if !resp.Succeeded {
		if len(resp.Responses) == 1 && resp.Responses[0].Range != nil && len(resp.Responses[0].Range.Kvs) == 1 {
			kv := resp.Responses[0].Range.Kvs[0]
			e.rev = kv.CreateRevision
			if string(kv.Value) != val {
				if _, err := e.s.c.Put(ctx, key, val, e.s.lease); err != nil {
					return e.campaignErr(ctx, fmt.Errorf("etcd campaign: %w", err))
				}
			}
		}
	}
	if err := e.waitPredecessors(ctx); err != nil {
		return e.campaignErr(ctx, err)
	}
	return nil
}

// campaignErr resigns after a failed campaign and says why it ended.
func (e *Election) campaignErr(ctx context.Context, err error) error {
	if e.key != "" {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.Resign(rctx)
		cancel()
	}
	if e.s.ctx.Err() != nil && ctx.Err() != nil {
		return fmt.Errorf("etcd campaign: session ended (lease lost)")
	}
	return err
}

// waitPredecessors returns once no key under the prefix was created before
// this candidate's, retrying reads and watches until ctx ends.
func (e *Election) waitPredecessors(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		resp, err := e.s.c.Range(ctx, RangeRequest{
			Key: []byte(e.prefix), RangeEnd: PrefixEnd([]byte(e.prefix)),
			MaxCreateRevision: e.rev - 1, SortOrder: SortDescend, SortTarget: SortByCreate, Limit: 1,
		})
		if err == nil && len(resp.Kvs) == 0 {
			return nil
		}
		if err == nil {
			err = e.waitDelete(ctx, string(resp.Kvs[0].Key), resp.Header.Revision)
			if err == nil {
				backoff = 100 * time.Millisecond
				continue
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		e.s.log.Debug("etcd campaign: waiting for predecessor", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// waitDelete returns once key is deleted after revision rev.
func (e *Election) waitDelete(ctx context.Context, key string, rev int64) error {
	w, err := e.s.c.Watch(ctx, WatchRequest{Key: []byte(key), StartRevision: rev + 1})
	if err != nil {
		return err
	}
	defer w.Close()
	for {
		r, err := w.Recv()
		if err != nil {
			return err
		}
		for _, ev := range r.Events {
			if ev.IsDelete() {
				return nil
			}
		}
	}
}

// Resign deletes the candidate's key (if it is still this session's), so
// the next candidate leads at once.
func (e *Election) Resign(ctx context.Context) error {
	if e.key == "" {
		return nil
	}
	_, err := e.s.c.Txn(ctx, TxnRequest{
		Compare: []Compare{CmpCreate(e.key, Equal, e.rev)},
		Success: []RequestOp{OpDelete(e.key)},
	})
	if err != nil {
		return fmt.Errorf("etcd resign: %w", err)
	}
	e.key, e.rev = "", 0
	return nil
}
