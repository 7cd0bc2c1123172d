package router

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/testenv"
)

// countingListener counts the connections a surrogate accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startOrigin runs an origin (as a surrogate) on loopback.
func startOrigin(t *testing.T) (string, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); origin.New(origin.Config{}, nil).Serve(ctx, cl) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String(), cl
}

// startRouter runs a router on loopback over the given surrogates.
func startRouter(t *testing.T, cfg Config, surrogates ...string) (string, *Router) {
	t.Helper()
	var ss []Surrogate
	for i, a := range surrogates {
		ss = append(ss, Surrogate{Name: fmt.Sprintf("s%d", i), Addr: a})
	}
	p, err := NewPicker(PickConfig{Surrogates: ss})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Picker = p
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Serve = %v; want context.Canceled", err)
		}
	})
	return ln.Addr().String(), r
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c.(*net.TCPConn)
}

func get(size int) string {
	return fmt.Sprintf("GET /obj?size=%d&seed=%d HTTP/1.1\r\nHost: cdn\r\n\r\n", size, size)
}

// readObject reads one response and checks its body against the origin's
// stream for size.
func readObject(t *testing.T, br *bufio.Reader, size int) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %s; want 200", resp.Status)
	}
	h := sha256.New()
	if _, err := io.Copy(h, resp.Body); err != nil {
		t.Fatalf("read body: %v", err)
	}
	if [32]byte(h.Sum(nil)) != origin.Sum(uint64(size), int64(size)) {
		t.Fatalf("body of %d bytes does not match the origin's", size)
	}
}

func TestRedirect(t *testing.T) {
	s0, _ := startOrigin(t)
	addr, r := startRouter(t, Config{Mode: ModeRedirect}, s0)
	c := dial(t, addr)
	// Two pipelined requests: two redirects on the same connection.
	if _, err := io.WriteString(c, get(10)+get(20)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for _, size := range []int{10, 20} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := fmt.Sprintf("http://%s/obj?size=%d&seed=%d", s0, size, size)
		if resp.StatusCode != 302 || resp.Header.Get("Location") != want {
			t.Fatalf("got %s Location %q; want 302 %q", resp.Status, resp.Header.Get("Location"), want)
		}
		// Follow it.
		sc := dial(t, s0)
		io.WriteString(sc, get(size))
		readObject(t, bufio.NewReader(sc), size)
	}
	if st := r.Stats(); st.Redirects != 2 || st.Requests != 2 {
		t.Errorf("stats %+v; want 2 requests, 2 redirects", st)
	}
}

func TestProxy(t *testing.T) {
	s0, _ := startOrigin(t)
	s1, _ := startOrigin(t)
	addr, r := startRouter(t, Config{Mode: ModeProxy, PoolSize: 2}, s0, s1)
	var wg sync.WaitGroup
	for k := range 20 {
		wg.Go(func() {
			c := dial(t, addr)
			size := 1000 + k*37_000
			// Two pipelined requests and a third after the responses:
			// the session stays with its surrogate.
			io.WriteString(c, get(size)+get(size+1))
			br := bufio.NewReader(c)
			readObject(t, br, size)
			readObject(t, br, size+1)
			io.WriteString(c, get(size+2))
			readObject(t, br, size+2)
		})
	}
	wg.Wait()
	st := r.Stats()
	if st.Proxied != 20 || st.PoolHits == 0 {
		t.Errorf("stats %+v; want 20 proxied sessions, pool hits", st)
	}
	if st.Forwarded != 20 || st.ForwardTime <= 0 || st.PoolTime <= 0 || st.PoolTime > st.ForwardTime {
		t.Errorf("stats %+v; want 20 forwarded, 0 < pool time <= forward time", st)
	}
}

// A request split over many packets (one byte per write, no Nagle) is
// assembled before the surrogate is chosen.
func TestSplitRequest(t *testing.T) {
	s0, _ := startOrigin(t)
	addr, _ := startRouter(t, Config{Mode: ModeProxy}, s0)
	c := dial(t, addr)
	c.SetNoDelay(true)
	for _, b := range []byte(get(5000)) {
		if _, err := c.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	readObject(t, bufio.NewReader(c), 5000)
}

// The same over a synchronous pipe: every write is a separate read.
func TestSplitRequestPipe(t *testing.T) {
	p, _ := NewPicker(PickConfig{Surrogates: []Surrogate{{"s", "10.1.1.1:80"}}})
	r, err := New(Config{Mode: ModeRedirect, Picker: p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl, sv := net.Pipe()
	done := make(chan struct{})
	go func() { defer close(done); r.serveConn(context.Background(), sv) }()
	cl.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		for _, part := range []string{"GE", "T /a?b=c HT", "TP/1.1\r", "\nHost: x\r\n", "\r", "\n"} {
			if _, err := io.WriteString(cl, part); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(cl), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 302 || resp.Header.Get("Location") != "http://10.1.1.1:80/a?b=c" {
		t.Fatalf("got %s %q", resp.Status, resp.Header.Get("Location"))
	}
	cl.Close()
	<-done
}

func TestBadRequestNoSurrogate(t *testing.T) {
	s0, sl := startOrigin(t)
	addr, r := startRouter(t, Config{Mode: ModeProxy, PoolSize: -1}, s0)
	for _, in := range []string{
		"GET http://evil/ HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
		"GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("y", 100)+"\r\n", 90) + "\r\n",
	} {
		c := dial(t, addr)
		io.WriteString(c, in)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if resp.StatusCode != 400 && resp.StatusCode != 431 {
			t.Errorf("%q: status %s; want 400 or 431", in, resp.Status)
		}
	}
	if n := sl.n.Load(); n != 0 {
		t.Errorf("surrogate accepted %d connections for invalid requests; want 0", n)
	}
	if st := r.Stats(); st.BadRequest != 4 || st.Proxied != 0 {
		t.Errorf("stats %+v; want 4 bad requests, none proxied", st)
	}
}

func TestSlowloris(t *testing.T) {
	s0, sl := startOrigin(t)
	addr, r := startRouter(t, Config{Mode: ModeProxy, PoolSize: -1, HeaderTimeout: 300 * time.Millisecond}, s0)
	// The router's header timer starts at accept, which can come before dial
	// returns to the test: start the clock before dialling.
	start := time.Now()
	c := dial(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 408 {
		t.Fatalf("status %s; want 408", resp.Status)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 10*time.Second {
		t.Errorf("408 after %v; want after the 300 ms header timeout", el)
	}
	// A client that trickles bytes does not extend the deadline.
	start = time.Now()
	c2 := dial(t, addr)
	var got408 bool
	br := bufio.NewReader(c2)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c2.Write([]byte("X")); err != nil {
					return
				}
			}
		}
	})
	io.WriteString(c2, "GET / HTTP/1.1\r\nX-Slow: ")
	resp, err = http.ReadResponse(br, nil)
	close(stop)
	wg.Wait()
	if err == nil && resp.StatusCode == 408 {
		got408 = true
	}
	if !got408 || time.Since(start) > 10*time.Second {
		t.Errorf("trickling client: %v %v after %v; want 408 after the header timeout", resp, err, time.Since(start))
	}
	if sl.n.Load() != 0 || r.Stats().Timeouts != 2 {
		t.Errorf("surrogate connections %d, stats %+v; want 0 and 2 timeouts", sl.n.Load(), r.Stats())
	}
}

// A surrogate that dies mid-response resets the client's connection.
func TestSurrogateDiesMidResponse(t *testing.T) {
	testenv.CheckLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					c.Close()
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
				c.Write(make([]byte, 50000))
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}()
		}
	}()
	addr, r := startRouter(t, Config{Mode: ModeProxy}, ln.Addr().String())
	c := dial(t, addr)
	io.WriteString(c, get(1000000))
	start := time.Now()
	n, err := io.Copy(io.Discard, c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read %d bytes, then %v; want a reset", n, err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("reset after %v", time.Since(start))
	}
	_ = r
}

type fakeJoiner struct {
	err     error
	mu      sync.Mutex
	pending []byte
	joined  chan struct{}
}

func (f *fakeJoiner) Join(ctx context.Context, client, surrogate *net.TCPConn, prepared any, pending []byte, headLen int) (int, error) {
	if f.err != nil {
		// Refuse after sending part of the request: the router proxies.
		n, _ := surrogate.Write(pending[:5])
		return n, f.err
	}
	f.mu.Lock()
	f.pending = append([]byte(nil), pending...)
	f.mu.Unlock()
	client.Close()
	surrogate.Close()
	close(f.joined)
	return len(pending), nil
}

// Handoff passes everything the client sent (two pipelined requests) to the
// joiner; a refused join falls back to proxying the session.
func TestHandoffJoiner(t *testing.T) {
	s0, _ := startOrigin(t)
	j := &fakeJoiner{joined: make(chan struct{})}
	addr, r := startRouter(t, Config{Mode: ModeHandoff, Joiner: j}, s0)
	c := dial(t, addr)
	io.WriteString(c, get(1)+get(2))
	select {
	case <-j.joined:
	case <-time.After(10 * time.Second):
		t.Fatal("no join")
	}
	j.mu.Lock()
	if string(j.pending) != get(1)+get(2) {
		t.Errorf("joiner got %q; want both requests", j.pending)
	}
	j.mu.Unlock()
	// The count follows Join's return (the fake signals from inside it).
	for deadline := time.Now().Add(10 * time.Second); r.Stats().HandedOff != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v; want 1 handed off", r.Stats())
		}
		time.Sleep(time.Millisecond) // polling a counter
	}

	addr2, _ := startRouter(t, Config{Mode: ModeHandoff, Joiner: &fakeJoiner{err: errors.New("no")}}, s0)
	c2 := dial(t, addr2)
	io.WriteString(c2, get(1000)+get(2000))
	br := bufio.NewReader(c2)
	readObject(t, br, 1000)
	readObject(t, br, 2000)
	if _, err := New(Config{Mode: ModeHandoff, Picker: r.cfg.Picker}, nil); err == nil {
		t.Error("handoff without a joiner accepted")
	}
}

func TestPoolStale(t *testing.T) {
	testenv.CheckLeaks(t)
	s0, _ := startOrigin(t)
	// A surrogate that closes idle connections at once.
	sur := testenv.NewServer(t, func(*net.TCPConn) {})
	p := newPool(sur.Addr(), 1, time.Minute, func(ctx context.Context, a string) (*net.TCPConn, error) {
		d := net.Dialer{}
		c, err := d.DialContext(ctx, "tcp", a)
		if err != nil {
			return nil, err
		}
		return c.(*net.TCPConn), nil
	}, nil)
	c, err := p.dial(context.Background(), sur.Addr())
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the peer's FIN to arrive.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rc, _ := c.SyscallConn()
	deadline := time.Now().Add(5 * time.Second)
	for alive(c) && time.Now().Before(deadline) {
		rc.Read(func(uintptr) bool { return true })
		time.Sleep(time.Millisecond)
	}
	if alive(c) {
		t.Fatal("a connection the peer closed is alive")
	}
	c.Close()
	good, err := net.Dial("tcp", s0)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if !alive(good.(*net.TCPConn)) {
		t.Error("an open idle connection is not alive")
	}
}
