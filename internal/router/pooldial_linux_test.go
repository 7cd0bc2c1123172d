//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package router

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHandoffPoolDelaysHandshakeAck: a handoff router dials its pool with
// the handshake's last ACK delayed (DelayHandshakeAck), so the
// surrogate's first RTT sample, which BBR keeps as its minimum, is not the
// short router-surrogate leg's (it was 1.07 ms against the handed-off
// path's 2.5 ms in the bench world: BBR left its startup early and 1 GB
// took 1.2x direct's time). On loopback the delayed ACK leaves after the
// kernel's delayed-ACK maximum (200 ms): the accepted socket's minimum RTT
// is at least 100 ms, whatever the load (the timer cannot fire early).
func TestHandoffPoolDelaysHandshakeAck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, err := NewPicker(PickConfig{Surrogates: []Surrogate{{"s", ln.Addr().String()}}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Mode: ModeHandoff, Picker: p, Joiner: &fakeJoiner{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := r.dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rc, err := s.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var ierr error
	rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if ierr != nil {
		t.Fatal(ierr)
	}
	if minRTT := time.Duration(info.Min_rtt) * time.Microsecond; minRTT < 100*time.Millisecond {
		t.Errorf("the surrogate's minimum RTT after the pool's handshake is %v; want >= 100 ms (the handshake's last ACK delayed)", minRTT)
	}
}
