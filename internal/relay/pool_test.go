package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/testenv"
)

func poolCount(s *Server, pool, result string) float64 {
	return counterValue(s.m.pool.WithLabelValues(pool, result))
}

// hashTrip sends n random bytes through addr to an echo origin and checks
// the echo's hash.
func hashTrip(t testing.TB, addr string, n int) {
	t.Helper()
	msg := make([]byte, n)
	rand.Read(msg)
	got := testenv.RoundTrip(t, addr, msg)
	if sha256.Sum256(got) != sha256.Sum256(msg) {
		t.Fatalf("echo through %s: %d bytes, hash differs from the %d sent", addr, len(got), n)
	}
}

// TestMemberIdleOnlyForMembers: an idle connection from a member's address
// waits past the header timeout; one from any other address is refused by
// the header timeout (no slowloris through member_idle).
func TestMemberIdleOnlyForMembers(t *testing.T) {
	testenv.CheckLeaks(t)
	cfg := baseConfig("b", "a")
	cfg.Timeouts.Header = Duration(300 * time.Millisecond)
	cfg.Hop.MemberIdle = Duration(20 * time.Second)
	cfg.Members["a"] = "127.0.0.1:9" // member "a" lives at 127.0.0.1
	b := start(t, cfg)
	tests := []struct {
		name      string
		from      string
		wantAlive bool
	}{
		{"member address", "127.0.0.1", true},
		{"other address", "127.0.0.2", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(tc.from)}}
			c, err := d.Dial("tcp", b.HopAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
			_, err = c.Read(make([]byte, 1))
			var ne net.Error
			alive := err != nil && errors.As(err, &ne) && ne.Timeout()
			if alive != tc.wantAlive {
				t.Errorf("idle connection from %s: read err %v (alive %v); want alive %v", tc.from, err, alive, tc.wantAlive)
			}
		})
	}
	// A loop counts the refusal right after it closed the connection.
	testenv.WaitFor(t, 2*time.Second, "one header timeout (the non-member)", func() bool {
		return refusals(b.Server, refuseHeaderTimeout) == 1
	})
	time.Sleep(50 * time.Millisecond)
	if n := refusals(b.Server, refuseHeaderTimeout); n != 1 {
		t.Errorf("header timeouts = %v; want 1 (the non-member)", n)
	}
}

// TestPoolRefillAndExpiry: the pool keeps size connections per target,
// replaces them before max idle age, and discards ones the peer closed.
func TestPoolRefillAndExpiry(t *testing.T) {
	testenv.CheckLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var mu sync.Mutex
	var peers []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			peers = append(peers, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range peers {
			c.Close()
		}
		mu.Unlock()
	})
	s, err := New(baseConfig("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := ln.Addr().String()
	p := newConnPool("test", 2, 400*time.Millisecond, s.dialPooled, func() []string { return []string{addr} }, s.m.pool, s.log)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { p.run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()

	testenv.WaitFor(t, 3*time.Second, "pool filled", func() bool { return p.idleCount(addr) == 2 })
	// Expiry: within a few max idle ages every connection was replaced.
	testenv.WaitFor(t, 3*time.Second, "connections replaced", func() bool { return accepted.Load() >= 6 })
	if n := p.idleCount(addr); n > 2 {
		t.Errorf("idle = %d; want <= 2", n)
	}
	// The peer closes everything: get must not hand out a closed connection.
	pooled := idleConns(p, addr)
	mu.Lock()
	for _, c := range peers {
		c.Close()
	}
	peers = nil
	mu.Unlock()
	waitDead(t, pooled)
	if c := p.get(addr); c != nil {
		if !alive(c) {
			t.Error("get returned a connection the peer had closed")
		}
		c.Close()
	}
	testenv.WaitFor(t, 3*time.Second, "pool refilled after peer close", func() bool { return p.idleCount(addr) == 2 })
}

// TestOriginPoolDiscardsClosed: a pooled origin connection the origin
// closed (its keep-alive timeout) is discarded at use, and the flow still
// gets the origin's bytes over a fresh connection.
func TestOriginPoolDiscardsClosed(t *testing.T) {
	testenv.CheckLeaks(t)
	// The origin closes connections that stay silent for 200 ms, and
	// answers "hello" otherwise.
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		c.SetReadDeadline(time.Time{})
		io.Copy(io.Discard, c)
		c.Write([]byte("hello"))
	})
	cfg := baseConfig("c")
	cfg.Services = []ServiceConfig{{Name: "svc", Listen: "127.0.0.1:0", Origin: o.Addr()}}
	cfg.Pool.Origin = 1
	cfg.Pool.OriginMaxIdle = Duration(time.Minute) // expiry never hides the check at use
	s := start(t, cfg)
	for i := range 3 {
		if got := testenv.RoundTrip(t, s.ServiceAddr(0).String(), []byte("x")); !bytes.Equal(got, []byte("hello")) {
			t.Fatalf("flow %d: got %q; want hello", i, got)
		}
		testenv.WaitFor(t, 3*time.Second, "origin pool filled", func() bool { return s.out.originPool.idleCount(o.Addr()) == 1 })
		waitDead(t, idleConns(s.out.originPool, o.Addr())) // the origin closes the pooled one
	}
	if n := poolCount(s.Server, "origin", poolStale); n < 2 {
		t.Errorf("stale origin connections = %v; want >= 2", n)
	}
	testenv.WaitFor(t, 5*time.Second, "3 ok flows", func() bool { return flows(s.Server, roleInP, outcomeOK) == 3 })
}

// idleConns returns the connections p holds idle for addr now.
func idleConns(p *connPool, addr string) []*net.TCPConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	var cs []*net.TCPConn
	for _, pc := range p.idle[addr] {
		cs = append(cs, pc.c)
	}
	return cs
}

// waitDead waits until none of cs looks usable any more (its peer's FIN
// or reset arrived, or it was closed).
func waitDead(t *testing.T, cs []*net.TCPConn) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("%d pooled connections closed by the peer", len(cs)), func() bool {
		for _, c := range cs {
			if alive(c) {
				return false
			}
		}
		return true
	})
}

// TestPoolConfig checks the validation of the pool section.
func TestPoolConfig(t *testing.T) {
	tests := []struct {
		name    string
		pool    PoolConfig
		wantErr string
	}{
		{"off", PoolConfig{}, ""},
		{"sized", PoolConfig{Hop: 4, Origin: 2, HopMaxIdle: Duration(time.Second)}, ""},
		{"negative", PoolConfig{Hop: -1}, "pool: hop and origin"},
		{"too large", PoolConfig{Origin: MaxPool + 1}, "pool: hop and origin"},
		{"tiny idle", PoolConfig{Hop: 1, HopMaxIdle: Duration(time.Millisecond)}, "pool.hop_max_idle"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig("a")
			cfg.Pool = tc.pool
			err := cfg.Validate()
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate(%+v) = %v; want error containing %q", tc.pool, err, tc.wantErr)
			}
		})
	}
}

// TestQueued: queued returns the bytes already received without waiting,
// and nil at once when there are none.
func TestQueued(t *testing.T) {
	c, s := testenv.TCPPair(t)
	start := time.Now()
	if b := queued(s, 10); b != nil || time.Since(start) > time.Second {
		t.Fatalf("queued on a silent connection = %q after %v; want nil at once", b, time.Since(start))
	}
	c.Write([]byte("hello, world"))
	testenv.WaitFor(t, 2*time.Second, "bytes queued", func() bool {
		n, _ := s.SyscallConn()
		avail := 0
		n.Control(func(fd uintptr) { avail, _ = unixInq(fd) })
		return avail == 12
	})
	if b := queued(s, 5); string(b) != "hello" {
		t.Errorf("queued(max 5) = %q; want hello", b)
	}
	if b := queued(s, 100); string(b) != ", world" {
		t.Errorf("queued(max 100) = %q; want \", world\"", b)
	}
}

func unixInq(fd uintptr) (int, error) { return unix.IoctlGetInt(int(fd), unix.SIOCINQ) }

// TestEarlyWait: service entries wait for the client's first bytes only
// with Fast Open or an explicit timeouts.early.
func TestEarlyWait(t *testing.T) {
	tests := []struct {
		name     string
		fastOpen bool
		early    time.Duration
		want     time.Duration
	}{
		{"plain", false, 0, 0},
		{"fast open default", true, 0, DefaultEarlyWait},
		{"fast open set", true, 5 * time.Millisecond, 5 * time.Millisecond},
		{"set without fast open", false, 3 * time.Millisecond, 3 * time.Millisecond},
	}
	for _, tc := range tests {
		cfg := baseConfig("a")
		cfg.Socket.FastOpen, cfg.Timeouts.Early = tc.fastOpen, Duration(tc.early)
		if got := cfg.earlyWait(); got != tc.want {
			t.Errorf("%s: earlyWait() = %v; want %v", tc.name, got, tc.want)
		}
	}
}
