//go:build linux

package evloop

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// flowRec is the state the test handler gives each flow it opens.
type flowRec struct {
	id     int
	fd     int            // the accepted client socket
	client netip.AddrPort // the client's address as Open saw it
	dones  atomic.Int32
}

// doneCall is one Handler.Done call, or the end of a handed-over flow's
// copy (handed set).
type doneCall struct {
	rec    *flowRec
	o      Outcome
	st     Stats
	err    error
	handed bool
	// Handed-over flows: what the loop still held and what the handler's
	// copy moved afterwards.
	toUp, toDown     int
	copyUp, copyDown int64
	copyErr          error
}

// testHandler is an evloop.Handler for tests: Open dials target (or calls
// open), Retry calls retry, Done and Handover are recorded, and handed-over
// flows are finished with io.Copy on net.FileConn-wrapped sockets.
type testHandler struct {
	t      testing.TB
	target netip.AddrPort
	prefix []byte
	// open, if set, replaces the default Open.
	open func(rec *flowRec) (Upstream, error)
	// retry, if set, serves Handler.Retry; nil fails the retry.
	retry func(rec *flowRec, failed error) (Upstream, error)
	// dial, if set, serves Handler.Dial; nil fails it.
	dial func(rec *flowRec, first []byte) (Upstream, error)
	// taken, if set, gets a flow Dial took (ErrTaken: Handover with no
	// upstream); it owns ho.Down.
	taken func(rec *flowRec, ho Handover)

	nextID atomic.Int64
	copies sync.WaitGroup // handed-over copies

	mu        sync.Mutex
	opened    []*flowRec
	dones     []doneCall
	retries   []error
	handovers int
	ended     chan doneCall
}

func newTestHandler(t testing.TB, target netip.AddrPort) *testHandler {
	h := &testHandler{t: t, target: target, ended: make(chan doneCall, 4096)}
	t.Cleanup(h.copies.Wait)
	return h
}

func (h *testHandler) Open(tag any, fd int, client netip.AddrPort) (Upstream, any, error) {
	rec := &flowRec{id: int(h.nextID.Add(1)), fd: fd, client: client}
	if !client.Addr().IsLoopback() {
		h.t.Errorf("Open: client %v; want a loopback address", client)
	}
	var u Upstream
	var err error
	if h.open != nil {
		u, err = h.open(rec)
	} else {
		var ufd int
		ufd, err = Dial(h.target, nil)
		u = Upstream{FD: ufd, Prefix: h.prefix}
	}
	if err != nil {
		return Upstream{}, nil, err
	}
	h.mu.Lock()
	h.opened = append(h.opened, rec)
	h.mu.Unlock()
	return u, rec, nil
}

func (h *testHandler) Retry(state any, failed error) (Upstream, error) {
	rec := state.(*flowRec)
	h.mu.Lock()
	h.retries = append(h.retries, failed)
	h.mu.Unlock()
	if h.retry == nil {
		return Upstream{}, fmt.Errorf("no retry: %w", failed)
	}
	return h.retry(rec, failed)
}

func (h *testHandler) Dial(state any, first []byte) (Upstream, error) {
	rec := state.(*flowRec)
	if h.dial == nil {
		return Upstream{}, errors.New("no dial")
	}
	return h.dial(rec, first)
}

func (h *testHandler) Done(state any, o Outcome, st Stats, err error) {
	rec := state.(*flowRec)
	rec.dones.Add(1)
	h.report(doneCall{rec: rec, o: o, st: st, err: err})
}

func (h *testHandler) report(c doneCall) {
	h.mu.Lock()
	h.dones = append(h.dones, c)
	h.mu.Unlock()
	select {
	case h.ended <- c:
	default:
		h.t.Errorf("test handler: ended channel full")
	}
}

func (h *testHandler) Handover(state any, ho Handover) {
	rec := state.(*flowRec)
	rec.dones.Add(1)
	h.mu.Lock()
	h.handovers++
	h.mu.Unlock()
	if ho.Up < 0 {
		if h.taken == nil {
			h.t.Errorf("handover without an upstream, and no taken hook")
			unix.Close(ho.Down)
			return
		}
		h.taken(rec, ho)
		return
	}
	h.copies.Add(1)
	go h.finishCopy(rec, ho)
}

// finishCopy relays a handed-over flow: the pending bytes first, then
// io.Copy each way with half-close.
func (h *testHandler) finishCopy(rec *flowRec, ho Handover) {
	defer h.copies.Done()
	c := doneCall{rec: rec, o: OK, st: ho.Stats, handed: true, toUp: len(ho.ToUp), toDown: len(ho.ToDown)}
	if ho.UpConn != nil {
		h.t.Errorf("handover: UpConn %v; want nil (no pooled upstream)", ho.UpConn)
	}
	down, err := FileConn(ho.Down)
	if err != nil {
		unix.Close(ho.Up)
		c.copyErr = err
		h.report(c)
		return
	}
	up, err := FileConn(ho.Up)
	if err != nil {
		down.Close()
		c.copyErr = err
		h.report(c)
		return
	}
	defer down.Close()
	defer up.Close()
	var werr [2]error
	if _, err := up.Write(ho.ToUp); err != nil {
		werr[0] = err
	}
	if _, err := down.Write(ho.ToDown); err != nil {
		werr[1] = err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		c.copyUp, werr[0] = halfCopy(up, down, werr[0])
	}()
	go func() {
		defer wg.Done()
		c.copyDown, werr[1] = halfCopy(down, up, werr[1])
	}()
	wg.Wait()
	c.copyErr = errors.Join(werr[0], werr[1])
	h.report(c)
}

// halfCopy copies src to dst, then passes the EOF on.
func halfCopy(dst, src *net.TCPConn, prior error) (int64, error) {
	if prior != nil {
		return 0, prior
	}
	n, err := io.Copy(dst, src)
	if err != nil {
		return n, err
	}
	return n, dst.CloseWrite()
}

// waitEnded waits for n flows to end (Done, or a handed-over copy that
// finished) and returns them.
func (h *testHandler) waitEnded(t testing.TB, n int, within time.Duration) []doneCall {
	t.Helper()
	var got []doneCall
	timer := time.NewTimer(within)
	defer timer.Stop()
	for len(got) < n {
		select {
		case c := <-h.ended:
			got = append(got, c)
		case <-timer.C:
			t.Fatalf("%d of %d flows ended within %v", len(got), n, within)
		}
	}
	return got
}

// noMoreEnded checks that no flow ends within d.
func (h *testHandler) noMoreEnded(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case c := <-h.ended:
		t.Errorf("unexpected end of flow %d: outcome %v, err %v", c.rec.id, c.o, c.err)
	case <-time.After(d):
	}
}

func (h *testHandler) retryErrors() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.retries...)
}

func (h *testHandler) openedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.opened)
}

// rig is running loops with a listener on loopback.
type rig struct {
	ls    *Loops
	h     *testHandler
	addr  string // where clients connect
	lfd   int    // the test's own listening socket
	lOnce sync.Once
}

// listenFD opens a nonblocking listening socket on 127.0.0.1 with backlog.
func listenFD(t testing.TB, backlog int) (int, netip.AddrPort) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		t.Fatalf("bind: %v", err)
	}
	if err := unix.Listen(fd, backlog); err != nil {
		unix.Close(fd)
		t.Fatalf("listen: %v", err)
	}
	a, err := LocalAddr(fd)
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	return fd, a
}

func newRig(t testing.TB, cfg Config, h *testHandler) *rig {
	t.Helper()
	ls, err := Start(cfg, h, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	lfd, a := listenFD(t, 4096)
	r := &rig{ls: ls, h: h, addr: a.String(), lfd: lfd}
	t.Cleanup(func() {
		ls.Close()
		r.closeListener()
	})
	if err := ls.Listen(lfd, "svc"); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	return r
}

func (r *rig) closeListener() { r.lOnce.Do(func() { unix.Close(r.lfd) }) }

func (r *rig) dial(t testing.TB) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial loops: %v", err)
	}
	tc := c.(*net.TCPConn)
	t.Cleanup(func() { tc.Close() })
	return tc
}

// upServer is a test upstream: it serves each connection with serve.
type upServer struct {
	ln    *net.TCPListener
	addr  netip.AddrPort
	wg    sync.WaitGroup
	conns chan *net.TCPConn // accepted connections, if serve is nil
}

func newUpServer(t testing.TB, serve func(c *net.TCPConn)) *upServer {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &upServer{ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort(), conns: make(chan *net.TCPConn, 64)}
	s.wg.Add(1)
	go s.acceptLoop(serve)
	t.Cleanup(s.close)
	return s
}

func (s *upServer) acceptLoop(serve func(c *net.TCPConn)) {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptTCP()
		if err != nil {
			return
		}
		if serve == nil {
			s.conns <- c
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			serve(c)
		}()
	}
}

func (s *upServer) close() {
	s.ln.Close()
	s.wg.Wait()
	for {
		select {
		case c := <-s.conns:
			c.Close()
		default:
			return
		}
	}
}

// next returns the next connection accepted by a server with no serve
// function.
func (s *upServer) next(t testing.TB) *net.TCPConn {
	t.Helper()
	select {
	case c := <-s.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("upstream: no connection within 5 s")
		return nil
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// exchange writes out to c (then half-closes) while reading c to EOF;
// slow > 0 reads in 4 KiB pieces with a pause between them. It returns
// what it read.
func exchange(c *net.TCPConn, out []byte, slow time.Duration) ([]byte, error) {
	// A stalled flow fails the test, not the whole run's timeout.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(out)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	var got bytes.Buffer
	var rerr error
	if slow > 0 {
		b := make([]byte, 4096)
		for {
			n, err := c.Read(b)
			got.Write(b[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				rerr = err
				break
			}
			time.Sleep(slow)
		}
	} else {
		_, rerr = io.Copy(&got, c)
	}
	return got.Bytes(), errors.Join(rerr, <-werr)
}

func sum(b []byte) [32]byte { return sha256.Sum256(b) }

// expectReset reads c until an error and checks it is a reset that came
// within d.
func expectReset(t testing.TB, c net.Conn, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(d))
	b := make([]byte, 4096)
	for {
		_, err := c.Read(b)
		if err == nil {
			continue
		}
		el := time.Since(start)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read after %v: %v; want ECONNRESET", el.Round(time.Millisecond), err)
		}
		return el
	}
}

// fdSet is a snapshot of this process's open descriptors and what they
// refer to.
type fdSet map[string]string

func openFDs(t testing.TB) fdSet {
	t.Helper()
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	self := fmt.Sprint(d.Fd())
	s := fdSet{}
	for _, n := range names {
		if n == self {
			continue
		}
		l, err := os.Readlink("/proc/self/fd/" + n)
		if err != nil {
			// Closed since the listing (the runtime's splice pipes are
			// closed by finalizers, at any time): not open.
			continue
		}
		s[n] = l
	}
	return s
}

// added returns the descriptors of s that were not open in before. Pipes
// are left out: io.Copy between TCP connections (the handler's and the
// upstream servers' copies) splices through pipes the runtime pools and
// frees when it likes; evloop opens none.
func (s fdSet) added(before fdSet) []string {
	var out []string
	for n, l := range s {
		if before[n] != l && !strings.HasPrefix(l, "pipe:") {
			out = append(out, n+" -> "+l)
		}
	}
	return out
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t testing.TB) netip.AddrPort {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}
