package testenv

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Server is a loopback TCP server for tests: it runs a handler on its own
// goroutine for every connection, and closes the connection when the
// handler returns.
type Server struct {
	ln net.Listener
	wg sync.WaitGroup
}

// NewServer serves handle on 127.0.0.1 (an ephemeral port) until t ends;
// then it stops accepting and waits for every handler to return.
func NewServer(t testing.TB, handle func(*net.TCPConn)) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln}
	s.wg.Add(1)
	go s.serve(handle)
	t.Cleanup(s.Close)
	return s
}

func (s *Server) serve(handle func(*net.TCPConn)) {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.conn(c.(*net.TCPConn), handle)
	}
}

func (s *Server) conn(c *net.TCPConn, handle func(*net.TCPConn)) {
	defer s.wg.Done()
	defer c.Close()
	handle(c)
}

// Close stops accepting and waits for every handler to return (handlers
// must end on their own: a test unblocks them first).
func (s *Server) Close() {
	s.ln.Close()
	s.wg.Wait()
}

// Addr is the server's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Echo copies everything back and half-closes after EOF.
func Echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// RoundTrip connects to addr, sends msg, half-closes and returns all it
// reads back until EOF (10 s bound).
func RoundTrip(t testing.TB, addr string, msg []byte) []byte {
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

// Splice copies between a and b both ways until both directions ended,
// half-closing each side after the other's EOF (what a relay does; for a
// test's minimal proxy).
func Splice(a, b *net.TCPConn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(b, a)
		b.CloseWrite()
	}()
	io.Copy(a, b)
	a.CloseWrite()
	<-done
}

// HTTPOrigin answers body to every HTTP request on 127.0.0.1 until t ends
// and returns its port.
func HTTPOrigin(t testing.TB, body string) string {
	t.Helper()
	o := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	}))
	t.Cleanup(o.Close)
	_, port, _ := net.SplitHostPort(o.Listener.Addr().String())
	return port
}

// FreeAddr returns a loopback address (127.0.0.1:port) that was free a
// moment ago: for a server a test starts later, or a peer that is down.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TCPPair returns both ends of one loopback TCP connection, closed at the
// end of the test.
func TCPPair(t testing.TB) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	ln.SetDeadline(time.Now().Add(30 * time.Second))
	a, err := ln.AcceptTCP()
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); a.Close() })
	return d, a
}
