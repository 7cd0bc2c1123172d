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
	got := roundTrip(t, addr, msg)
	if sha256.Sum256(got) != sha256.Sum256(msg) {
		t.Fatalf("echo through %s: %d bytes, hash differs from the %d sent", addr, len(got), n)
	}
}

// TestHopPoolChain: with pools, flows ride pooled connections (hits on the
// InP and the TrP), bytes arrive intact, and pooled connections idle longer
// than the peer's header timeout are not killed by it (member_idle).
func TestHopPoolChain(t *testing.T) {
	testenv.CheckLeaks(t)
	o := newOrigin(t, echo)
	w := newWorld(t, o.addr(), func(c *Config) {
		c.Timeouts.Header = Duration(300 * time.Millisecond)
		c.Hop.MemberIdle = Duration(20 * time.Second)
		c.Pool.Hop = 2
		c.Pool.Origin = 1
	})
	bAddr, cAddr := w.b.HopAddr().String(), w.c.HopAddr().String()
	waitFor(t, 5*time.Second, "pools filled", func() bool {
		return w.a.out.hopPool.idleCount(bAddr) == 2 && w.b.out.hopPool.idleCount(cAddr) == 2
	})
	// Idle for more than twice the header timeout: the pooled connections
	// must survive on the receiving side.
	time.Sleep(800 * time.Millisecond)
	for i := range 3 {
		hashTrip(t, w.a.ServiceAddr(0).String(), 64<<10+i)
	}
	for _, c := range []struct {
		s    *Server
		name string
	}{{w.a.Server, "a"}, {w.b.Server, "b"}} {
		if h := poolCount(c.s, "hop", poolHit); h < 3 {
			t.Errorf("%s: %v hop pool hits; want >= 3 (misses %v, stale %v)", c.name, h, poolCount(c.s, "hop", poolMiss), poolCount(c.s, "hop", poolStale))
		}
	}
	for _, s := range w.all() {
		if n := refusals(s.Server, refuseHeaderTimeout); n != 0 {
			t.Errorf("%s: %v header timeouts; pooled connections must wait", s.cfg.ID, n)
		}
	}
	waitFor(t, 5*time.Second, "3 ok flows at the EgP", func() bool { return flows(w.c.Server, roleEgP, outcomeOK) == 3 })
	// The EgP learned the origin: later flows use its origin pool.
	waitFor(t, 5*time.Second, "origin pool filled", func() bool { return w.c.out.originPool.idleCount(o.addr()) == 1 })
	hashTrip(t, w.a.ServiceAddr(0).String(), 1000)
	if h := poolCount(w.c.Server, "origin", poolHit); h < 1 {
		t.Errorf("origin pool hits = %v; want >= 1", h)
	}
	// Every flow is counted per next hop whether its connection came from
	// a pool or a dial (the demo reads chains from this counter).
	for _, c := range []struct {
		s    *Server
		peer string
	}{{w.a.Server, "b"}, {w.b.Server, "c"}, {w.c.Server, "origin"}} {
		up := counterValue(c.s.m.upstream.WithLabelValues(c.peer, "pool")) + counterValue(c.s.m.upstream.WithLabelValues(c.peer, "dial"))
		if up != 4 {
			t.Errorf("%s: upstream flows to %s = %v; want 4", c.s.cfg.ID, c.peer, up)
		}
	}
	if p := counterValue(w.a.m.upstream.WithLabelValues("b", "pool")); p < 3 {
		t.Errorf("a: pooled upstream flows to b = %v; want >= 3", p)
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
	waitFor(t, 2*time.Second, "one header timeout (the non-member)", func() bool {
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

	waitFor(t, 3*time.Second, "pool filled", func() bool { return p.idleCount(addr) == 2 })
	// Expiry: within a few max idle ages every connection was replaced.
	waitFor(t, 3*time.Second, "connections replaced", func() bool { return accepted.Load() >= 6 })
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
	waitFor(t, 3*time.Second, "pool refilled after peer close", func() bool { return p.idleCount(addr) == 2 })
}

// TestOriginPoolDiscardsClosed: a pooled origin connection the origin
// closed (its keep-alive timeout) is discarded at use, and the flow still
// gets the origin's bytes over a fresh connection.
func TestOriginPoolDiscardsClosed(t *testing.T) {
	testenv.CheckLeaks(t)
	// The origin closes connections that stay silent for 200 ms, and
	// answers "hello" otherwise.
	o := newOrigin(t, func(c *net.TCPConn) {
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
	cfg.Services = []ServiceConfig{{Name: "svc", Listen: "127.0.0.1:0", Origin: o.addr()}}
	cfg.Pool.Origin = 1
	cfg.Pool.OriginMaxIdle = Duration(time.Minute) // expiry never hides the check at use
	s := start(t, cfg)
	for i := range 3 {
		if got := roundTrip(t, s.ServiceAddr(0).String(), []byte("x")); !bytes.Equal(got, []byte("hello")) {
			t.Fatalf("flow %d: got %q; want hello", i, got)
		}
		waitFor(t, 3*time.Second, "origin pool filled", func() bool { return s.out.originPool.idleCount(o.addr()) == 1 })
		waitDead(t, idleConns(s.out.originPool, o.addr())) // the origin closes the pooled one
	}
	if n := poolCount(s.Server, "origin", poolStale); n < 2 {
		t.Errorf("stale origin connections = %v; want >= 2", n)
	}
	waitFor(t, 5*time.Second, "3 ok flows", func() bool { return flows(s.Server, roleInP, outcomeOK) == 3 })
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
	waitFor(t, 5*time.Second, fmt.Sprintf("%d pooled connections closed by the peer", len(cs)), func() bool {
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	s := sc.(*net.TCPConn)
	start := time.Now()
	if b := queued(s, 10); b != nil || time.Since(start) > time.Second {
		t.Fatalf("queued on a silent connection = %q after %v; want nil at once", b, time.Since(start))
	}
	c.Write([]byte("hello, world"))
	waitFor(t, 2*time.Second, "bytes queued", func() bool {
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

// TestHopPoolLearnedInLargeOverlay: in an overlay of more than
// MaxPooledMembers others, a proxy keeps no pools up front and pools the
// next hops its flows use.
func TestHopPoolLearnedInLargeOverlay(t *testing.T) {
	testenv.CheckLeaks(t)
	o := newOrigin(t, echo)
	w := newWorld(t, o.addr(), func(c *Config) {
		c.Timeouts.Header = Duration(300 * time.Millisecond)
		c.Hop.MemberIdle = Duration(20 * time.Second)
		c.Pool.Hop = 2
	})
	if n := len(w.a.hopPoolTargets()); n != 2 {
		t.Fatalf("3-member overlay: %d pooled-up-front members; want 2", n)
	}
	members := map[string]string{
		"a": w.a.HopAddr().String(), "b": w.b.HopAddr().String(), "c": w.c.HopAddr().String(),
	}
	const far = "127.0.0.1:9" // never dialed: not pooled up front, never a next hop
	for i := range MaxPooledMembers {
		members[fmt.Sprintf("m%02d", i)] = far
	}
	for _, s := range w.all() {
		s.SetMembers(members)
	}
	if got := w.a.hopPoolTargets(); got != nil {
		t.Fatalf("%d-member overlay: pooled up front %v; want none", len(members), got)
	}
	bAddr, cAddr := w.b.HopAddr().String(), w.c.HopAddr().String()
	// Pools filled while the overlay was small drain only as they are used
	// or expire; what matters is that no new up-front target appears.
	hashTrip(t, w.a.ServiceAddr(0).String(), 1000)
	waitFor(t, 5*time.Second, "next hops pooled", func() bool {
		return w.a.out.hopPool.idleCount(bAddr) == 2 && w.b.out.hopPool.idleCount(cAddr) == 2
	})
	if n := w.a.out.hopPool.idleCount(far); n != 0 {
		t.Errorf("%d pooled connections to a member no flow used", n)
	}
	hits := poolCount(w.a.Server, "hop", poolHit)
	for i := range 2 {
		hashTrip(t, w.a.ServiceAddr(0).String(), 2000+i)
	}
	if h := poolCount(w.a.Server, "hop", poolHit) - hits; h < 2 {
		t.Errorf("a: %v hop pool hits after learning b; want 2", h)
	}
}
