package relay

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

const testKeyHex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

func testKeyring(t testing.TB) *hop.Keyring {
	t.Helper()
	kr, err := hop.NewKeyring(hop.Key{ID: 1, Secret: []byte("0123456789abcdef0123456789abcdef")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// baseConfig is a loopback-only config for FEP id with every listener on
// an ephemeral port. Members are placeholders until SetMembers.
func baseConfig(id string, ids ...string) *Config {
	members := map[string]string{}
	for _, m := range ids {
		members[m] = "127.0.0.1:9"
	}
	return &Config{
		ID:           id,
		Hop:          HopConfig{Listen: "127.0.0.1:0"},
		Members:      members,
		Keys:         KeysConfig{Current: &KeyConfig{ID: 1, SecretHex: hexOf("0123456789abcdef0123456789abcdef")}},
		Destinations: PolicyConfig{Allow: []string{"127.0.0.0/8"}},
		Timeouts:     TimeoutConfig{Header: Duration(2 * time.Second), Connect: Duration(2 * time.Second), Idle: Duration(30 * time.Second), Drain: Duration(2 * time.Second)},
		Limits:       LimitConfig{MaxConns: 50000, MaxConnsPerSource: 50000},
	}
}

func hexOf(s string) string {
	const digits = "0123456789abcdef"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteByte(digits[s[i]>>4])
		b.WriteByte(digits[s[i]&15])
	}
	return b.String()
}

// testLogger writes Warn and above to the test log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// running is a Server started by start; stop drains it and waits for Run.
type running struct {
	*Server
	cancel context.CancelFunc
	done   chan error
}

func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30 s after cancel")
		return nil
	}
}

func start(t testing.TB, cfg *Config, opts ...func(*Server)) *running {
	t.Helper()
	s, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatalf("New(%s): %v", cfg.ID, err)
	}
	for _, o := range opts {
		o(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Server: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// chainTable is a ChainSource answering one fixed path for any size.
type chainTable map[[2]string][]string

func (c chainTable) Lookup(from, to string, size int64) (pathcomp.ChainEntry, bool) {
	p, ok := c[[2]string{from, to}]
	if !ok {
		return pathcomp.ChainEntry{}, false
	}
	return pathcomp.ChainEntry{From: from, To: to, Path: p, Rounds: 1}, true
}

// world is an InP "a", a TrP "b" and an EgP "c" on loopback, with the
// chain a-b-c, a service on a towards origin.
type world struct {
	a, b, c *running
}

func newWorld(t testing.TB, origin string, tweak func(*Config), opts ...func(*Server)) *world {
	t.Helper()
	ca := baseConfig("a", "b", "c")
	ca.Egress.Default = "c"
	ca.Services = []ServiceConfig{{Name: "svc", Listen: "127.0.0.1:0", Origin: origin, Size: 1000}}
	cb := baseConfig("b", "a", "c")
	cc := baseConfig("c", "a", "b")
	for _, c := range []*Config{ca, cb, cc} {
		if tweak != nil {
			tweak(c)
		}
	}
	w := &world{a: start(t, ca, opts...), b: start(t, cb, opts...), c: start(t, cc, opts...)}
	members := map[string]string{
		"a": w.a.HopAddr().String(), "b": w.b.HopAddr().String(), "c": w.c.HopAddr().String(),
	}
	for _, s := range []*running{w.a, w.b, w.c} {
		s.SetMembers(members)
		s.SetChains(chainTable{{"a", "c"}: {"a", "b", "c"}})
	}
	return w
}

func (w *world) all() []*running { return []*running{w.a, w.b, w.c} }

// origin is a loopback TCP server running handle for every connection.
type origin struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newOrigin(t testing.TB, handle func(c *net.TCPConn)) *origin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &origin{ln: ln}
	o.wg.Add(1)
	go o.serve(handle)
	t.Cleanup(o.close)
	return o
}

func (o *origin) serve(handle func(c *net.TCPConn)) {
	defer o.wg.Done()
	for {
		c, err := o.ln.Accept()
		if err != nil {
			return
		}
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			defer c.Close()
			handle(c.(*net.TCPConn))
		}()
	}
}

func (o *origin) close() {
	o.ln.Close()
	o.wg.Wait()
}

func (o *origin) addr() string { return o.ln.Addr().String() }

// echo copies everything back and half-closes after EOF.
func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

func refusals(s *Server, reason string) float64 {
	return counterValue(s.m.refusals.WithLabelValues(reason))
}

func flows(s *Server, r role, o outcome) float64 {
	return counterValue(s.m.flows.WithLabelValues(string(r), string(o)))
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// roundTrip sends msg through addr, half-closes and returns the echo.
func roundTrip(t testing.TB, addr string, msg []byte) []byte {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return got
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// bulkEcho writes n random bytes to c (an echo through the relay) while
// reading them back, and fails unless they come back exact.
func bulkEcho(t *testing.T, c net.Conn, n int) {
	t.Helper()
	msg := make([]byte, n)
	rand.Read(msg)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		errc <- err
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read bulk echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(msg) {
		t.Fatal("bulk echo differs")
	}
}

// dialPing connects to addr (an echo through the relay, closed when the
// test ends), and fails unless "ping" comes back.
func dialPing(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo = %q, %v", b, err)
	}
	return c
}
