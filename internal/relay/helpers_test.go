package relay

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/testenv"
)

func testKeyring(t testing.TB) *hop.Keyring {
	t.Helper()
	kr, err := hop.NewKeyring(hop.Key{ID: 1, Secret: []byte("0123456789abcdef0123456789abcdef")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// The helpers below serve package relay's internal tests, which cannot
// import relaytest (it imports relay); the overlay tests live in package
// relay_test and use relaytest (export_test.go exports what they read).

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
		Keys:         KeysConfig{Current: &KeyConfig{ID: 1, SecretHex: hex.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))}},
		Destinations: PolicyConfig{Allow: []string{"127.0.0.0/8"}},
		Timeouts:     TimeoutConfig{Header: Duration(2 * time.Second), Connect: Duration(2 * time.Second), Idle: Duration(30 * time.Second), Drain: Duration(2 * time.Second)},
		Limits:       LimitConfig{MaxConns: 50000, MaxConnsPerSource: 50000},
	}
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

func start(t testing.TB, cfg *Config) *running {
	t.Helper()
	s, err := New(cfg, testenv.Logger(t))
	if err != nil {
		t.Fatalf("New(%s): %v", cfg.ID, err)
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

func refusals(s *Server, reason string) float64 {
	return counterValue(s.m.refusals.WithLabelValues(reason))
}

func flows(s *Server, r role, o outcome) float64 {
	return counterValue(s.m.flows.WithLabelValues(string(r), string(o)))
}

func counterValue(c *metrics.Counter) float64 { return c.Value() }

// sizeHints returns the InP lookups whose size hint came from src
// (learned_path, learned, static).
func sizeHints(s *Server, src string) float64 {
	return counterValue(s.m.sizeHints[hintSource(src)])
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

func testutilSum(s *Server, name string) float64 {
	f, _ := metrics.Find(s.m.reg.Gather(), name)
	var sum float64
	for _, m := range f.Series {
		sum += m.Value
	}
	return sum
}

func testutilDirect(s *Server, reason string) float64 {
	f, _ := metrics.Find(s.m.reg.Gather(), "mosto_relay_direct_total")
	for _, m := range f.Series {
		if m.Label("reason") == reason {
			return m.Value
		}
	}
	return 0
}
