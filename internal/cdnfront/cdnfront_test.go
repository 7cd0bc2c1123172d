package cdnfront

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/origin/origintest"
	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/transfer"
)

func TestRender(t *testing.T) {
	conf, err := Render(Config{Listen: "127.0.0.1:8080", Origin: "10.77.0.9:80", IdleTimeout: 1500 * time.Millisecond}, "/tmp/x")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"listen 127.0.0.1:8080 ", "server 10.77.0.9:80 ", "keepalive 32;", "keepalive_timeout 1500ms;",
		"proxy_buffering off;", "proxy_http_version 1.1;", `proxy_set_header Connection "";`,
		"worker_processes 1;", "pid /tmp/x/nginx.pid;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
	bad := []struct {
		name string
		cfg  Config
		dir  string
	}{
		{"no listen", Config{Origin: "a:1"}, "/d"},
		{"no origin port", Config{Listen: "a:1", Origin: "a"}, "/d"},
		{"injection", Config{Listen: "a:1", Origin: "a:1; include /etc/passwd"}, "/d"},
		{"negative", Config{Listen: "a:1", Origin: "a:1", Keepalive: -1}, "/d"},
		{"tiny timeout", Config{Listen: "a:1", Origin: "a:1", IdleTimeout: time.Microsecond}, "/d"},
		{"bad dir", Config{Listen: "a:1", Origin: "a:1"}, "/d;x"},
		{"no dir", Config{Listen: "a:1", Origin: "a:1"}, ""},
	}
	for _, tc := range bad {
		if _, err := Render(tc.cfg, tc.dir); err == nil {
			t.Errorf("Render(%s) succeeded; want error", tc.name)
		}
	}
}

// countingListener counts accepted connections and how many of them have
// been closed.
type countingListener struct {
	net.Listener
	n      atomic.Int64
	closed atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.n.Add(1)
	return &countedConn{Conn: c, closed: &l.closed}, nil
}

// countedConn counts its first Close in closed.
type countedConn struct {
	net.Conn
	closed *atomic.Int64
	once   sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.closed.Add(1) })
	return c.Conn.Close()
}

// TestFrontWarmCold runs a real nginx on loopback in front of an origin: quick
// fetches share one upstream connection (warm); once nginx has closed it after
// the idle timeout, the next fetch opens a new one (cold). Every body is
// hash-checked.
//
// On a loaded machine the test itself may not run for longer than the idle
// timeout between two fetches, and nginx then rightly opens a new upstream
// connection: such a round is logged and repeated (a relay that never keeps
// the connection fails every round). The cold fetch waits for the origin to
// see nginx close the idle connection instead of sleeping.
func TestFrontWarmCold(t *testing.T) {
	testenv.CheckLeaks(t)
	nginx := testenv.RequireCommand(t, "nginx")
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: raw}
	origintest.Serve(t, origin.Config{}, ln)

	const idle = time.Second
	dir := t.TempDir()
	cfg := Config{Listen: testenv.FreeAddr(t), Origin: raw.Addr().String(), IdleTimeout: idle, Nginx: nginx, Dir: dir}
	if os.Geteuid() == 0 {
		cfg.User = "root root"
	}
	f, err := Start(context.Background(), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Stop() })

	c := &transfer.Client{Addr: f.Addr()}
	// fetch returns how long the test was away from nginx's upstream
	// connection: from the previous fetch's end to this one's start.
	var last time.Time
	fetch := func(size int64) time.Duration {
		t.Helper()
		gap := time.Duration(0)
		if !last.IsZero() {
			gap = time.Since(last)
		}
		if _, err := c.Object(context.Background(), size, uint64(size)); err != nil {
			t.Fatalf("fetch %d through nginx: %v", size, err)
		}
		last = time.Now()
		return gap
	}
	// idleClosed waits until nginx has closed every upstream connection.
	idleClosed := func() {
		t.Helper()
		testenv.WaitFor(t, idle+20*time.Second, "nginx closing its idle upstream connection", func() bool {
			return ln.closed.Load() == ln.n.Load()
		})
	}
	warm := false
	for round := 1; round <= 5 && !warm; round++ {
		before := ln.n.Load()
		g1, g2, g3 := fetch(10_000), fetch(2_000_000), fetch(1)
		opened := ln.n.Load() - before
		maxGap := max(g1, g2, g3) // g1 is 0 in a fresh round: no upstream connection yet
		switch {
		case opened == 1:
			warm = true
		case maxGap < idle/2:
			t.Fatalf("round %d: 3 quick fetches (gaps <= %v) opened %d upstream connections; want 1 (warm keep-alive)", round, maxGap, opened)
		default:
			t.Logf("round %d: %d upstream connections, but the test was away %v (idle timeout %v): load, retrying", round, opened, maxGap, idle)
			idleClosed()
			last = time.Time{}
		}
	}
	if !warm {
		t.Fatalf("no round of 3 fetches kept one upstream connection (machine too loaded to tell)")
	}
	idleClosed()
	before := ln.n.Load()
	fetch(50_000)
	if n := ln.n.Load() - before; n != 1 {
		t.Errorf("after nginx closed the idle upstream connection a fetch opened %d connections; want 1 (cold)", n)
	}
	if err := f.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if _, err := net.DialTimeout("tcp", cfg.Listen, time.Second); err == nil {
		t.Errorf("nginx still accepts after Stop")
	}
	if _, err := os.Stat(filepath.Join(dir, "nginx.conf")); err != nil {
		t.Errorf("config file missing in the given Dir: %v", err)
	}
	if err := f.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestStartFails(t *testing.T) {
	nginx := testenv.RequireCommand(t, "nginx")
	// Port already taken: nginx exits and the error carries its log.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := Config{Listen: busy.Addr().String(), Origin: "127.0.0.1:1", Nginx: nginx}
	if os.Geteuid() == 0 {
		cfg.User = "root root"
	}
	_, err = Start(context.Background(), cfg, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Start on a busy port = %v; want an error quoting nginx's log", err)
	}
	if _, err := Start(context.Background(), Config{Listen: "127.0.0.1:1", Origin: "127.0.0.1:2", Nginx: "/nonexistent/nginx"}, nil, nil); err == nil {
		t.Errorf("Start with a missing binary succeeded")
	}
}
