package relay_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

func TestChainEcho(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{}, "a", "b", "c")
	msg := make([]byte, 1<<20)
	rand.Read(msg)
	got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), msg)
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo through a-b-c: got %d bytes, want %d identical", len(got), len(msg))
	}
	testenv.WaitFor(t, 5*time.Second, "flow accounting", func() bool {
		return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeOK) == 1 && relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeOK) == 1 &&
			relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK) == 1
	})
	for _, s := range w.Members {
		if n := relay.MetricSum(s, "mosto_relay_bytes_total"); n != 2<<20 {
			t.Errorf("%s bytes_total = %v; want %d", s.ID(), n, 2<<20)
		}
	}
}

func TestDirectWhenNoChain(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{}, "a", "b", "c")
	w.Members["a"].SetChains(nil)
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), []byte("hello")); string(got) != "hello" {
		t.Fatalf("direct echo = %q", got)
	}
	if n := relay.DirectCount(w.Members["a"], "no_chain"); n != 1 {
		t.Errorf("direct{no_chain} = %v; want 1", n)
	}
	if n := relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeOK); n != 0 {
		t.Errorf("b carried %v flows; want 0", n)
	}
}

// TestHalfClose checks that an EOF in one direction is passed on while the
// other direction keeps flowing, for each direction.
func TestHalfClose(t *testing.T) {
	testenv.CheckLeaks(t)
	// The origin speaks first, half-closes, then reads the client's reply.
	serverFirst := func(c *net.TCPConn) {
		c.Write([]byte("greeting"))
		c.CloseWrite()
		b, _ := io.ReadAll(c)
		if string(b) != "reply after your EOF" {
			c.SetLinger(0)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, addr string)
		h    func(c *net.TCPConn)
	}{
		{"client-closes-first", func(t *testing.T, addr string) {
			got := testenv.RoundTrip(t, addr, []byte("ping"))
			if string(got) != "ping" {
				t.Errorf("got %q; want ping", got)
			}
		}, testenv.Echo},
		{"origin-closes-first", func(t *testing.T, addr string) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(c) // ends at the origin's half-close
			if err != nil || string(got) != "greeting" {
				t.Fatalf("read = %q, %v; want greeting, EOF", got, err)
			}
			// Our direction is still open: the origin must get this.
			if _, err := c.Write([]byte("reply after your EOF")); err != nil {
				t.Fatalf("write after EOF: %v", err)
			}
			c.(*net.TCPConn).CloseWrite()
			if _, err := c.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("final read = %v; want EOF (origin got the reply and closed cleanly)", err)
			}
		}, serverFirst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := testenv.NewServer(t, tc.h)
			w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr()}, "a", "b", "c")
			tc.run(t, w.Members["a"].ServiceAddr(0).String())
		})
	}
}

// TestResetPropagates checks that an origin's reset reaches the client as a
// reset promptly.
func TestResetPropagates(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		c.Read(make([]byte, 10))
		c.SetLinger(0)
	})
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr()}, "a", "b", "c")
	c, err := net.Dial("tcp", w.Members["a"].ServiceAddr(0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("x"))
	start := time.Now()
	_, err = io.ReadAll(c)
	if !relay.IsReset(err) {
		t.Fatalf("client read = %v; want connection reset", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("reset took %v", d)
	}
	testenv.WaitFor(t, 5*time.Second, "reset outcome", func() bool { return relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeReset) == 1 })
}

// TestConcurrentFlows pushes 1,800 flows (300 with -short) with random
// payloads through the 3-proxy chain in this process, as many at once as
// the fd limit allows, in waves whose flows are all held open together; it
// checks every byte by SHA-256 in both directions, then that no fd or
// goroutine is left. The 10,000 flows open at once need several
// processes (8 sockets per flow here): TestWorkers10kFlows.
func TestConcurrentFlows(t *testing.T) {
	n := 1800
	if testing.Short() {
		n = 300
	}
	// Each flow holds 8 sockets in this process (client, origin, two per
	// proxy) plus splice pipes while bytes move.
	const fdsPerFlow = 10
	limit := testenv.RaiseFDLimit(t, uint64(fdsPerFlow*n+1024))
	testenv.CheckLeaks(t)
	conc := min(n, (int(limit)-testenv.OpenFDs(t)-512)/fdsPerFlow)
	if conc < 100 {
		testenv.Unmet(t, "RLIMIT_NOFILE %d allows only %d concurrent flows", limit, conc)
	}
	t.Logf("%d flows, %d at once (RLIMIT_NOFILE %d)", n, conc, limit)

	waves := (n + conc - 1) / conc
	barriers := make([]chan struct{}, waves)
	arrived := make([]atomic.Int64, waves)
	for i := range barriers {
		barriers[i] = make(chan struct{})
	}
	waveSize := func(w int) int64 { return int64(min(conc, n-w*conc)) }
	var (
		mu       sync.Mutex
		upSeen   = make(map[uint64][32]byte) // origin's hash of what it received
		downSent = make(map[uint64][32]byte) // origin's hash of what it sent
	)
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		h := sha256.New()
		var idb [8]byte
		if _, err := io.ReadFull(c, idb[:]); err != nil {
			return
		}
		h.Write(idb[:])
		if _, err := io.Copy(h, c); err != nil {
			return
		}
		id := binary.BigEndian.Uint64(idb[:])
		w := int(id) / conc
		if w >= waves {
			return
		}
		if arrived[w].Add(1) == waveSize(w) {
			close(barriers[w])
		}
		// Hold the flow open until its whole wave is in flight at once.
		select {
		case <-barriers[w]:
		case <-time.After(60 * time.Second):
		}
		resp := make([]byte, 512+mrand.IntN(4096))
		rand.Read(resp)
		mu.Lock()
		upSeen[id] = [32]byte(h.Sum(nil))
		downSent[id] = sha256.Sum256(resp)
		mu.Unlock()
		c.Write(resp)
	})
	// Generous handshake timeouts: the machine may be shared and -race slow.
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) {
		c.Timeouts.Header = relay.Duration(30 * time.Second)
		c.Timeouts.Connect = relay.Duration(30 * time.Second)
	}}, "a", "b", "c")
	addr := w.Members["a"].ServiceAddr(0).String()

	var (
		failures atomic.Int64
		firstErr atomic.Value
		dialSem  = make(chan struct{}, 256)
		upSent   = make([][32]byte, n)
		downSeen = make([][32]byte, n)
	)
	fail := func(err error) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	flow := func(i int) {
		dialSem <- struct{}{}
		c, err := net.DialTimeout("tcp", addr, 30*time.Second)
		<-dialSem
		if err != nil {
			fail(err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(90 * time.Second))
		msg := make([]byte, 8+mrand.IntN(4096))
		rand.Read(msg)
		binary.BigEndian.PutUint64(msg, uint64(i))
		upSent[i] = sha256.Sum256(msg)
		if _, err := c.Write(msg); err != nil {
			fail(err)
			return
		}
		c.(*net.TCPConn).CloseWrite()
		h := sha256.New()
		if _, err := io.Copy(h, c); err != nil {
			fail(err)
			return
		}
		downSeen[i] = [32]byte(h.Sum(nil))
	}
	for wv := range waves {
		var wg sync.WaitGroup
		for i := wv * conc; i < wv*conc+int(waveSize(wv)); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				flow(i)
			}()
		}
		wg.Wait()
		if f := failures.Load(); f > 0 {
			t.Fatalf("wave %d: %d flows failed; first: %v", wv, f, firstErr.Load())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	bad := 0
	for i := range n {
		if upSeen[uint64(i)] != upSent[i] || downSent[uint64(i)] != downSeen[i] {
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d flows corrupted", bad, n)
	}
	testenv.WaitFor(t, 30*time.Second, "all flows accounted", func() bool {
		return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeOK) == float64(n) &&
			relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeOK) == float64(n) &&
			relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeOK) == float64(n)
	})
}

func TestMetricsAndHealth(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) { c.Metrics.Listen = "127.0.0.1:0" }}, "a", "b", "c")
	testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), []byte("x"))
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + w.Members["a"].MetricsAddr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	testenv.WaitFor(t, 5*time.Second, "flow counted", func() bool { return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeOK) == 1 })
	_, body := get("/metrics")
	for _, want := range []string{
		`mosto_relay_flows_total{outcome="ok",role="inp"} 1`,
		`mosto_relay_bytes_total{direction="up",role="inp"} 1`,
		`mosto_relay_connect_seconds_count{peer="b"} 1`,
		`mosto_relay_upstream_total{peer="b",via="dial"} 1`,
		`mosto_relay_active_flows{role="inp"} 0`,
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestPProfOptIn checks that Go's profiles are served only with
// metrics.pprof.
func TestPProfOptIn(t *testing.T) {
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
		c.Metrics.Listen = "127.0.0.1:0"
		c.Metrics.PProf = c.ID == "a"
	}}, "a", "b", "c")
	defer http.DefaultClient.CloseIdleConnections()
	for _, tc := range []struct {
		name string
		s    *relay.Server
		want int
	}{
		{"pprof on", w.Members["a"], http.StatusOK},
		{"pprof off", w.Members["b"], http.StatusNotFound},
	} {
		resp, err := http.Get("http://" + tc.s.MetricsAddr().String() + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: GET /debug/pprof/goroutine = %d; want %d", tc.name, resp.StatusCode, tc.want)
		}
		if tc.want == http.StatusOK && !strings.Contains(string(body), "goroutine profile") {
			t.Errorf("%s: goroutine profile missing: %.200s", tc.name, body)
		}
	}
	base := "http://" + w.Members["a"].MetricsAddr().String() + "/debug/pprof/"
	for _, tc := range []struct {
		path string
		code int
		gzip bool // a protobuf profile, gzipped
	}{
		{"profile?seconds=1", http.StatusOK, true},
		{"heap", http.StatusOK, true},
		{"", http.StatusOK, false},
		{"nosuchprofile", http.StatusNotFound, false},
	} {
		resp, err := http.Get(base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("GET /debug/pprof/%s = %d; want %d", tc.path, resp.StatusCode, tc.code)
		}
		if tc.gzip && (len(body) < 2 || body[0] != 0x1f || body[1] != 0x8b) {
			t.Errorf("GET /debug/pprof/%s: %d bytes, not a gzipped profile", tc.path, len(body))
		}
	}
}

// TestIdleTimeout checks that a flow without data is closed after the idle
// TestRequestThenHalfClose sends requests of several sizes followed at once
// by a half-close, through one proxy and through a chain: the client's
// direction may be finished (or partly queued) before the relay starts, so
// this covers the EOF passed on without a goroutine, the bytes read before
// the copy goroutine starts, and the switch to splicing.
func TestRequestThenHalfClose(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr()}, "a", "b", "c")
	single := relaytest.Config("s")
	single.Hop.Listen = ""
	single.Services = []relay.ServiceConfig{{Listen: "127.0.0.1:0", Origin: o.Addr()}}
	s := relaytest.Run(t, single)
	for _, entry := range []struct {
		name string
		addr string
	}{{"direct", s.ServiceAddr(0).String()}, {"chain", w.Members["a"].ServiceAddr(0).String()}} {
		for _, size := range []int{0, 1, 64, relay.SmallCopy - 1, relay.SmallCopy, 3*relay.SmallCopy + 7, 1 << 20} {
			msg := make([]byte, size)
			rand.Read(msg)
			for i := range 3 {
				if got := testenv.RoundTrip(t, entry.addr, msg); !bytes.Equal(got, msg) {
					t.Errorf("%s: %d-byte request, try %d: echo of %d bytes differs", entry.name, size, i, len(got))
				}
			}
		}
	}
}

// TestHandshakeWorkers checks the handshake worker pool: a burst of
// handshakes that all wait (hop connections that send no header) gets one
// worker each, at most maxIdleWorkers of them stay once the burst is over,
// the proxy keeps serving, and stopping the proxy ends every worker.
func TestHandshakeWorkers(t *testing.T) {
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	cfg := relaytest.Config("s")
	cfg.Timeouts.Header = relay.Duration(300 * time.Millisecond)
	cfg.Services = []relay.ServiceConfig{{Listen: "127.0.0.1:0", Origin: o.Addr()}}
	cfg.Loops = -1                            // hop connections wait on handshake workers only without loops
	cfg.Limits.HopMaxConnsPerSource = 1 << 20 // the burst comes from one non-member address
	s := relaytest.Run(t, cfg)
	const burst = 3 * relay.MaxIdleWorkers
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range burst {
		c, err := net.Dial("tcp", s.HopAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	testenv.WaitFor(t, 5*time.Second, "header timeouts", func() bool {
		return relay.Refusals(s.Server, relay.RefuseHeaderTimeout) == burst
	})
	testenv.WaitFor(t, 5*time.Second, "idle workers", func() bool {
		return s.ActiveConns() == 0 && s.IdleWorkers() == relay.MaxIdleWorkers
	})
	if got := testenv.RoundTrip(t, s.ServiceAddr(0).String(), []byte("after the burst")); string(got) != "after the burst" {
		t.Errorf("echo after the burst = %q", got)
	}
	if n := s.IdleWorkers(); n > relay.MaxIdleWorkers {
		t.Errorf("%d idle workers; want at most %d", n, relay.MaxIdleWorkers)
	}
	if err := s.Stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := s.IdleWorkers(); n != 0 {
		t.Errorf("%d idle workers after Run returned; want 0", n)
	}
}

// TestIdleTimeoutStuckWriter checks that a flow whose origin stops reading
// (so the proxy's writes block) still ends after the idle timeout, with a
// reset towards the client.
func TestIdleTimeoutStuckWriter(t *testing.T) {
	testenv.CheckLeaks(t)
	const idle = 500 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		c.SetReadBuffer(4096)
		<-release // never reads
	})
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) { c.Timeouts.Idle = relay.Duration(idle) }}, "a", "b", "c")
	c, err := net.Dial("tcp", w.Members["a"].ServiceAddr(0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	start := time.Now()
	// Write until the buffers along the chain are full and writes block
	// (the deadline), or the proxy resets the flow.
	buf := make([]byte, 64<<10)
	var werr error
	for werr == nil {
		_, werr = c.Write(buf)
	}
	if errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Fatalf("flow not ended after %v (idle timeout %v)", time.Since(start), idle)
	}
	testenv.WaitFor(t, 5*time.Second, "idle outcome", func() bool {
		return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeIdle)+relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeIdle)+relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeIdle) >= 1
	})
}

// TestIdleTimeout checks that a quiet flow is closed after the idle
// timeout, while a slow but steady flow is not.
//
// A correct relay resets a flow only once one of its hops relayed no byte
// for the idle timeout; every hop relays the bytes of a write after the
// write started. So a steady flow reset (or a quiet one closed) less than
// the timeout after its last write (its dial) started is a bug under any
// load. A steady flow reset later than that was not kept steady: the test
// was not scheduled for the timeout on a loaded machine. Such an attempt
// says nothing; it is logged and run again, with new flows.
func TestIdleTimeout(t *testing.T) {
	testenv.CheckLeaks(t)
	const idle = 600 * time.Millisecond
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		b := make([]byte, 1)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
			c.Write(b)
		}
	})
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) { c.Timeouts.Idle = relay.Duration(idle) }}, "a", "b", "c")
	addr := w.Members["a"].ServiceAddr(0).String()
	const attempts = 5
	for i := 1; !idleAttempt(t, addr, idle, i); i++ {
		if i == attempts {
			t.Fatalf("%d attempts, in each the test was not scheduled for longer than the idle timeout %v", attempts, idle)
		}
	}
	// Every hop runs the same idle timer: whichever fires first ends the
	// flow with outcome idle and resets its neighbours (outcome reset).
	testenv.WaitFor(t, 5*time.Second, "idle outcome", func() bool {
		return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeIdle)+relay.Flows(w.Members["b"], relay.RoleTrP, relay.OutcomeIdle)+relay.Flows(w.Members["c"], relay.RoleEgP, relay.OutcomeIdle) >= 1
	})
}

// idleAttempt runs TestIdleTimeout's two flows through the echoing chain at
// addr: it fails t on a bug and returns false when the test's own delays
// make the attempt say nothing.
func idleAttempt(t *testing.T, addr string, idle time.Duration, attempt int) bool {
	t.Helper()
	prev := time.Now() // start of the steady flow's last write (its dial)
	steady, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer steady.Close()
	quietStart := time.Now()
	quiet, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	quiet.SetDeadline(time.Now().Add(20 * idle))
	quietDone := make(chan time.Duration, 1)
	go func() {
		_, err := quiet.Read(make([]byte, 1))
		if err == nil {
			err = errors.New("read data")
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			err = nil
		}
		d := time.Since(quietStart)
		if err == nil {
			d = -1 // never closed
		}
		quietDone <- d
	}()
	defer func() {
		quiet.Close()
		<-quietDone
	}()
	// One byte every idle/4 for over 2*idle keeps the steady flow alive.
	b := make([]byte, 1)
	for i := 0; i < 9; i++ {
		start := time.Now()
		steady.SetDeadline(start.Add(5 * time.Second))
		_, err := steady.Write([]byte{byte(i)})
		what := "write"
		if err == nil {
			what = "read"
			if _, err = io.ReadFull(steady, b); err == nil && b[0] != byte(i) {
				t.Fatalf("steady read %d = %d", i, b[0])
			}
		}
		if err != nil {
			since := time.Since(prev)
			if since < idle || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("steady %s %d: %v, %v after the previous write started (idle timeout %v)", what, i, err, since, idle)
			}
			t.Logf("attempt %d: steady %s %d: %v, %v after the previous write started: longer than the idle timeout %v (a loaded machine); again", attempt, what, i, err, since.Round(time.Millisecond), idle)
			return false
		}
		prev = start
		time.Sleep(idle / 4)
	}
	select {
	case d := <-quietDone:
		quietDone <- d // for the deferred wait
		switch {
		case d < 0:
			t.Fatalf("quiet flow not closed within %v (idle timeout %v)", 20*idle, idle)
		case d < idle:
			t.Fatalf("quiet flow closed after %v, before the idle timeout %v", d, idle)
		}
	case <-time.After(20 * idle):
		t.Fatalf("quiet flow not closed within %v (idle timeout %v)", 20*idle, idle)
	}
	return true
}

// TestDrain checks shutdown: listeners close at once, a flow in progress
// may finish within the drain timeout, and one that does not is reset.
func TestDrain(t *testing.T) {
	testenv.CheckLeaks(t)
	release := make(chan struct{})
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		b := make([]byte, 5)
		io.ReadFull(c, b)
		if string(b) != "quick" {
			io.Copy(io.Discard, c) // never answers
			return
		}
		<-release
		c.Write(b)
	})
	ca := relaytest.Config("a")
	ca.Hop.Listen = ""
	ca.Services = []relay.ServiceConfig{{Listen: "127.0.0.1:0", Origin: o.Addr()}}
	ca.Timeouts.Drain = relay.Duration(time.Second)
	ca.Metrics.Listen = "127.0.0.1:0"
	a := relaytest.Run(t, ca)
	addr := a.ServiceAddr(0).String()
	dial := func(msg string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte(msg))
		return c
	}
	quick, slow := dial("quick"), dial("slow!")
	quick.(*net.TCPConn).CloseWrite()
	defer quick.Close()
	defer slow.Close()
	testenv.WaitFor(t, 5*time.Second, "two active flows", func() bool { return a.ActiveConns() == 2 })
	stopped := make(chan error, 1)
	begin := time.Now()
	go func() { stopped <- a.Stop(t) }()
	testenv.WaitFor(t, 5*time.Second, "listener closed", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	// While draining, /healthz tells load balancers to go elsewhere.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := hc.Get("http://" + a.MetricsAddr().String() + "/healthz"); err != nil {
		t.Errorf("/healthz while draining: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("/healthz while draining = %d; want 503", resp.StatusCode)
		}
	}
	close(release)
	if got, err := io.ReadAll(quick); string(got) != "quick" || err != nil {
		t.Errorf("draining flow = %q, %v; want quick, nil", got, err)
	}
	_, err := io.ReadAll(slow) // the origin waits for more than the drain timeout
	if !relay.IsReset(err) {
		t.Errorf("flow past the drain timeout: %v; want reset", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run = %v", err)
	}
	if d := time.Since(begin); d < time.Second || d > 5*time.Second {
		t.Errorf("drain took %v; want about the 1 s drain timeout", d)
	}
	if n := relay.Flows(a.Server, relay.RoleInP, relay.OutcomeAborted); n != 1 {
		t.Errorf("aborted flows = %v; want 1", n)
	}
}

func TestProxyProtocolToOrigin(t *testing.T) {
	testenv.CheckLeaks(t)
	got := make(chan []byte, 1)
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		b := make([]byte, 16+12+2)
		io.ReadFull(c, b)
		got <- b
	})
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) { c.ProxyProtocol = []string{"127.0.0.1"} }}, "a", "b", "c")
	c, err := net.Dial("tcp", w.Members["a"].ServiceAddr(0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hi"))
	var b []byte
	select {
	case b = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("origin got nothing")
	}
	client := c.LocalAddr().(*net.TCPAddr)
	if !bytes.HasPrefix(b, []byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c")) {
		t.Fatalf("origin got %q; want a PROXY v2 TCP4 header", b)
	}
	if src := net.IP(b[16:20]); !src.Equal(client.IP) || int(binary.BigEndian.Uint16(b[24:26])) != client.Port {
		t.Errorf("PROXY source %v:%d; want %v", src, binary.BigEndian.Uint16(b[24:26]), client)
	}
	if string(b[28:]) != "hi" {
		t.Errorf("payload after header = %q; want hi", b[28:])
	}
}

func TestPolicyRefusesPrivateTarget(t *testing.T) {
	testenv.CheckLeaks(t)
	// The EgP allows only 127.0.0.2: the origin on 127.0.0.1 is private
	// and not named, so the flow must be refused and counted there.
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) {
		if c.ID == "c" {
			c.Destinations.Allow = []string{"127.0.0.2", "*"}
		}
	}}, "a", "b", "c")
	c, err := net.Dial("tcp", w.Members["a"].ServiceAddr(0).String())
	if err == nil { // the refusal may even beat connect's completion
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		// Or the write: the InP sends the header without waiting for the
		// client's bytes, and a reset that arrived first is the write's
		// error (which takes it: a read after it sees EOF).
		if _, err := c.Write([]byte("x")); err != nil {
			if !relay.IsReset(err) {
				t.Errorf("refused flow: write: %v; want reset", err)
			}
		} else if got, err := io.ReadAll(c); len(got) > 0 || !relay.IsReset(err) {
			t.Errorf("refused flow: read %q, %v; want reset", got, err)
		}
	} else if !relay.IsReset(err) {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "policy refusal", func() bool { return relay.Refusals(w.Members["c"], relay.RefusePolicy) == 1 })
}
