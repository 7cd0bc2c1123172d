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
