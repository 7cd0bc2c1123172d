package relay

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/testenv"
)

// oldPeer is a hop listener of a relay that does not know the pool hello:
// it reads a hop header's fixed part and resets anything that is not a
// PROXY v2 signature.
type oldPeer struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func newOldPeer(t *testing.T) *oldPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &oldPeer{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				var b [16]byte
				io.ReadFull(c, b[:])
				resetClose(c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

// TestPoolHelloOldPeer: a member that does not answer the hello is not
// pooled (counted unsupported once, no redial storm) and a flow to it is a
// plain pool miss that dials.
func TestPoolHelloOldPeer(t *testing.T) {
	testenv.CheckLeaks(t)
	peer := newOldPeer(t)
	s, err := New(baseConfig("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := peer.ln.Addr().String()
	p := newConnPool("hop", 2, 10*time.Second, s.dialPooled, func() []string { return []string{addr} }, s.m.pool, s.log)
	p.hello = s.poolHelloDial
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { p.run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()

	testenv.WaitFor(t, 3*time.Second, "hello refused", func() bool { return poolCount(s, "hop", poolUnsupported) >= 1 })
	time.Sleep(300 * time.Millisecond) // several maintenance ticks
	if n := peer.accepted.Load(); n > 2 {
		t.Errorf("old peer saw %d connections; want <= 2 (pool size), no redials before poolRetry", n)
	}
	if n := p.idleCount(addr); n != 0 {
		t.Errorf("idle = %d; want 0", n)
	}
	if c := p.get(addr); c != nil {
		c.Close()
		t.Error("get returned a connection to a peer without pool support")
	}
}

// TestPoolHelloGrant: a member's answer bounds the pooled connection's
// life (its member_idle, or DefaultPoolGrant), and a garbled answer is
// refused.
func TestPoolHelloGrant(t *testing.T) {
	testenv.CheckLeaks(t)
	for _, tc := range []struct {
		name       string
		memberIdle time.Duration
		want       time.Duration
	}{
		{"default", 0, DefaultPoolGrant},
		{"member_idle", 7 * time.Second, 7 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig("b", "a")
			cfg.Members["a"] = "127.0.0.1:9"
			cfg.Hop.MemberIdle = Duration(tc.memberIdle)
			b := start(t, cfg)
			c, err := net.Dial("tcp", b.HopAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got, err := writePoolHello(c.(*net.TCPConn), 2*time.Second)
			if err != nil || got != tc.want {
				t.Errorf("grant = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	// A peer answering something else.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.ReadFull(c, make([]byte, 16))
		c.Write([]byte("HTTP/1.1"))
		c.Close()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if g, err := writePoolHello(c.(*net.TCPConn), 2*time.Second); err == nil {
		t.Errorf("garbled answer accepted: grant %v", g)
	}
	<-done
}

// TestPoolRetriesSoon: a member that refuses connections for a moment (a
// restart) is dialed again after a short backoff, not a maintenance tick
// later, so its pool refills at once when it listens again; while it
// refuses, the pool does not spin.
func TestPoolRetriesSoon(t *testing.T) {
	testenv.CheckLeaks(t)
	// The target's port is held by a bound socket that does not listen: it
	// refuses connections (RST) for now, and no other socket (an outgoing
	// connection of another test process) can take the port before it
	// listens again.
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	held := os.NewFile(uintptr(fd), "held port")
	defer held.Close()
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
	s, err := New(baseConfig("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// maxIdle 40 s: a maintenance tick every 10 s.
	var dials atomic.Int64
	dial := func(ctx context.Context, a string) (*net.TCPConn, error) {
		dials.Add(1)
		return s.dialPooled(ctx, a)
	}
	p := newConnPool("hop", 2, 40*time.Second, dial, func() []string { return []string{addr} }, s.m.pool, s.log)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { p.run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	time.Sleep(500 * time.Millisecond)
	if n := dials.Load(); n < 4 || n > 40 {
		t.Errorf("%d dials in 500 ms to a refusing target; want a few retries with backoff (4-40)", n)
	}
	if err := unix.Listen(fd, 16); err != nil {
		t.Fatal(err)
	}
	ln2, err := net.FileListener(held)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln2.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		ln2.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	}()
	testenv.WaitFor(t, 2*time.Second, "pool filled after the target came back", func() bool { return p.idleCount(addr) == 2 })
}
