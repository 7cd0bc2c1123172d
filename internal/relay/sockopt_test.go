package relay

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSocketOptions checks that the configured options reach the socket.
func TestSocketOptions(t *testing.T) {
	nd := false
	sc := SocketConfig{RcvBuf: 256 << 10, SndBuf: 512 << 10, Congestion: "reno", NotSentLowat: 64 << 10, NoDelay: &nd}
	ln, err := (&net.ListenConfig{Control: sc.control(sockListen)}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen with options: %v", err)
	}
	defer ln.Close()
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) {
		for _, tc := range []struct {
			name       string
			level, opt int
			atLeast    int
		}{
			{"SO_RCVBUF", unix.SOL_SOCKET, unix.SO_RCVBUF, 256 << 10},
			{"SO_SNDBUF", unix.SOL_SOCKET, unix.SO_SNDBUF, 512 << 10},
			{"TCP_NOTSENT_LOWAT", unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, 64 << 10},
		} {
			v, err := unix.GetsockoptInt(int(fd), tc.level, tc.opt)
			if err != nil || v < tc.atLeast {
				t.Errorf("%s = %d, %v; want >= %d", tc.name, v, err, tc.atLeast)
			}
		}
		cc, err := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
		if err != nil || cc != "reno" {
			t.Errorf("TCP_CONGESTION = %q, %v; want reno", cc, err)
		}
	})
	bad := SocketConfig{Congestion: "no-such-cc"}
	if _, err := (&net.ListenConfig{Control: bad.control(sockListen)}).Listen(t.Context(), "tcp", "127.0.0.1:0"); err == nil {
		t.Error("unknown congestion control accepted")
	}
}
