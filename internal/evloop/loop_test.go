//go:build linux

package evloop

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/testenv"
)

// checkEnd checks a flow's end: outcome want and, for OK, no error.
func checkEnd(t testing.TB, e doneCall, want Outcome) {
	t.Helper()
	if e.o != want {
		t.Errorf("flow %d: outcome %v (err %v); want %v", e.rec.id, e.o, e.err, want)
	}
	if want == OK && (e.err != nil || e.copyErr != nil) {
		t.Errorf("flow %d: err %v, copy err %v; want none", e.rec.id, e.err, e.copyErr)
	}
	if n := e.rec.dones.Load(); n != 1 {
		t.Errorf("flow %d: Done/Handover called %d times; want 1", e.rec.id, n)
	}
}

// moved returns the bytes a flow moved each way, the loop's and, for a
// handed-over flow, the handler's copy's.
func moved(e doneCall) (up, down int64) {
	return e.st.Up + int64(e.toUp) + e.copyUp, e.st.Down + int64(e.toDown) + e.copyDown
}

func waitFlows(t testing.TB, ls *Loops, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for ls.Flows() != want {
		if time.Now().After(deadline) {
			t.Fatalf("Flows() = %d; want %d", ls.Flows(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitSocket waits until fd is readable or has an error or hangup pending
// (a FIN or RST arrived), without consuming anything.
func waitSocket(t testing.TB, fd int, what string) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := unix.Poll(fds, 100)
		if err != nil && err != unix.EINTR {
			t.Fatalf("poll: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitRetries waits until the handler's Retry was called n times.
func waitRetries(t testing.TB, h *testHandler, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(h.retryErrors()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("Retry called %d times; want %d", len(h.retryErrors()), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestRoundTrip(t *testing.T) {
	testenv.CheckLeaks(t)
	sizes := []int{0, 1, 16383, 16384, 16385, 1 << 20}
	for _, bulk := range []bool{false, true} {
		for _, n := range sizes {
			t.Run(fmt.Sprintf("bulk=%v/size=%d", bulk, n), func(t *testing.T) {
				roundTrip(t, Config{Bulk: bulk}, n, 0, nil)
			})
		}
	}
	// Backpressure: both ends read 4 KiB per millisecond, so the loop's
	// buffers and the sockets fill up and the loop must wait for room.
	t.Run("slow reader", func(t *testing.T) { roundTrip(t, Config{}, 1<<20, time.Millisecond, nil) })
	t.Run("small buffers", func(t *testing.T) { roundTrip(t, Config{BufSize: 512}, 200_000, 0, nil) })
	// A prefix (a hop header) goes first; it is not counted as client bytes.
	for _, p := range []int{1, 300, 20_000} {
		for _, bulk := range []bool{false, true} {
			t.Run(fmt.Sprintf("prefix=%d/bulk=%v", p, bulk), func(t *testing.T) {
				roundTrip(t, Config{Bulk: bulk}, 100_000, 0, randBytes(p))
			})
		}
	}
}

// roundTrip relays n random bytes each way through one flow and checks
// them, the outcome and the stats.
func roundTrip(t *testing.T, cfg Config, n int, slow time.Duration, prefix []byte) {
	toUp, toDown := randBytes(n), randBytes(n)
	type result struct {
		prefix, got []byte
		err         error
	}
	upGot := make(chan result, 1)
	srv := newUpServer(t, func(c *net.TCPConn) {
		var r result
		r.prefix = make([]byte, len(prefix))
		if _, r.err = io.ReadFull(c, r.prefix); r.err == nil {
			r.got, r.err = exchange(c, toDown, slow)
		}
		upGot <- r
	})
	h := newTestHandler(t, srv.addr)
	h.prefix = prefix
	r := newRig(t, cfg, h)
	c := r.dial(t)
	got, err := exchange(c, toUp, slow)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if len(got) != n || sum(got) != sum(toDown) {
		t.Errorf("client got %d bytes (sha256 %x); want the upstream's %d (%x)", len(got), sum(got), n, sum(toDown))
	}
	var ur result
	select {
	case ur = <-upGot:
	case <-time.After(10 * time.Second):
		t.Fatal("upstream did not finish")
	}
	if ur.err != nil {
		t.Fatalf("upstream: %v", ur.err)
	}
	if !bytes.Equal(ur.prefix, prefix) {
		t.Errorf("upstream got prefix %q...; want %q...", trunc(ur.prefix), trunc(prefix))
	}
	if len(ur.got) != n || sum(ur.got) != sum(toUp) {
		t.Errorf("upstream got %d bytes (sha256 %x); want the client's %d (%x)", len(ur.got), sum(ur.got), n, sum(toUp))
	}
	e := h.waitEnded(t, 1, 10*time.Second)[0]
	checkEnd(t, e, OK)
	if up, down := moved(e); up != int64(n) || down != int64(n) {
		t.Errorf("moved up %d, down %d (stats %+v, handed %v); want %d each way", up, down, e.st, e.handed, n)
	}
	if e.st.Connect <= 0 {
		t.Errorf("Stats.Connect = %v; want > 0 (a dialed upstream)", e.st.Connect)
	}
	switch {
	case e.handed && !cfg.Bulk:
		t.Errorf("flow handed over with Bulk off")
	case !e.handed && cfg.Bulk && n == 1<<20 && len(prefix) == 0:
		t.Errorf("1 MiB each way with Bulk on: not handed over")
	}
	if f := r.ls.Flows(); f != 0 {
		t.Errorf("Flows() = %d after the flow ended; want 0", f)
	}
}

// endOK ends a flow from the client: c half-closes, the upstream u reads
// want up to the EOF, answers reply and closes, c reads reply up to the
// EOF, and the flow ends OK.
func endOK(t *testing.T, h *testHandler, c, u *net.TCPConn, want, reply string) doneCall {
	t.Helper()
	c.CloseWrite()
	readEOF(t, u, want)
	writeAll(t, u, reply)
	u.Close()
	readEOF(t, c, reply)
	e := h.waitEnded(t, 1, 5*time.Second)[0]
	checkEnd(t, e, OK)
	return e
}

func trunc(b []byte) []byte { return b[:min(len(b), 16)] }

func TestHalfClose(t *testing.T) {
	for _, tc := range []struct {
		name        string
		clientFirst bool
		msg, reply  string
	}{
		{"client first", true, "request", "reply to request"},
		{"upstream first", false, "hello", "bye after your EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			halfClose(t, func(t *testing.T, c, u *net.TCPConn) {
				first, second := c, u
				if !tc.clientFirst {
					first, second = u, c
				}
				writeAll(t, first, tc.msg)
				if err := first.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				// The other side reads the EOF and can still reply.
				readEOF(t, second, tc.msg)
				writeAll(t, second, tc.reply)
				second.Close()
				readEOF(t, first, tc.reply)
			})
		})
	}
}

// halfClose runs script on a client and its upstream connection, then
// checks the flow ended OK and left no descriptor open.
func halfClose(t *testing.T, script func(t *testing.T, client, upstream *net.TCPConn)) {
	srv := newUpServer(t, nil)
	h := newTestHandler(t, srv.addr)
	r := newRig(t, Config{}, h)
	before := openFDs(t)
	c := r.dial(t)
	u := srv.next(t)
	script(t, c, u)
	e := h.waitEnded(t, 1, 5*time.Second)[0]
	checkEnd(t, e, OK)
	c.Close()
	u.Close()
	if added := openFDs(t).added(before); len(added) > 0 {
		t.Errorf("descriptors open after the flow that were not before it (the loop's sockets not closed?): %v", added)
	}
}

func writeAll(t testing.TB, c net.Conn, s string) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

// readEOF reads c to EOF and checks it read want.
func readEOF(t testing.TB, c net.Conn, want string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v (after %q)", err, b)
	}
	if string(b) != want {
		t.Fatalf("read %q; want %q", b, want)
	}
}

func readN(t testing.TB, c net.Conn, want string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, len(want))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(b) != want {
		t.Fatalf("read %q; want %q", b, want)
	}
}

// resetConn closes c with an RST.
func resetConn(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func TestReset(t *testing.T) {
	testenv.CheckLeaks(t)
	t.Run("upstream resets", func(t *testing.T) {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		r := newRig(t, Config{}, h)
		c := r.dial(t)
		u := srv.next(t)
		writeAll(t, c, "some request")
		readN(t, u, "some request")
		writeAll(t, u, "partial reply")
		readN(t, c, "partial reply")
		resetConn(u)
		if el := expectReset(t, c, 2*time.Second); el > time.Second {
			t.Errorf("client saw the reset after %v; want it promptly", el)
		}
		e := h.waitEnded(t, 1, 5*time.Second)[0]
		checkEnd(t, e, Reset)
		if !errors.Is(e.err, syscall.ECONNRESET) {
			t.Errorf("Done err %v; want ECONNRESET", e.err)
		}
		if e.st.Up != 12 || e.st.Down != 13 {
			t.Errorf("stats %+v; want Up 12, Down 13", e.st)
		}
	})
	t.Run("client resets", func(t *testing.T) {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		r := newRig(t, Config{}, h)
		c := r.dial(t)
		u := srv.next(t)
		writeAll(t, c, "some request")
		readN(t, u, "some request")
		resetConn(c)
		if el := expectReset(t, u, 2*time.Second); el > time.Second {
			t.Errorf("upstream saw the reset after %v; want it promptly", el)
		}
		checkEnd(t, h.waitEnded(t, 1, 5*time.Second)[0], Reset)
	})
}

func TestIdle(t *testing.T) {
	const idle = 200 * time.Millisecond
	t.Run("silent flow", func(t *testing.T) {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		r := newRig(t, Config{Idle: idle}, h)
		start := time.Now()
		c := r.dial(t)
		u := srv.next(t)
		expectReset(t, c, 3*time.Second)
		el := time.Since(start)
		if el < idle-20*time.Millisecond || el > idle+800*time.Millisecond {
			t.Errorf("silent flow reset after %v; want about %v", el, idle)
		}
		expectReset(t, u, time.Second)
		checkEnd(t, h.waitEnded(t, 1, 5*time.Second)[0], Idle)
	})
	t.Run("trickle", func(t *testing.T) {
		// One direction moves a byte every 50 ms: the flow stays up. The
		// loop can only end it if the client wrote nothing for idle (a
		// write's byte waits in the socket until the loop reads it, and
		// the loop looks before it ends a flow), so a reset after such a
		// gap is the loaded machine's (logged, repeated), after none a bug.
		for attempt := 1; ; attempt++ {
			if trickleOnce(t, idle, attempt == 3) || attempt == 3 {
				return
			}
		}
	})
}

// trickleOnce runs one trickle flow; it reports false if the flow was reset
// after the test itself paused for the idle timeout (and last is false).
func trickleOnce(t *testing.T, idle time.Duration, last bool) bool {
	srv := newUpServer(t, nil)
	defer srv.close()
	h := newTestHandler(t, srv.addr)
	r := newRig(t, Config{Idle: idle}, h)
	defer r.ls.Close()
	c := r.dial(t)
	u := srv.next(t)
	defer u.Close()
	start := time.Now()
	const n = 24
	var maxGap time.Duration
	prev := time.Now()
	for i := range n {
		maxGap = max(maxGap, time.Since(prev))
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "x"); err != nil {
			if maxGap >= idle && !last {
				t.Logf("write %d: %v after the test paused %v (idle %v): load, retrying", i, err, maxGap, idle)
				return false
			}
			t.Fatalf("write %d: %v (longest pause between writes %v, idle %v)", i, err, maxGap, idle)
		}
		prev = time.Now()
		time.Sleep(50 * time.Millisecond)
	}
	if el := time.Since(start); el < time.Second {
		t.Fatalf("trickle lasted %v; want > 1 s", el)
	}
	maxGap = max(maxGap, time.Since(prev))
	c.CloseWrite()
	u.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(u)
	if want := bytes.Repeat([]byte("x"), n); err != nil || !bytes.Equal(got, want) {
		if maxGap >= idle && !last {
			t.Logf("upstream read %q, %v after the test paused %v (idle %v): load, retrying", got, err, maxGap, idle)
			return false
		}
		t.Fatalf("upstream read %q, %v; want %q then EOF (longest pause %v, idle %v)", got, err, want, maxGap, idle)
	}
	writeAll(t, u, "ok")
	u.Close()
	readEOF(t, c, "ok")
	checkEnd(t, h.waitEnded(t, 1, 5*time.Second)[0], OK)
	return true
}

// blackhole returns a loopback listener whose accept queue is full, so
// the SYNs of new connections are dropped.
func blackhole(t testing.TB) netip.AddrPort {
	t.Helper()
	fd, a := listenFD(t, 1)
	t.Cleanup(func() { unix.Close(fd) })
	for i := 0; ; i++ {
		if i == 10 {
			t.Fatal("listener with backlog 1 still accepts handshakes after 10 connections")
		}
		c, err := net.DialTimeout("tcp", a.String(), 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return a
}

func TestConnectFailed(t *testing.T) {
	testenv.CheckLeaks(t)
	type tc struct {
		name    string
		target  func(t testing.TB) netip.AddrPort
		timeout time.Duration
		errno   syscall.Errno
		within  time.Duration
	}
	for _, k := range []tc{
		{"refused", closedPort, 0, syscall.ECONNREFUSED, time.Second},
		{"timeout", blackhole, 300 * time.Millisecond, syscall.ETIMEDOUT, 2 * time.Second},
	} {
		t.Run(k.name+"/no retry", func(t *testing.T) {
			dead := k.target(t)
			h := newTestHandler(t, dead)
			r := newRig(t, Config{ConnectTimeout: k.timeout}, h)
			start := time.Now()
			dialReset(t, r, "lost", k.within)
			el := time.Since(start)
			if k.timeout > 0 && el < k.timeout-20*time.Millisecond {
				t.Errorf("reset after %v; want it after the connect timeout %v", el, k.timeout)
			}
			e := h.waitEnded(t, 1, 5*time.Second)[0]
			checkEnd(t, e, ConnectFailed)
			if !errors.Is(e.err, k.errno) {
				t.Errorf("Done err %v; want %v", e.err, k.errno)
			}
			if e.st.Up != 0 {
				t.Errorf("Stats.Up = %d; want 0", e.st.Up)
			}
			h.noMoreEnded(t, 200*time.Millisecond)
			if n := len(h.retryErrors()); n != 0 {
				t.Errorf("Retry called %d times without Upstream.Retry", n)
			}
		})
		t.Run(k.name+"/retry", func(t *testing.T) {
			dead := k.target(t)
			srv := newUpServer(t, nil)
			h := newTestHandler(t, dead)
			h.open = func(rec *flowRec) (Upstream, error) {
				fd, err := Dial(dead, nil)
				return Upstream{FD: fd, Prefix: []byte("P1:"), Retry: true}, err
			}
			h.retry = func(rec *flowRec, failed error) (Upstream, error) {
				fd, err := Dial(srv.addr, nil)
				return Upstream{FD: fd, Prefix: []byte("SECOND-PREFIX:")}, err
			}
			r := newRig(t, Config{ConnectTimeout: k.timeout}, h)
			c := r.dial(t)
			// Sent while the first upstream is failing: none may be lost.
			writeAll(t, c, "early bytes;")
			u := srv.next(t)
			writeAll(t, c, "later bytes")
			e := endOK(t, h, c, u, "SECOND-PREFIX:early bytes;later bytes", "ok")
			errs := h.retryErrors()
			if len(errs) != 1 || !errors.Is(errs[0], k.errno) {
				t.Errorf("Retry errors %v; want one %v", errs, k.errno)
			}
			if e.st.Up != int64(len("early bytes;later bytes")) || e.st.Down != 2 {
				t.Errorf("stats %+v; want Up 23, Down 2", e.st)
			}
		})
	}
	t.Run("retry fails", func(t *testing.T) {
		dead := closedPort(t)
		h := newTestHandler(t, dead)
		h.open = func(rec *flowRec) (Upstream, error) {
			fd, err := Dial(dead, nil)
			return Upstream{FD: fd, Retry: true}, err
		}
		h.retry = func(rec *flowRec, failed error) (Upstream, error) {
			return Upstream{}, errors.New("no other upstream")
		}
		r := newRig(t, Config{}, h)
		dialReset(t, r, "", time.Second)
		e := h.waitEnded(t, 1, 5*time.Second)[0]
		checkEnd(t, e, ConnectFailed)
		h.noMoreEnded(t, 100*time.Millisecond)
	})
}

// dialReset connects to the loops, sends msg and expects a reset within
// d. On loopback the reset can beat the end of the client's own connect
// call, which then fails with it.
func dialReset(t testing.TB, r *rig, msg string, d time.Duration) {
	t.Helper()
	c, err := net.DialTimeout("tcp", r.addr, d)
	if errors.Is(err, syscall.ECONNRESET) {
		return
	}
	if err != nil {
		t.Fatalf("dial loops: %v; want a connection that is then reset", err)
	}
	defer c.Close()
	if msg != "" {
		// The write may already meet the reset.
		_, err := io.WriteString(c, msg)
		if errors.Is(err, syscall.ECONNRESET) {
			return
		}
		if err != nil {
			t.Fatalf("write: %v; want success or ECONNRESET", err)
		}
	}
	expectReset(t, c, d)
}

func TestOpenError(t *testing.T) {
	t.Run("error", func(t *testing.T) {
		h := newTestHandler(t, closedPort(t))
		h.open = func(rec *flowRec) (Upstream, error) { return Upstream{}, errors.New("refused by policy") }
		r := newRig(t, Config{}, h)
		dialReset(t, r, "", time.Second)
		h.noMoreEnded(t, 100*time.Millisecond)
		if f := r.ls.Flows(); f != 0 {
			t.Errorf("Flows() = %d; want 0", f)
		}
	})
	t.Run("taken", func(t *testing.T) {
		h := newTestHandler(t, closedPort(t))
		taken := make(chan int, 1)
		h.open = func(rec *flowRec) (Upstream, error) {
			taken <- rec.fd
			return Upstream{}, ErrTaken
		}
		r := newRig(t, Config{}, h)
		c := r.dial(t)
		writeAll(t, c, "ping")
		var fd int
		select {
		case fd = <-taken:
		case <-time.After(5 * time.Second):
			t.Fatal("Open not called")
		}
		// Give the loop time to (wrongly) touch the socket.
		time.Sleep(100 * time.Millisecond)
		if err := unix.SetNonblock(fd, false); err != nil {
			t.Fatalf("taken fd %d: %v (closed by the loop?)", fd, err)
		}
		b := make([]byte, 4)
		if n, err := unix.Read(fd, b); err != nil || string(b[:n]) != "ping" {
			t.Fatalf("read taken fd: %q, %v; want ping", b[:n], err)
		}
		if _, err := unix.Write(fd, []byte("pong")); err != nil {
			t.Fatalf("write taken fd: %v", err)
		}
		unix.Close(fd)
		readEOF(t, c, "pong")
		h.noMoreEnded(t, 50*time.Millisecond)
	})
}

func TestManyFlows(t *testing.T) {
	const flows = 1000
	// Warm up the runtime's own descriptors (netpoller) before counting.
	closedPort(t)
	before := openFDs(t)
	srv := newUpServer(t, func(c *net.TCPConn) {
		if _, err := io.Copy(c, c); err == nil {
			c.CloseWrite()
		}
	})
	h := newTestHandler(t, srv.addr)
	r := newRig(t, Config{Loops: 2}, h)
	// A flow fails when it stalls while the others move: every live flow's
	// deadline is 10 s after the last flow completed. (A fixed deadline
	// also failed flows of a test that a load of 30 starved of CPU: its
	// 1000 flows, 2000 goroutines under -race, took longer than 10 s.)
	var live sync.Map // net.Conn -> struct{}
	var completed atomic.Int64
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tk := time.NewTicker(500 * time.Millisecond)
		defer tk.Stop()
		last := int64(0)
		for {
			select {
			case <-stopWatch:
				return
			case <-tk.C:
			}
			if n := completed.Load(); n != last {
				last = n
				d := time.Now().Add(10 * time.Second)
				live.Range(func(c, _ any) bool {
					c.(net.Conn).SetDeadline(d)
					return true
				})
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, flows)
	for i := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer completed.Add(1)
			out := randBytes(rand.IntN(40_000))
			c, err := net.DialTimeout("tcp", r.addr, 30*time.Second)
			if err != nil {
				errs <- fmt.Errorf("flow %d: dial: %w", i, err)
				return
			}
			defer c.Close()
			live.Store(c, struct{}{})
			defer live.Delete(c)
			got, err := exchange(c.(*net.TCPConn), out, 0)
			if err != nil {
				errs <- fmt.Errorf("flow %d: %w", i, err)
				return
			}
			if !bytes.Equal(got, out) {
				errs <- fmt.Errorf("flow %d: echo of %d bytes came back as %d different bytes", i, len(out), len(got))
			}
		}()
	}
	wg.Wait()
	close(stopWatch)
	<-watched
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ends := h.waitEnded(t, flows, 20*time.Second)
	for _, e := range ends {
		checkEnd(t, e, OK)
		if e.st.Up != e.st.Down {
			t.Errorf("flow %d: stats %+v; an echo moves as much each way", e.rec.id, e.st)
		}
	}
	if n := h.openedCount(); n != flows {
		t.Errorf("Open succeeded %d times; want %d", n, flows)
	}
	if f := r.ls.Flows(); f != 0 {
		t.Errorf("Flows() = %d after every flow ended; want 0", f)
	}
	h.noMoreEnded(t, 50*time.Millisecond)
	r.ls.Close()
	r.closeListener()
	srv.close()
	if added := openFDs(t).added(before); len(added) > 0 {
		t.Errorf("descriptors open after %d flows and Close that were not before (leak): %v", flows, added)
	}
}

// established opens n flows and checks each carries a byte each way.
func established(t *testing.T, r *rig, srv *upServer, n int) (cs, us []*net.TCPConn) {
	t.Helper()
	for range n {
		c := r.dial(t)
		u := srv.next(t)
		writeAll(t, c, "a")
		readN(t, u, "a")
		writeAll(t, u, "b")
		readN(t, c, "b")
		cs, us = append(cs, c), append(us, u)
	}
	return cs, us
}

func TestResetAllAndClose(t *testing.T) {
	t.Run("ResetAll", func(t *testing.T) {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		r := newRig(t, Config{Loops: 2}, h)
		cs, us := established(t, r, srv, 5)
		r.ls.ResetAll()
		for i := range cs {
			expectReset(t, cs[i], time.Second)
			expectReset(t, us[i], time.Second)
		}
		for _, e := range h.waitEnded(t, len(cs), 5*time.Second) {
			checkEnd(t, e, Aborted)
		}
		if f := r.ls.Flows(); f != 0 {
			t.Errorf("Flows() = %d after ResetAll; want 0", f)
		}
		// The loops still serve new flows.
		established(t, r, srv, 1)
	})
	t.Run("Close", func(t *testing.T) {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		r := newRig(t, Config{Loops: 2}, h)
		cs, _ := established(t, r, srv, 3)
		closed := make(chan struct{})
		go func() {
			r.ls.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close with open flows did not return")
		}
		for _, c := range cs {
			expectReset(t, c, time.Second)
		}
		for _, e := range h.waitEnded(t, len(cs), time.Second) {
			checkEnd(t, e, Aborted)
		}
		// Everything after Close returns at once and does nothing.
		again := make(chan struct{})
		go func() {
			r.ls.Close()
			r.ls.ResetAll()
			r.ls.StopAccepting()
			close(again)
		}()
		select {
		case <-again:
		case <-time.After(5 * time.Second):
			t.Fatal("Close, ResetAll or StopAccepting after Close did not return")
		}
		if err := r.ls.Listen(r.lfd, "late"); err == nil {
			t.Error("Listen after Close succeeded")
		}
	})
	t.Run("StopAccepting", func(t *testing.T) {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		r := newRig(t, Config{Loops: 2}, h)
		cs, us := established(t, r, srv, 1)
		r.ls.StopAccepting()
		r.closeListener()
		if c, err := net.DialTimeout("tcp", r.addr, time.Second); err == nil {
			c.Close()
			t.Error("connect after StopAccepting succeeded")
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("connect after StopAccepting: %v; want ECONNREFUSED", err)
		}
		// The open flow goes on.
		writeAll(t, cs[0], "still here")
		cs[0].CloseWrite()
		readEOF(t, us[0], "still here")
		writeAll(t, us[0], "yes")
		us[0].Close()
		readEOF(t, cs[0], "yes")
		checkEnd(t, h.waitEnded(t, 1, 5*time.Second)[0], OK)
	})
}

// closeRecorder is an Upstream.Conn (a pooled connection) that counts its
// Close calls.
type closeRecorder struct {
	*net.TCPConn
	closes atomic.Int32
}

func (c *closeRecorder) Close() error {
	c.closes.Add(1)
	return c.TCPConn.Close()
}

// pooled dials srv as a pool would and returns the connection, its
// descriptor and the server's side of it.
func pooled(t *testing.T, srv *upServer) (*closeRecorder, int, *net.TCPConn) {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(srv.addr))
	if err != nil {
		t.Fatal(err)
	}
	pc := &closeRecorder{TCPConn: c}
	t.Cleanup(func() { c.Close() })
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	rc.Control(func(x uintptr) { fd = int(x) })
	return pc, fd, srv.next(t)
}

func TestPooledUpstream(t *testing.T) {
	testenv.CheckLeaks(t)
	t.Run("connected", func(t *testing.T) {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		pc, fd, u := pooled(t, srv)
		h.open = func(rec *flowRec) (Upstream, error) {
			return Upstream{FD: fd, Conn: pc, Connected: true, Prefix: []byte("HDR:")}, nil
		}
		r := newRig(t, Config{}, h)
		c := r.dial(t)
		writeAll(t, c, "request")
		e := endOK(t, h, c, u, "HDR:request", "response")
		if e.st.Connect != 0 || e.st.Up != 7 || e.st.Down != 8 {
			t.Errorf("stats %+v; want Connect 0 (pooled), Up 7, Down 8", e.st)
		}
		if n := pc.closes.Load(); n != 1 {
			t.Errorf("pooled Conn closed %d times; want 1 (the flow closes Conn, not FD)", n)
		}
	})
	// A pooled connection the peer reset meanwhile fails the first write
	// (the header), or, with no header, the first read, which comes
	// before the client's bytes: either way the flow asks for another
	// upstream.
	for _, prefix := range []string{"HDR:", ""} {
		t.Run(fmt.Sprintf("stale/prefix=%q", prefix), func(t *testing.T) {
			srv := newUpServer(t, nil)
			h := newTestHandler(t, srv.addr)
			pc, fd, u := pooled(t, srv)
			resetConn(u)
			waitSocket(t, fd, "the RST reaches the pooled socket")
			h.open = func(rec *flowRec) (Upstream, error) {
				return Upstream{FD: fd, Conn: pc, Connected: true, Prefix: []byte(prefix), Retry: true}, nil
			}
			h.retry = func(rec *flowRec, failed error) (Upstream, error) {
				fd, err := Dial(srv.addr, nil)
				return Upstream{FD: fd, Prefix: []byte("HDR2:")}, err
			}
			r := newRig(t, Config{}, h)
			c := r.dial(t)
			// The loop finds the upstream broken before the client's bytes.
			waitRetries(t, h, 1)
			writeAll(t, c, "request")
			c.CloseWrite()
			u2 := srv.next(t)
			readEOF(t, u2, "HDR2:request")
			writeAll(t, u2, "response")
			u2.Close()
			readEOF(t, c, "response")
			checkEnd(t, h.waitEnded(t, 1, 5*time.Second)[0], OK)
			if errs := h.retryErrors(); len(errs) != 1 || !errors.Is(errs[0], syscall.ECONNRESET) {
				t.Errorf("Retry errors %v; want one ECONNRESET", errs)
			}
			if n := pc.closes.Load(); n != 1 {
				t.Errorf("stale pooled Conn closed %d times; want 1", n)
			}
		})
	}
}

// TestPooledUpstreamClosed: a pooled connection (no prefix) the peer
// closed with a FIN before the flow used it reads EOF before any byte went
// either way: the flow asks for another upstream instead of passing the EOF
// on (and losing the request).
func TestPooledUpstreamClosed(t *testing.T) {
	srv := newUpServer(t, nil)
	h := newTestHandler(t, srv.addr)
	pc, fd, u := pooled(t, srv)
	u.Close() // a FIN, as an origin closing an idle keepalive connection
	waitSocket(t, fd, "the FIN reaches the pooled socket")
	h.open = func(rec *flowRec) (Upstream, error) {
		return Upstream{FD: fd, Conn: pc, Connected: true, Retry: true}, nil
	}
	h.retry = func(rec *flowRec, failed error) (Upstream, error) {
		fd, err := Dial(srv.addr, nil)
		return Upstream{FD: fd}, err
	}
	r := newRig(t, Config{}, h)
	c := r.dial(t)
	waitRetries(t, h, 1) // the loop sees the upstream's EOF before the client's bytes
	writeAll(t, c, "request")
	c.CloseWrite()
	u2 := srv.next(t)
	readEOF(t, u2, "request")
	writeAll(t, u2, "response")
	u2.Close()
	readEOF(t, c, "response")
	checkEnd(t, h.waitEnded(t, 1, 5*time.Second)[0], OK)
	if errs := h.retryErrors(); len(errs) != 1 {
		t.Errorf("Retry errors %v; want one (upstream closed before use)", errs)
	}
}

// TestHandoverDownload: a reply fills a buffer while the request's
// direction stays open; the flow is handed over with the reply's bytes the
// loop still held (ToDown), and both directions go on in the handler.
func TestHandoverDownload(t *testing.T) {
	srv := newUpServer(t, nil)
	h := newTestHandler(t, srv.addr)
	r := newRig(t, Config{Bulk: true}, h)
	c := r.dial(t)
	u := srv.next(t)
	writeAll(t, c, "GET")
	readN(t, u, "GET")
	reply := randBytes(1 << 20)
	werr := make(chan error, 1)
	go func() {
		u.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := u.Write(reply)
		werr <- err
	}()
	got := make([]byte, len(reply))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("client read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("upstream write: %v", err)
	}
	if sum(got) != sum(reply) {
		t.Fatal("client got the reply's length but different bytes")
	}
	// The request direction still works after the handover.
	writeAll(t, c, "thanks")
	e := endOK(t, h, c, u, "thanks", "")
	if !e.handed {
		t.Fatal("1 MiB reply with Bulk on: not handed over")
	}
	if up, down := moved(e); up != 9 || down != 1<<20 {
		t.Errorf("moved up %d, down %d (stats %+v, to up %d, to down %d); want 9 and %d", up, down, e.st, e.toUp, e.toDown, 1<<20)
	}
}

// TestSlotGenerations: a slot reused for a new flow gets a new generation,
// so an event still queued for the slot's previous flow (ended earlier in
// the same epoll batch) is recognised as stale and not applied to the new
// one.
func TestSlotGenerations(t *testing.T) {
	l := &loop{ls: &Loops{}}
	f1 := l.newFlow()
	l.nflows++
	slot, gen := f1.slot, f1.gen
	l.freeFlow(f1)
	f2 := l.newFlow()
	if f2.slot != slot {
		t.Fatalf("new flow in slot %d; want the freed slot %d reused", f2.slot, slot)
	}
	if f2.gen == gen {
		t.Fatalf("reused slot kept generation %d: stale events would reach the new flow", gen)
	}
	f2.fd = [2]int{-1, -1}
	// A stale error event of the old flow's upstream: ignored (the new
	// flow's readiness is untouched).
	l.flowEvent(&unix.EpollEvent{Events: unix.EPOLLERR | unix.EPOLLHUP, Fd: slot, Pad: gen<<1 | up})
	if f2.ready != [2]uint8{} || f2.ended {
		t.Errorf("stale event applied to the new flow: ready %v, ended %v", f2.ready, f2.ended)
	}
}

// TestFINMerge checks that a direction's last bytes and its FIN reach the
// upstream in one segment when the client's FIN came with its bytes (the
// loop writes them with MSG_MORE and the shutdown pushes both). The
// upstream counts the segments it received after the handshake. With
// NoFINMerge they are two segments, unless the kernel held the data
// segment back itself (a loaded machine), so that count is only logged.
func TestFINMerge(t *testing.T) {
	segs := func(t *testing.T, cfg Config) uint32 {
		srv := newUpServer(t, nil)
		h := newTestHandler(t, srv.addr)
		r := newRig(t, cfg, h)
		c := r.dial(t)
		u := srv.next(t)
		urc, err := u.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		segsIn := func() uint32 {
			var ti *unix.TCPInfo
			var err error
			urc.Control(func(fd uintptr) {
				ti, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			})
			if err != nil {
				t.Fatal(err)
			}
			return ti.Segs_in
		}
		before := segsIn() // the handshake's
		// The client's request and FIN in one segment, so the loop sees
		// both in one event whatever the scheduling.
		rc, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var serr error
		rc.Control(func(fd uintptr) {
			serr = unix.Sendto(int(fd), []byte("request"), unix.MSG_MORE, nil)
			if serr == nil {
				serr = unix.Shutdown(int(fd), unix.SHUT_WR)
			}
		})
		if serr != nil {
			t.Fatal(serr)
		}
		readEOF(t, u, "request")
		n := segsIn() - before
		writeAll(t, u, "reply")
		u.Close()
		readEOF(t, c, "reply")
		checkEnd(t, h.waitEnded(t, 1, 5*time.Second)[0], OK)
		return n
	}
	merged := segs(t, Config{})
	split := segs(t, Config{NoFINMerge: true})
	t.Logf("segments the upstream received for the request and its FIN: %d merged, %d with NoFINMerge", merged, split)
	if merged != 1 {
		t.Fatalf("upstream received the request and its FIN in %d segments; want 1 (data and FIN together)", merged)
	}
}
