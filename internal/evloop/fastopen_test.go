//go:build linux

package evloop

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"golang.org/x/sys/unix"
)

// fastOpenChild marks the re-executed test binary running inside a fresh
// network namespace with net.ipv4.tcp_fastopen=3 (client and server).
const fastOpenChild = "MOSTO_EVLOOP_FASTOPEN_CHILD"

// TestFastOpenCookieRefused is the case Upstream.FastOpen exists for: with
// a cookie cached, the first write puts the prefix and the client's bytes
// into the SYN and returns as if sent; the upstream then refuses. The loop
// must have kept every byte and give them all to the retried upstream.
// (Without a cookie the kernel sends a bare SYN and keeps nothing, which
// TestFastOpenUpstream covers.)
func TestFastOpenCookieRefused(t *testing.T) {
	if !inFastOpenNetns(t) {
		return
	}
	good := newUpServer(t, echoServe)
	// An upstream that speaks Fast Open, for the cookie, then goes away.
	tfoFD, tfoAddr := listenFD(t, 128)
	if err := unix.SetsockoptInt(tfoFD, unix.IPPROTO_TCP, unix.TCP_FASTOPEN, 16); err != nil {
		t.Fatal(err)
	}
	tfoLn, err := net.FileListener(os.NewFile(uintptr(tfoFD), "tfo"))
	if err != nil {
		t.Fatal(err)
	}
	defer tfoLn.Close()
	go func() {
		for {
			c, err := tfoLn.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				echoServe(c.(*net.TCPConn))
			}()
		}
	}()
	h := newTestHandler(t, good.addr)
	h.open = func(rec *flowRec) (Upstream, error) { return Upstream{Wait: 5 * time.Second}, nil }
	h.dial = func(rec *flowRec, first []byte) (Upstream, error) {
		return Upstream{FD: dialFastOpenTo(t, tfoAddr), FastOpen: true, Prefix: []byte("A"), Retry: true}, nil
	}
	h.retry = func(rec *flowRec, failed error) (Upstream, error) {
		fd, err := Dial(good.addr, nil)
		return Upstream{FD: fd, Prefix: []byte("B")}, err
	}
	r := newRig(t, Config{Loops: 1, ConnectTimeout: time.Second}, h)
	trip := func(msg string) string {
		c := r.dial(t)
		got, err := exchange(c, []byte(msg), 0)
		if err != nil {
			t.Fatalf("flow %q: %v", msg, err)
		}
		return string(got)
	}
	if got := trip("first, asks for a cookie"); got != "Afirst, asks for a cookie" {
		t.Fatalf("first flow echoed %q", got)
	}
	before := testenv.TCPExt(t, "TCPFastOpenActive")
	if got := trip("second, in the SYN"); got != "Asecond, in the SYN" {
		t.Fatalf("second flow echoed %q", got)
	}
	if testenv.TCPExt(t, "TCPFastOpenActive") == before {
		t.Fatal("the second flow's bytes did not ride in the SYN (no cookie?)")
	}
	tfoLn.Close() // the port now refuses (both descriptors of the socket closed)
	unix.Close(tfoFD)
	msg := "third, in a SYN that gets a reset"
	if got := trip(msg); got != "B"+msg {
		t.Fatalf("after a refused Fast Open SYN with data the retried upstream echoed %q; want %q", got, "B"+msg)
	}
	if n := len(h.retryErrors()); n != 1 {
		t.Errorf("%d retries; want 1", n)
	}
	ends := h.waitEnded(t, 3, 5*time.Second)
	for _, d := range ends {
		if d.o != OK {
			t.Errorf("flow %d ended %v (%v); want ok", d.rec.id, d.o, d.err)
		}
	}
}

// inFastOpenNetns re-runs the calling test in a new network namespace with
// net.ipv4.tcp_fastopen=3 and reports whether this process is that child.
func inFastOpenNetns(t *testing.T) bool { return testenv.InFastOpenNetns(t, fastOpenChild) }
