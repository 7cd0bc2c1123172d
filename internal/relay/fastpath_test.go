package relay_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/evloop"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestLoopsServeServiceFlows checks who carries a service flow: with
// loops on (the default) an event loop holds a short flow and hands a bulk
// one to the goroutine path with every byte intact; with loops: -1 no loop
// exists and flows work the same.
func TestLoopsServeServiceFlows(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loops int
	}{{"default", 0}, {"two", 2}, {"off", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckLeaks(t)
			w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) { c.Loops = tc.loops }}, "a", "b", "c")
			var loops *evloop.Loops
			testenv.WaitFor(t, 5*time.Second, "loops", func() bool {
				loops = w.Members["a"].Loops()
				return loops != nil || tc.loops < 0
			})
			if on := loops != nil; on != (tc.loops >= 0) {
				t.Fatalf("loops running = %v with loops: %d", on, tc.loops)
			}
			// A short exchange: the flow stays in a loop.
			c := relay.DialPing(t, w.Members["a"].ServiceAddr(0).String())
			if loops != nil {
				if n := loops.Flows(); n != 1 {
					t.Errorf("flows in loops after a short exchange = %d; want 1", n)
				}
			}
			// A bulk exchange: handed over to the goroutine path, which
			// splices; the bytes arrive exact and in order.
			relay.BulkEcho(t, c, 4<<20)
			if loops != nil {
				if n := loops.Flows(); n != 0 {
					t.Errorf("flows in loops after 4 MiB = %d; want 0 (handed over)", n)
				}
			}
			c.(*net.TCPConn).CloseWrite()
			if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
				t.Fatalf("after half-close: %d bytes, %v; want EOF", len(rest), err)
			}
			want := float64(2 * (4 + 4<<20))
			testenv.WaitFor(t, 5*time.Second, "flow accounting", func() bool {
				return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeOK) == 1 && relay.MetricSum(w.Members["a"], "mosto_relay_bytes_total") == want
			})
		})
	}
}

// TestLoopsFirstHopDown checks that a loop serves a flow directly when the
// first hop of its chain refuses the connection, as the goroutine path
// does, and that the client's bytes sent meanwhile are not lost.
func TestLoopsFirstHopDown(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{}, "a", "b", "c")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	w.Members["a"].SetMembers(map[string]string{"a": w.Members["a"].HopAddr().String(), "b": deadAddr, "c": w.Members["c"].HopAddr().String()})
	msg := bytes.Repeat([]byte("0123456789"), 1000)
	if got := testenv.RoundTrip(t, w.Members["a"].ServiceAddr(0).String(), msg); !bytes.Equal(got, msg) {
		t.Fatalf("echo with the first hop down: %d bytes, want %d identical", len(got), len(msg))
	}
	if n := relay.DirectCount(w.Members["a"], "hop_unreachable"); n != 1 {
		t.Errorf("direct{hop_unreachable} = %v; want 1", n)
	}
	testenv.WaitFor(t, 5*time.Second, "flow accounting", func() bool {
		return relay.Flows(w.Members["a"], relay.RoleInP, relay.OutcomeOK) == 1
	})
}

// TestLoopsRefuseOverLimit checks admission on the loop path: a source
// over its limit is refused with a reset and counted.
func TestLoopsRefuseOverLimit(t *testing.T) {
	testenv.CheckLeaks(t)
	w := relaytest.OverlayWith(t, relaytest.Options{Tweak: func(c *relay.Config) { c.Limits.MaxConnsPerSource = 1 }}, "a", "b", "c")
	first, err := net.Dial("tcp", w.Members["a"].ServiceAddr(0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	first.SetDeadline(time.Now().Add(10 * time.Second))
	first.Write([]byte("x"))
	if _, err := io.ReadFull(first, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	// On loopback the loop's reset can reach the client before its
	// connect returns: a dial reset is the refusal too.
	second, err := net.Dial("tcp", w.Members["a"].ServiceAddr(0).String())
	switch {
	case errors.Is(err, syscall.ECONNRESET):
	case err != nil:
		t.Fatal(err)
	default:
		defer second.Close()
		second.SetDeadline(time.Now().Add(10 * time.Second))
		second.Write([]byte("y"))
		if n, err := second.Read(make([]byte, 1)); err == nil {
			t.Fatalf("second flow from the same source read %d bytes; want a reset", n)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "refusals{limit_source} = 1", func() bool {
		return relay.Refusals(w.Members["a"], relay.RefuseLimitSource) == 1
	})
}

// TestLoopsReusePortSocketPerLoop: with socket.reuseport each event loop
// listens on a socket of its own (the kernel hands each connection to one
// loop and wakes that one alone); without it the loops share one socket.
// Flows work either way.
func TestLoopsReusePortSocketPerLoop(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reuse   bool
		loops   int
		sockets int
	}{{"reuseport", true, 2, 2}, {"shared", false, 2, 1}, {"one loop", true, 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.CheckLeaks(t)
			o := testenv.NewServer(t, testenv.Echo)
			port := relay.FreePorts(t, 1)[0]
			c := relaytest.Config("a")
			c.Hop.Listen = ""
			c.Keys.Current = nil
			c.Loops = tc.loops
			c.Socket.ReusePort = tc.reuse
			c.Services = []relay.ServiceConfig{{Name: "svc", Listen: fmt.Sprintf("127.0.0.1:%d", port), Origin: o.Addr()}}
			d := relaytest.Run(t, c)
			testenv.WaitFor(t, 5*time.Second, "loops", func() bool { return d.Loops() != nil })
			if n := listeningSockets(t, port); n != tc.sockets {
				t.Errorf("%d listening sockets on the service port with %d loops, reuseport %v; want %d", n, tc.loops, tc.reuse, tc.sockets)
			}
			for range 8 {
				relay.DialPing(t, d.ServiceAddr(0).String()).Close()
			}
			testenv.WaitFor(t, 5*time.Second, "8 flows ended", func() bool {
				return relay.Flows(d.Server, relay.RoleInP, relay.OutcomeOK) == 8
			})
		})
	}
}

// listeningSockets counts the distinct listening TCP sockets on port among
// this process's descriptors (the daemon runs in the test process; the
// loops hold duplicates, so sockets are told apart by inode).
func listeningSockets(t *testing.T, port int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	inodes := map[uint64]bool{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			continue
		}
		if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || on != 1 {
			continue
		}
		if sa, err := unix.Getsockname(fd); err == nil {
			if a, ok := sa.(*unix.SockaddrInet4); ok && a.Port == port {
				inodes[st.Ino] = true
			}
		}
	}
	return len(inodes)
}
