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

// TestWindowShort: an offload waits while a direction's receiver window
// would limit the joined flow (below the out-leg's delivery rate times both
// legs' RTTs), unless that direction carries little or the kernel does not
// report the window.
func TestWindowShort(t *testing.T) {
	mbit := func(m float64) uint64 { return uint64(m * 1e6 / 8) }
	idle := ccSample{rtt: 10 * time.Millisecond, sndWnd: 1 << 20}
	for _, c := range []struct {
		name     string
		down, up ccSample // down: the client's leg, up: the origin's
		short    bool
		in       int
	}{
		// 120 Mbit/s to a client at 0.1 ms whose window is 128 KB; joined
		// RTT 10.1 ms needs ~150 KB.
		{"ingress relay, client window 128 KB", ccSample{rtt: 100 * time.Microsecond, deliveryRate: mbit(120), sndWnd: 128 << 10},
			idle, true, 1},
		{"client window 4 MB", ccSample{rtt: 100 * time.Microsecond, deliveryRate: mbit(120), sndWnd: 4 << 20}, idle, false, 0},
		{"little data: the request direction", ccSample{rtt: 100 * time.Microsecond, deliveryRate: mbit(1), sndWnd: 1000}, idle, false, 0},
		{"window unknown", ccSample{rtt: 100 * time.Microsecond, deliveryRate: mbit(120), sndWnd: -1}, idle, false, 0},
		{"upload: the origin's window", idle, ccSample{rtt: 50 * time.Millisecond, deliveryRate: mbit(200), sndWnd: 256 << 10}, true, 0},
	} {
		short, in := windowShort([2]ccSample{c.down, c.up})
		if short != c.short || (short && in != c.in) {
			t.Errorf("%s: windowShort = %v, %d; want %v, %d", c.name, short, in, c.short, c.in)
		}
	}
}
