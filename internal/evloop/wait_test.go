//go:build linux

package evloop

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dialFastOpen opens a Fast Open upstream socket (TCP_FASTOPEN_CONNECT:
// connect returns at once, the SYN leaves with the first write).
func dialFastOpen(t testing.TB, srv *upServer) int {
	t.Helper()
	return dialFastOpenTo(t, srv.addr)
}

func dialFastOpenTo(t testing.TB, addr netip.AddrPort) int {
	t.Helper()
	fd, err := Dial(addr, func(fd int) error {
		return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1)
	})
	if err != nil {
		t.Fatalf("dial fast open %s: %v", addr, err)
	}
	return fd
}

// TestWaitFirstBytes checks Upstream.Wait: the handler's Dial gets the
// client's first bytes as soon as they arrive (not after the wait), is
// called when the wait runs out for a silent client (a server-speaks-first
// protocol still works), and at once when the client half-closes first.
func TestWaitFirstBytes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wait    time.Duration
		send    string // "" : silent client
		halfEnd bool   // the client half-closes without sending
		minGap  time.Duration
		maxGap  time.Duration
	}{
		{name: "bytes arrive", wait: 3 * time.Second, send: "hello", maxGap: time.Second},
		{name: "silent client", wait: 200 * time.Millisecond, minGap: 150 * time.Millisecond, maxGap: 2 * time.Second},
		{name: "client ends first", wait: 3 * time.Second, halfEnd: true, maxGap: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newUpServer(t, nil)
			h := newTestHandler(t, srv.addr)
			var mu sync.Mutex
			var first []byte
			var dialedAt time.Time
			h.open = func(rec *flowRec) (Upstream, error) { return Upstream{Wait: tc.wait}, nil }
			h.dial = func(rec *flowRec, b []byte) (Upstream, error) {
				mu.Lock()
				first, dialedAt = append([]byte(nil), b...), time.Now()
				mu.Unlock()
				fd, err := Dial(srv.addr, nil)
				return Upstream{FD: fd, Prefix: []byte("P:")}, err
			}
			r := newRig(t, Config{Loops: 1}, h)
			start := time.Now()
			c := r.dial(t)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			switch {
			case tc.send != "":
				time.Sleep(30 * time.Millisecond)
				writeAll(t, c, tc.send)
			case tc.halfEnd:
				c.CloseWrite()
			}
			u := srv.next(t)
			u.SetDeadline(time.Now().Add(10 * time.Second))
			// The upstream gets the prefix, then the client's bytes.
			readN(t, u, "P:"+tc.send)
			writeAll(t, u, "greeting")
			readN(t, c, "greeting")
			mu.Lock()
			gap, got := dialedAt.Sub(start), string(first)
			mu.Unlock()
			if got != tc.send {
				t.Errorf("Dial got first bytes %q; want %q", got, tc.send)
			}
			if gap < tc.minGap || gap > tc.maxGap {
				t.Errorf("Dial called %v after connect; want %v-%v (wait %v)", gap, tc.minGap, tc.maxGap, tc.wait)
			}
			if tc.halfEnd {
				u.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := u.Read(make([]byte, 1)); err != io.EOF {
					t.Errorf("upstream read %d, %v after the client's half-close; want EOF", n, err)
				}
			}
		})
	}
}

// TestFastOpenUpstream checks an Upstream with FastOpen: bytes arrive
// exactly once and in order, and an upstream that refuses the SYN (seen
// only after the first write, since connect returned at once) or never
// answers it is retried with every byte, none of them delivered twice.
func TestFastOpenUpstream(t *testing.T) {
	t.Run("ok", func(t *testing.T) {
		srv := newUpServer(t, echoServe)
		h := newTestHandler(t, srv.addr)
		h.open = func(rec *flowRec) (Upstream, error) {
			return Upstream{FD: dialFastOpen(t, srv), FastOpen: true, Prefix: []byte("H"), Retry: true}, nil
		}
		r := newRig(t, Config{Loops: 1}, h)
		c := r.dial(t)
		msg := randBytes(100 << 10)
		got, err := exchange(c, msg, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := append([]byte("H"), msg...); !bytes.Equal(got, want) {
			t.Fatalf("echo through a Fast Open upstream: %d bytes; want %d (prefix + message)", len(got), len(want))
		}
		d := h.waitEnded(t, 1, 5*time.Second)[0]
		if d.o != OK || d.st.Up != int64(len(msg)) || d.st.Connect <= 0 {
			t.Errorf("Done = %v, %+v; want ok with Up %d and a connect time", d.o, d.st, len(msg))
		}
		if n := len(h.retryErrors()); n != 0 {
			t.Errorf("%d retries; want 0", n)
		}
	})
	for _, dead := range []string{"refused", "dropped"} {
		t.Run(dead, func(t *testing.T) {
			srv := newUpServer(t, echoServe)
			h := newTestHandler(t, srv.addr)
			var bad netip.AddrPort
			switch dead {
			case "refused":
				bad = closedPort(t)
			case "dropped":
				bad = fullListener(t)
			}
			// The client's bytes are in before the dial (Wait), so the
			// first write carries them into the failing SYN.
			h.open = func(rec *flowRec) (Upstream, error) { return Upstream{Wait: 5 * time.Second}, nil }
			h.dial = func(rec *flowRec, first []byte) (Upstream, error) {
				if len(first) == 0 {
					t.Error("Dial before the client's bytes")
				}
				return Upstream{FD: dialFastOpenTo(t, bad), FastOpen: true, Prefix: []byte("A"), Retry: true}, nil
			}
			h.retry = func(rec *flowRec, failed error) (Upstream, error) {
				return Upstream{FD: dialFastOpen(t, srv), FastOpen: true, Prefix: []byte("B")}, nil
			}
			r := newRig(t, Config{Loops: 1, ConnectTimeout: 300 * time.Millisecond}, h)
			c := r.dial(t)
			msg := []byte("the request, written before the SYN failed")
			got, err := exchange(c, msg, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := append([]byte("B"), msg...); !bytes.Equal(got, want) {
				t.Fatalf("after a %s Fast Open SYN the good upstream echoed %q; want %q", dead, got, want)
			}
			if n := len(h.retryErrors()); n != 1 {
				t.Errorf("%d retries; want 1", n)
			}
			if d := h.waitEnded(t, 1, 5*time.Second)[0]; d.o != OK || d.st.Up != int64(len(msg)) {
				t.Errorf("Done = %v, %+v; want ok with Up %d", d.o, d.st, len(msg))
			}
		})
	}
}

// echoServe copies everything back and half-closes after EOF.
func echoServe(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// fullListener returns the address of a loopback listener that never
// accepts and whose queue is full, so further SYNs are dropped.
func fullListener(t testing.TB) netip.AddrPort {
	t.Helper()
	fd, a := listenFD(t, 0)
	t.Cleanup(func() { unix.Close(fd) })
	var fill []net.Conn
	t.Cleanup(func() {
		for _, c := range fill {
			c.Close()
		}
	})
	for range 10 {
		c, err := net.DialTimeout("tcp", a.String(), 100*time.Millisecond)
		if err != nil {
			return a // the queue is full: this SYN was dropped
		}
		fill = append(fill, c)
	}
	t.Fatal("listener with backlog 0 still completes handshakes after 10 connections")
	return netip.AddrPort{}
}
