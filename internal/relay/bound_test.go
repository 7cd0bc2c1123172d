package relay

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDrainBounds: a direction's bounds are one RTT of the out-leg's
// delivery rate: over the in-leg's RTT for the window its sender gets, over
// the out-leg's own RTT for what the relay may hold; from cwnd x MSS per RTT
// when the kernel has no delivery rate yet; never below minDrainBound.
func TestDrainBounds(t *testing.T) {
	mbit := func(m float64) uint64 { return uint64(m * 1e6 / 8) }
	for _, c := range []struct {
		name      string
		in, out   ccSample
		wnd, hold int
	}{
		{"100 Mbit/s out", ccSample{rtt: 40 * time.Millisecond}, ccSample{rtt: 20 * time.Millisecond, deliveryRate: mbit(100)}, 500000, 250000},
		{"no rate: cwnd per RTT", ccSample{rtt: 100 * time.Millisecond},
			ccSample{rtt: 50 * time.Millisecond, cwnd: 1000, mss: 1000}, 2000000, 1000000},
		{"slow legs: the floor", ccSample{rtt: time.Millisecond}, ccSample{rtt: time.Millisecond, deliveryRate: mbit(10)}, minDrainBound, minDrainBound},
		{"nothing known", ccSample{}, ccSample{}, minDrainBound, minDrainBound},
	} {
		wnd, hold := drainBounds(c.in, c.out)
		if wnd != c.wnd || hold != c.hold {
			t.Errorf("%s: drainBounds = %d, %d; want %d, %d", c.name, wnd, hold, c.wnd, c.hold)
		}
	}
}

// TestBoundAndUnbound: on a due flow's first sample bound clamps each
// leg's offered window and cuts its send buffer and does not pause yet; a
// flow that holds nothing pauses on the next sample; any flow pauses after
// maxBoundSamples; unbound restores both settings.
func TestBoundAndUnbound(t *testing.T) {
	_, down := tcpPair(t)
	up, _ := tcpPair(t)
	p := &pipe{down: down, up: up, upBytes: nopBytes{}, dnBytes: nopBytes{},
		log: func(m string, a ...any) { t.Log(append([]any{m}, a...)...) }}
	opt := func(c *net.TCPConn, level, name int) int {
		raw, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		v := -1
		raw.Control(func(fd uintptr) { v, err = unix.GetsockoptInt(int(fd), level, name) })
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	clamp0, snd0 := opt(down, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP), opt(up, unix.SOL_SOCKET, unix.SO_SNDBUF)

	var o offloader
	// 8 Mbit/s on both legs at 100 ms: one RTT is 100 KB.
	leg := ccSample{rtt: 100 * time.Millisecond, deliveryRate: 1e6}
	st := watchState{prev: [2]ccSample{leg, leg}}
	if o.bound(p, &st) {
		t.Fatal("bound paused on the first sample; want the bounds set first")
	}
	if got := opt(down, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP); got != 100000 {
		t.Errorf("down's window clamp = %d, want 100000 (one RTT at the out-leg's rate)", got)
	}
	if got := opt(up, unix.SOL_SOCKET, unix.SO_SNDBUF); got != 2*200000 { // the kernel doubles it
		t.Errorf("up's send buffer = %d, want %d", got, 2*200000)
	}
	if !o.bound(p, &st) {
		t.Error("bound held back a flow that holds nothing")
	}

	// Whatever it still holds, a flow pauses after maxBoundSamples.
	st = watchState{prev: [2]ccSample{leg, leg}, bounding: maxBoundSamples - 1, dueAt: time.Now()}
	if !o.bound(p, &st) {
		t.Errorf("bound still held the flow back after %d samples", maxBoundSamples)
	}

	p.unbound()
	if got := opt(down, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP); got != clamp0 {
		t.Errorf("down's window clamp after unbound = %d, want %d", got, clamp0)
	}
	if got := opt(up, unix.SOL_SOCKET, unix.SO_SNDBUF); got != snd0 {
		t.Errorf("up's send buffer after unbound = %d, want %d", got, snd0)
	}
}
