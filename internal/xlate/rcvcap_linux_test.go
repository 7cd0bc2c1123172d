//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCapRcvbuf: once the handover stops consuming, the kernel goes on
// offering window while the receive buffer has room, so a sender keeps
// sending until it fills it (megabytes), whatever the window clamp.
// capRcvbuf cuts the buffer to what it holds plus room for the window
// already offered: the sender stops after about that window. Side by side
// on loopback: a receiver that never reads, whose buffer grows from 256 KB
// to 16 MB after its sender stopped, queues megabytes more without the cap
// and at most what it held plus a few windows with it; restoreRcvbuf gives
// the buffer back.
func TestCapRcvbuf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SO_RCVBUFFORCE needs CAP_NET_ADMIN")
	}
	// queued fills one connection whose receiver never reads; with
	// capped, the cap is applied once its buffer grew behind the window
	// the receiver offered. It returns what
	// was queued then, what the window offered was, and what was queued
	// once the sender stopped (no growth for 300 ms).
	queued := func(capped bool) (atCap, wnd, final int, l *leg) {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		// The receiver's buffer is set before the connection exists (the
		// window scale follows it): 16 MB.
		rc, err := ln.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		// A small buffer first: the sender stops at a window of some
		// 100 KB; then the buffer grows to 16 MB behind that window (an
		// autotuned buffer behind the drain bound's clamp).
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 128<<10) })
		snd, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer snd.Close()
		ln.SetDeadline(time.Now().Add(30 * time.Second))
		rcv, err := ln.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rcv.Close() })
		go func() {
			buf := make([]byte, 64<<10)
			snd.SetWriteDeadline(time.Now().Add(20 * time.Second))
			for {
				if _, err := snd.Write(buf); err != nil {
					return
				}
			}
		}()
		fd, err := connFD(rcv)
		if err != nil {
			t.Fatal(err)
		}
		l = &leg{c: rcv, fd: fd}
		inq := func() int {
			n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		deadline := time.Now().Add(20 * time.Second)
		settle := func(quiet time.Duration) int {
			last, since := inq(), time.Now()
			for time.Since(since) < quiet && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
				if n := inq(); n != last {
					last, since = n, time.Now()
				}
			}
			return last
		}
		for inq() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("nothing arrived")
			}
			time.Sleep(time.Millisecond)
		}
		settle(300 * time.Millisecond)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
			t.Fatal(err)
		}
		st, err := readState(fd, false)
		if err != nil {
			t.Fatal(err)
		}
		atCap, wnd = st.InQ, int(st.RcvWnd)
		if capped {
			rmem, rcvbuf, _ := meminfo(fd)
			t.Logf("before the cap: rmem %d rcvbuf %d inq %d rcv_wnd %d", rmem, rcvbuf, st.InQ, st.RcvWnd)
			l.capRcvbuf()
			if l.rcvbuf == 0 {
				t.Fatal("capRcvbuf left a 16 MB buffer as it was")
			}
		}
		// One byte read: the receiver tells its sender the window it has
		// now (without it the sender's persist timer would, later).
		if _, err := rcv.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		return atCap, wnd, settle(time.Second), l
	}

	_, _, free, _ := queued(false)
	atCap, wnd, final, l := queued(true)
	t.Logf("without the cap: %d bytes queued; with it: %d at the cap (window %d), %d once the sender stopped", free, atCap, wnd, final)
	// Room for the offered window with its overhead and margin: at most
	// 1.5 x 2 x the window (the test's loopback skbs) past what was held.
	if limit := atCap + 3*max(wnd, 64<<10) + 64<<10; final > limit {
		t.Errorf("with the cap the receiver queued %d bytes, want at most %d (%d held + the offered window %d)", final, limit, atCap, wnd)
	}
	if free <= final+1<<20 {
		t.Errorf("without the cap the receiver queued %d bytes, with it %d: the test does not show the cap (want > 1 MB more without)", free, final)
	}
	before := l.rcvbuf
	l.restoreRcvbuf()
	if _, rcvbuf, _ := meminfo(l.fd); rcvbuf != before {
		t.Errorf("receive buffer after restore = %d, want %d", rcvbuf, before)
	}
}
