package etcdhttp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
)

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
		want    []string
	}{
		{"none", Config{}, "no endpoints", nil},
		{"empty", Config{Endpoints: []string{" "}}, "empty endpoint", nil},
		{"scheme", Config{Endpoints: []string{"unix:///x"}}, "scheme", nil},
		// The store holds the overlay keys: no scheme means https (issue 13 item 10).
		{"bare", Config{Endpoints: []string{"127.0.0.1:2379/"}}, "", []string{"https://127.0.0.1:2379"}},
		{"bare tls", Config{Endpoints: []string{"h:1"}, TLS: tlsNoCert()}, "", []string{"https://h:1"}},
		{"urls", Config{Endpoints: []string{"http://a:1", "https://b:2"}}, "", []string{"http://a:1", "https://b:2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New(%v) error = %v; want one containing %q", tt.cfg.Endpoints, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Endpoints(); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("Endpoints() = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestPrefixEnd(t *testing.T) {
	tests := []struct{ in, want string }{
		{"a", "b"}, {"/x/", "/x0"}, {"a\xff", "b"}, {"\xff\xff", "\x00"}, {"", "\x00"},
	}
	for _, tt := range tests {
		if got := string(PrefixEnd([]byte(tt.in))); got != tt.want {
			t.Errorf("PrefixEnd(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestKV(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, Config{Endpoints: etcdtest.Start(t)})
	p1, err := c.Put(ctx, "/kv/a", "1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if p1.Header.Revision <= 0 {
		t.Errorf("put revision = %d; want > 0", p1.Header.Revision)
	}
	for _, k := range []string{"/kv/b", "/kv/c", "/kw"} {
		if _, err := c.Put(ctx, k, "v"+k, 0); err != nil {
			t.Fatal(err)
		}
	}
	g, err := c.Get(ctx, "/kv/a")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "1" || g.Kvs[0].CreateRevision != p1.Header.Revision || g.Kvs[0].Version != 1 {
		t.Fatalf("Get(/kv/a) = %+v; want value 1 created at %d", g.Kvs, p1.Header.Revision)
	}
	miss, err := c.Get(ctx, "/nope")
	if err != nil || len(miss.Kvs) != 0 {
		t.Fatalf("Get(/nope) = %+v, %v; want no keys", miss, err)
	}
	pr, err := c.GetPrefix(ctx, "/kv/", true)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range pr.Kvs {
		keys = append(keys, string(kv.Key))
		if len(kv.Value) != 0 {
			t.Errorf("keys-only read returned value %q", kv.Value)
		}
	}
	if fmt.Sprint(keys) != "[/kv/a /kv/b /kv/c]" || pr.Count != 3 {
		t.Errorf("GetPrefix(/kv/) = %v (count %d); want [/kv/a /kv/b /kv/c] (3)", keys, pr.Count)
	}

	// Transactions: compare on create revision, value and mod revision;
	// nested transaction in the failure branch.
	tx, err := c.Txn(ctx, TxnRequest{
		Compare: []Compare{CmpCreate("/kv/a", Equal, 0)},
		Success: []RequestOp{OpPut("/kv/a", "2")},
		Failure: []RequestOp{OpTxn([]Compare{CmpValue("/kv/a", Less, "2")}, []RequestOp{OpPut("/kv/a", "2"), OpGet("/kv/a")}, nil)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if tx.Succeeded || len(tx.Responses) != 1 || tx.Responses[0].Txn == nil || !tx.Responses[0].Txn.Succeeded {
		t.Fatalf("txn = %+v; want failure branch whose nested txn succeeded", tx)
	}
	inner := tx.Responses[0].Txn.Responses
	if len(inner) != 2 || inner[0].Put == nil || inner[1].Range == nil || string(inner[1].Range.Kvs[0].Value) != "2" {
		t.Fatalf("nested responses = %+v; want put then range reading 2", inner)
	}
	g, _ = c.Get(ctx, "/kv/a")
	stale, err := c.Txn(ctx, TxnRequest{
		Compare: []Compare{CmpMod("/kv/a", Equal, g.Kvs[0].ModRevision-1)},
		Success: []RequestOp{OpPut("/kv/a", "3")},
	})
	if err != nil || stale.Succeeded {
		t.Fatalf("txn on a stale mod revision = %+v, %v; want not succeeded", stale, err)
	}

	d, err := c.Delete(ctx, DeleteRangeRequest{Key: []byte("/kv/"), RangeEnd: PrefixEnd([]byte("/kv/"))})
	if err != nil || d.Deleted != 3 {
		t.Fatalf("Delete(/kv/ prefix) = %+v, %v; want 3 deleted", d, err)
	}
	if g, _ := c.Get(ctx, "/kw"); len(g.Kvs) != 1 {
		t.Errorf("/kw deleted by a prefix delete of /kv/")
	}

	// Compaction: a second compaction at the same revision is refused as
	// compacted.
	if err := c.Compact(ctx, d.Header.Revision); err != nil {
		t.Fatal(err)
	}
	err = c.Compact(ctx, d.Header.Revision)
	if !IsCompacted(err) {
		t.Errorf("second Compact(%d) = %v; want a compacted error", d.Header.Revision, err)
	}

	// A transaction above etcd's operation limit is refused with etcd's message.
	var many []RequestOp
	for i := range 200 {
		many = append(many, OpGet(fmt.Sprint(i)))
	}
	_, err = c.Txn(ctx, TxnRequest{Success: many})
	var ee *Error
	if !errors.As(err, &ee) || !strings.Contains(ee.Message, "too many operations") {
		t.Errorf("Txn(200 ops) error = %v; want etcd's too many operations", err)
	}
}

func TestCompareValidation(t *testing.T) {
	if _, err := (Compare{Result: Equal, Target: "BOGUS"}).MarshalJSON(); err == nil {
		t.Error("compare with a bad target encoded")
	}
	if _, err := (Compare{Result: "~", Target: TargetMod}).MarshalJSON(); err == nil {
		t.Error("compare with a bad result encoded")
	}
}

func TestLease(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, Config{Endpoints: etcdtest.Start(t)})
	id, err := c.Grant(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/lease/k", "v", id); err != nil {
		t.Fatal(err)
	}
	ttl, err := c.KeepAliveOnce(ctx, id)
	if err != nil || ttl < time.Second {
		t.Fatalf("KeepAliveOnce = %v, %v; want >= 1s (etcd may raise it to its minimum)", ttl, err)
	}
	if err := c.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	if g, _ := c.Get(ctx, "/lease/k"); len(g.Kvs) != 0 {
		t.Error("key of a revoked lease still there")
	}
	if _, err := c.KeepAliveOnce(ctx, id); !errors.Is(err, ErrLeaseNotFound) {
		t.Errorf("KeepAliveOnce(revoked) = %v; want ErrLeaseNotFound", err)
	}
	if err := c.Revoke(ctx, id); !errors.Is(err, ErrLeaseNotFound) {
		t.Errorf("Revoke(revoked) = %v; want ErrLeaseNotFound", err)
	}
}

func TestWatch(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, Config{Endpoints: etcdtest.Start(t)})
	w, err := c.Watch(ctx, WatchRequest{Key: []byte("/w/"), RangeEnd: PrefixEnd([]byte("/w/"))})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := c.Put(ctx, "/w/a", "1", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "/x", "outside", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, DeleteRangeRequest{Key: []byte("/w/a")}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		r, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range r.Events {
			got = append(got, fmt.Sprintf("%v %s=%s", ev.IsDelete(), ev.Kv.Key, ev.Kv.Value))
		}
	}
	if want := "[false /w/a=1 true /w/a=]"; fmt.Sprint(got) != want {
		t.Errorf("events = %v; want %s", got, want)
	}

	// Closing ends Recv.
	done := make(chan error, 1)
	go func() { _, err := w.Recv(); done <- err }()
	w.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Recv after Close returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked 5s after Close")
	}

	// A watch from a compacted revision is refused.
	p, _ := c.Put(ctx, "/w/b", "1", 0)
	if _, err := c.Put(ctx, "/w/b", "2", 0); err != nil {
		t.Fatal(err)
	}
	last, _ := c.Put(ctx, "/w/b", "3", 0)
	if err := c.Compact(ctx, last.Header.Revision); err != nil {
		t.Fatal(err)
	}
	// etcd confirms the creation, then cancels: the error comes from Watch
	// or from the first Recv.
	wc, err := c.Watch(ctx, WatchRequest{Key: []byte("/w/b"), StartRevision: p.Header.Revision})
	if err == nil {
		_, err = wc.Recv()
		wc.Close()
	}
	var ce *CompactedError
	if !errors.As(err, &ce) || !errors.Is(err, ErrWatchCanceled) || ce.CompactRevision != last.Header.Revision {
		t.Errorf("Watch(compacted rev) = %v; want CompactedError at %d", err, last.Header.Revision)
	}

	// Cancelling the context ends a blocked Recv.
	wctx, cancel := context.WithCancel(ctx)
	w2, err := c.Watch(wctx, WatchRequest{Key: []byte("/never")})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	go func() { _, err := w2.Recv(); done <- err }()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Recv after cancel returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked 5s after cancel")
	}
}

// TestFailover: a dead endpoint first in the list costs one refused dial;
// every request then goes to the live one.
func TestFailover(t *testing.T) {
	ctx := ctxT(t)
	live := etcdtest.Start(t)
	c := newClient(t, Config{Endpoints: []string{etcdtest.DeadEndpoint(t), live[0]}, DialTimeout: time.Second})
	if _, err := c.Put(ctx, "/f", "1", 0); err != nil {
		t.Fatalf("Put with a dead first endpoint: %v", err)
	}
	if _, err := c.Txn(ctx, TxnRequest{Success: []RequestOp{OpPut("/f", "2")}}); err != nil {
		t.Fatalf("Txn after failover: %v", err)
	}
	w, err := c.Watch(ctx, WatchRequest{Key: []byte("/f")})
	if err != nil {
		t.Fatalf("Watch after failover: %v", err)
	}
	w.Close()

	all := newClient(t, Config{Endpoints: []string{etcdtest.DeadEndpoint(t), etcdtest.DeadEndpoint(t)}, DialTimeout: time.Second})
	_, err = all.Get(ctx, "/f")
	if err == nil || !strings.Contains(err.Error(), "every endpoint failed") {
		t.Errorf("Get with only dead endpoints = %v; want every endpoint failed", err)
	}
}

// TestErrors: gateway errors keep etcd's code and message; garbage answers
// are errors, not panics; a hung server is cut by the request timeout.
func TestErrors(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v3/kv/range":
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"code":14,"message":"etcdserver: no leader","details":[]}`)
		case "/v3/kv/put":
			fmt.Fprint(w, `{"header":{"revision":12}}`) // unquoted int64: not the gateway's form
		case "/v3/kv/txn":
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, `<html>proxy error</html>`)
		case "/v3/watch":
			fmt.Fprint(w, `{"error":{"code":7,"message":"etcdserver: permission denied"}}`+"\n")
		default:
			<-block
		}
	}))
	defer srv.Close()
	defer close(block)
	ctx := ctxT(t)
	c := newClient(t, Config{Endpoints: []string{srv.URL}, RequestTimeout: 300 * time.Millisecond})
	_, err := c.Get(ctx, "k")
	var ee *Error
	if !errors.As(err, &ee) || ee.Code != codeUnavailable || ee.Message != "etcdserver: no leader" {
		t.Errorf("Get = %v; want *Error code 14 no leader", err)
	}
	if _, err := c.Put(ctx, "k", "v", 0); err == nil || !strings.Contains(err.Error(), "decode response") {
		t.Errorf("Put with a malformed answer = %v; want a decode error", err)
	}
	if _, err := c.Txn(ctx, TxnRequest{}); err == nil || !strings.Contains(err.Error(), "502") {
		t.Errorf("Txn with a non-JSON 502 = %v; want the HTTP status", err)
	}
	if _, err := c.Watch(ctx, WatchRequest{Key: []byte("k")}); !errors.As(err, &ee) || ee.Code != 7 {
		t.Errorf("Watch refused in-stream = %v; want *Error code 7", err)
	}
	start := time.Now()
	if err := c.Compact(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Compact on a hung server = %v; want deadline exceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("request timeout of 300ms took %v", d)
	}
}

func TestTLS(t *testing.T) {
	ctx := ctxT(t)
	eps, files := etcdtest.StartTLS(t)
	cfg, err := TLSConfig(files.CA, files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, Config{Endpoints: eps, TLS: cfg})
	if _, err := c.Put(ctx, "/tls", "1", 0); err != nil {
		t.Fatalf("Put over mutual TLS: %v", err)
	}
	w, err := c.Watch(ctx, WatchRequest{Key: []byte("/tls")})
	if err != nil {
		t.Fatalf("Watch over mutual TLS: %v", err)
	}
	w.Close()

	noCert, err := TLSConfig(files.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	bad := newClient(t, Config{Endpoints: eps, TLS: noCert})
	if _, err := bad.Get(ctx, "/tls"); err == nil {
		t.Error("Get without a client certificate succeeded")
	}
	if _, err := TLSConfig(files.CA, files.Cert, ""); err == nil {
		t.Error("TLSConfig with a certificate but no key succeeded")
	}
	if _, err := TLSConfig(files.Key, "", ""); err == nil {
		t.Error("TLSConfig with a key as CA succeeded")
	}
}

func tlsNoCert() *tls.Config { return &tls.Config{} }

// TestElection: candidates lead in order; a resigning leader hands over at
// once, a crashed one (keepalive stopped, lease not revoked) after its TTL;
// a cancelled campaign leaves no key behind; no goroutine is left.
func TestElection(t *testing.T) {
	ctx := ctxT(t)
	eps := etcdtest.Start(t)
	c := newClient(t, Config{Endpoints: eps})

	session := func() *Session {
		t.Helper()
		s, err := NewSession(ctx, c, time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sa, sb, sc := session(), session(), session()
	ea, eb, ec := NewElection(sa, "/el"), NewElection(sb, "/el"), NewElection(sc, "/el")
	if err := ea.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	campaign := func(e *Election, val string) chan error {
		ch := make(chan error, 1)
		go func() { ch <- e.Campaign(ctx, val) }()
		return ch
	}
	// b queues behind a, c behind b.
	bdone := campaign(eb, "b")
	// c campaigns once b's key is in the queue.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if g, err := c.GetPrefix(ctx, "/el/", false); err == nil && len(g.Kvs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's campaign key not in the election after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cctx, ccancel := context.WithCancel(ctx)
	cdone := make(chan error, 1)
	go func() { cdone <- ec.Campaign(cctx, "c") }()
	expectBlocked := func(name string, ch chan error) {
		t.Helper()
		select {
		case err := <-ch:
			t.Fatalf("%s's campaign returned (%v) while another leads", name, err)
		case <-time.After(300 * time.Millisecond):
		}
	}
	expectBlocked("b", bdone)
	expectBlocked("c", cdone)

	// The leader lasts past several TTLs while its session renews.
	time.Sleep(2500 * time.Millisecond)
	expectBlocked("b", bdone)

	// c gives up: its key goes at once.
	ccancel()
	if err := <-cdone; err == nil {
		t.Fatal("cancelled campaign returned no error")
	}
	if g, _ := c.GetPrefix(ctx, "/el/", false); len(g.Kvs) != 2 {
		t.Errorf("after c's cancelled campaign %d keys under /el/; want 2", len(g.Kvs))
	}

	// a resigns: b leads at once.
	start := time.Now()
	if err := ea.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-bdone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b did not lead within 5s of a resigning")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("handover after resign took %v; want well under the 1s TTL", d)
	}

	// b crashes (stops renewing without revoking): a campaigns again and
	// leads once b's lease expires.
	adone := campaign(ea, "a2")
	expectBlocked("a", adone)
	start = time.Now()
	sb.cancel()
	sb.wg.Wait()
	select {
	case err := <-adone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a did not lead within 10s of b crashing with a 1s lease")
	}
	t.Logf("takeover after a crash: %v", time.Since(start))

	for _, s := range []*Session{sa, sb, sc} {
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for clientGoroutines() != "" && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := clientGoroutines(); left != "" {
		t.Errorf("client goroutines left after closing everything:\n%s", left)
	}
}

// clientGoroutines returns the stacks of goroutines of this package or of
// HTTP client connections (the embedded etcd server's are not counted).
func clientGoroutines() string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "etcdhttp.Test") || strings.Contains(g, "testing.tRunner") && !strings.Contains(g, "etcdhttp.") {
			continue
		}
		if strings.Contains(g, "mosto/internal/etcdhttp.") || strings.Contains(g, "net/http.(*persistConn)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestSessionLost: a session whose lease is revoked behind its back ends.
func TestSessionLost(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, Config{Endpoints: etcdtest.Start(t)})
	s, err := NewSession(ctx, c, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if err := c.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("session still live 5s after its lease was revoked")
	}
	e := NewElection(s, "/lost")
	if err := e.Campaign(ctx, "x"); err == nil {
		t.Error("campaign on an ended session succeeded")
	}
}

// TestLeakCheckSees: the goroutine check used above does see a live
// session's keepalive (so it can fail).
func TestLeakCheckSees(t *testing.T) {
	ctx := ctxT(t)
	c := newClient(t, Config{Endpoints: etcdtest.Start(t)})
	s, err := NewSession(ctx, c, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if left := clientGoroutines(); !strings.Contains(left, "etcdhttp.NewSession") { // the keepalive goroutine, running or not yet started
		t.Errorf("live session's keepalive not seen by clientGoroutines:\n%s", left)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
