package relay

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// A read that runs after its deadline passed (the process was stalled
// while the bytes came) gets them from deadlineReader and peekQueued,
// where Go's own Read reports the deadline without reading.
func TestDeadlinePassedWithBytesQueued(t *testing.T) {
	testenv.CheckLeaks(t)
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(-time.Second)) // passed: the stall
	if n, err := peekQueued(rc); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("peekQueued with nothing queued = %d, %v; want 0, deadline exceeded", n, err)
	}
	if _, err := peer.Write([]byte("header")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the bytes queued", func() bool { n, _ := peekQueued(rc); return n == 6 })
	b := make([]byte, 16)
	n, err := deadlineReader{c}.Read(b)
	if string(b[:n]) != "header" || err != nil {
		t.Errorf("deadlineReader.Read = %q, %v; want the queued header", b[:n], err)
	}
	if n, err := (deadlineReader{c}).Read(b); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("deadlineReader.Read with nothing queued = %d, %v; want 0, deadline exceeded", n, err)
	}
	peer.Close()
	testenv.WaitFor(t, 5*time.Second, "EOF", func() bool { n, err := peekQueued(rc); return n == 0 && err == nil })
}

// The idle check of the goroutine path: bytes a copier could move now (it
// did not run: a stalled process) keep a flow that moved nothing for the
// timeout; none, or no room for them (a stuck writer), end it.
func TestIdleCheckAfterStall(t *testing.T) {
	testenv.CheckLeaks(t)
	pair := func() (*net.TCPConn, *net.TCPConn) {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		a, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
		if err != nil {
			t.Fatal(err)
		}
		b, err := ln.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	}
	for _, tc := range []struct {
		name     string
		queued   bool // the client's bytes wait at the proxy's down socket
		stuck    bool // the upstream's send buffer is full
		wantIdle bool
	}{
		{"nothing queued", false, false, true},
		{"bytes queued, room upstream", true, false, false},
		{"bytes queued, upstream full", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, down := pair()
			up, origin := pair()
			origin.SetReadBuffer(4096)
			p := &pipe{down: down, up: up, idle: 100 * time.Millisecond}
			p.last.Store(time.Now().Add(-time.Second).UnixNano()) // quiet for 10 timeouts
			tm := time.AfterFunc(time.Hour, func() {})
			defer tm.Stop()
			p.timer.Store(tm)
			if tc.stuck {
				up.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
				buf := make([]byte, 64<<10)
				for {
					if _, err := up.Write(buf); err != nil {
						break // full: the deadline
					}
				}
			}
			if tc.queued {
				client.Write([]byte("request"))
				rc, _ := down.SyscallConn()
				testenv.WaitFor(t, 5*time.Second, "the bytes queued", func() bool { n, _ := peekQueued(rc); return n > 0 })
			}
			p.checkIdle()
			if got := p.idled.Load(); got != tc.wantIdle {
				t.Errorf("idled = %v; want %v", got, tc.wantIdle)
			}
		})
	}
}
