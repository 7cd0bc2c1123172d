package relay

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate"
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
	_, down := testenv.TCPPair(t)
	up, _ := testenv.TCPPair(t)
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
		// Smoothed RTTs of 20 ms on 10 ms paths (queues): with the minimum
		// RTTs the joined path needs 500 KB at 200 Mbit/s, with the
		// smoothed ones 1 MB.
		{"queues: minimum RTTs", ccSample{rtt: 20 * time.Millisecond, minRTT: 10 * time.Millisecond, deliveryRate: mbit(200), sndWnd: 600 << 10},
			ccSample{rtt: 20 * time.Millisecond, minRTT: 10 * time.Millisecond, sndWnd: 1 << 20}, false, 0},
		// A loaded machine's veths: milliseconds of scheduling delay in the
		// smoothed RTT, 50 us minimum; a joined path under minRuleRTT is
		// never held (session 9: TestOffloadSurvivesKill never offloaded).
		{"loaded veth", ccSample{rtt: 4 * time.Millisecond, minRTT: 50 * time.Microsecond, deliveryRate: mbit(8000), sndWnd: 1 << 20},
			ccSample{rtt: 4 * time.Millisecond, minRTT: 50 * time.Microsecond, sndWnd: 1 << 20}, false, 0},
	} {
		short, in := windowShort([2]ccSample{c.down, c.up})
		if short != c.short || (short && in != c.in) {
			t.Errorf("%s: windowShort = %v, %d; want %v, %d", c.name, short, in, c.short, c.in)
		}
	}
}

// TestSenderShort: an offload waits while a direction's sender keeps less
// in flight than the joined path needs: a loss-based sender (CUBIC) what it
// has in flight (rate x receive-side RTT), a rate-based one (BBR) twice its
// rate x the in-leg's minimum RTT, against joinKeep x rate x both legs'
// minimum RTTs (MOSTO Fig. 3).
func TestSenderShort(t *testing.T) {
	mbit := func(m float64) uint64 { return uint64(m * 1e6 / 8) }
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	// The client's leg (down) delivers at rate; the origin's leg (up)
	// receives the data, with rcv as its receive-side RTT.
	legs := func(downMin, upMin, rcv time.Duration, rate float64) [2]ccSample {
		return [2]ccSample{{rtt: downMin, minRTT: downMin, deliveryRate: mbit(rate)},
			{rtt: upMin, minRTT: upMin, rcvRTT: rcv}}
	}
	cubic, bbr := [2]bool{}, [2]bool{true, true}
	for _, c := range []struct {
		name  string
		legs  [2]ccSample
		rb    [2]bool
		short bool
	}{
		// 200 Mbit/s, 25 + 25 ms: the joined path needs 1.25 MB; CUBIC
		// with 10 ms of its own queue keeps 875 KB in flight.
		{"cubic, 50 ms, 10 ms queue", legs(ms(25), ms(25), ms(35), 200), cubic, true},
		{"cubic, 50 ms, 25 ms queue", legs(ms(25), ms(25), ms(50), 200), cubic, false},
		{"cubic, 100 ms, 20 ms queue", legs(ms(50), ms(50), ms(70), 200), cubic, true},
		{"bbr, equal legs", legs(ms(25), ms(25), ms(26), 200), bbr, false},
		{"bbr, short in-leg", legs(ms(45), ms(5), ms(5), 200), bbr, true},
		{"bbr, long in-leg", legs(ms(5), ms(45), ms(46), 200), bbr, false},
		{"little data", legs(ms(25), ms(25), ms(25), 1), cubic, false},
		{"veth", legs(ms(0.05), ms(0.05), ms(1), 10000), cubic, false},
		{"no receive RTT: the smoothed one", [2]ccSample{{rtt: ms(25), minRTT: ms(25), deliveryRate: mbit(200)},
			{rtt: ms(60), minRTT: ms(25)}}, cubic, false},
	} {
		short, in, have, need := senderShort(c.legs, c.rb)
		if short != c.short || (short && in != 1) {
			t.Errorf("%s: senderShort = %v, %d (have %.0f, need %.0f); want %v, 1", c.name, short, in, have, need, c.short)
		}
	}
}

// TestHoldRules: the default policy holds a due offload back while the
// flow is younger than age_rtts joined RTTs, or while the sender's or the
// receiver's window would limit the joined flow, counts
// each reason once per flow, and never bounds a held flow; offload.join_short
// joins regardless; a flow already bounded is not held again (the bound
// changed what the rules measure). (The bound is the drain handover's,
// offload.handover: drain; TestFrozenSkipsBound has the default's.)
func TestHoldRules(t *testing.T) {
	_, down := testenv.TCPPair(t)
	up, _ := testenv.TCPPair(t)
	p := &pipe{down: down, up: up, upBytes: nopBytes{}, dnBytes: nopBytes{}}
	mbit := func(m float64) uint64 { return uint64(m * 1e6 / 8) }
	// A CUBIC download at 200 Mbit/s over 25 + 25 ms whose sender keeps
	// 10 ms of queue: short of the joined path's window.
	cubicShort := [2]ccSample{{rtt: 25 * time.Millisecond, minRTT: 25 * time.Millisecond, deliveryRate: mbit(200), sndWnd: 8 << 20},
		{rtt: 25 * time.Millisecond, minRTT: 25 * time.Millisecond, rcvRTT: 35 * time.Millisecond, sndWnd: 8 << 20}}
	newState := func(legs [2]ccSample) *watchState {
		return &watchState{prev: legs, cc: true}
	}
	drain := OffloadConfig{Handover: HandoverDrain}
	o := &offloader{cfg: drain, log: slog.New(slog.DiscardHandler)}
	st := newState(cubicShort)
	for range 3 {
		if o.decide(p, st, true) {
			t.Fatal("decide paused a flow whose sender's window is short")
		}
	}
	if st.bounding != 0 {
		t.Errorf("a held flow was bounded (%d samples)", st.bounding)
	}
	if got := o.stats(); got.HeldSndWnd != 1 || got.HeldRcvWnd != 0 {
		t.Errorf("held counters = %+v, want one flow held by the sender's window", got)
	}

	// Its sender's queue grows to cover the joined path: bounded, then paused.
	grown := cubicShort
	grown[1].rcvRTT = 50 * time.Millisecond
	st.prev = grown
	if o.decide(p, st, true) || st.bounding != 1 {
		t.Errorf("after the window grew: want the flow bounded first (bounding %d)", st.bounding)
	}
	// Once bounded the rules are not asked again.
	st.prev = cubicShort
	if !o.decide(p, st, true) {
		t.Error("a bounded flow holding nothing did not pause")
	}
	p.unbound()

	// The receiver's window: a client window of 256 KB over 50 ms at 200 Mbit/s.
	rcvShort := grown
	rcvShort[0].sndWnd = 256 << 10
	st = newState(rcvShort)
	if o.decide(p, st, true) {
		t.Error("decide paused a flow whose receiver's window is short")
	}
	if got := o.stats(); got.HeldRcvWnd != 1 {
		t.Errorf("held by the receiver's window = %d, want 1", got.HeldRcvWnd)
	}

	// BBR keeps twice its rate x minimum RTT: the same flow is not held.
	st = newState(cubicShort)
	st.rateBased = [2]bool{true, true}
	if o.decide(p, st, true); st.bounding != 1 {
		t.Error("a BBR sender with equal legs was held back")
	}
	p.unbound()

	// A flow younger than age_rtts joined RTTs (20 x 50 ms) waits; with
	// age_rtts -1 it does not.
	grownSt := func() *watchState { st := newState(grown); st.born = time.Now(); return st }
	st = grownSt()
	if o.decide(p, st, true) || st.bounding != 0 {
		t.Error("a flow 0 s old on a 50 ms path was not held back")
	}
	if got := o.stats(); got.HeldYoung != 1 {
		t.Errorf("held as young = %d, want 1", got.HeldYoung)
	}
	st = grownSt()
	st.born = time.Now().Add(-2 * time.Second)
	if o.decide(p, st, true); st.bounding != 1 {
		t.Error("a flow 2 s old (40 joined RTTs) was held back")
	}
	p.unbound()
	oa := &offloader{cfg: OffloadConfig{Handover: HandoverDrain, AgeRTTs: -1}, log: slog.New(slog.DiscardHandler)}
	st = grownSt()
	if oa.decide(p, st, true); st.bounding != 1 {
		t.Error("age_rtts -1: a young flow was held back")
	}
	p.unbound()

	// join_short: the old policy.
	oj := &offloader{cfg: OffloadConfig{Handover: HandoverDrain, JoinShort: true}, log: slog.New(slog.DiscardHandler)}
	st = newState(cubicShort)
	if oj.decide(p, st, true); st.bounding != 1 {
		t.Error("join_short: the flow was held back")
	}
	p.unbound()
	if got := oj.stats(); got.HeldSndWnd+got.HeldRcvWnd != 0 {
		t.Errorf("join_short counted held flows: %+v", got)
	}
}

// TestFrozenSkipsBound: with the default handover (frozen, session 13) a
// due flow that passes the rules pauses on the same sample, its window
// clamp and send buffer untouched (the drain bound left the frozen edge
// about one RTT away, too close for the join to come before it), while the
// rules still hold a flow they would hold; the splicer runs the early join
// with the frozen edge; offload.handover: drain keeps the old path.
func TestFrozenSkipsBound(t *testing.T) {
	_, down := testenv.TCPPair(t)
	up, _ := testenv.TCPPair(t)
	p := &pipe{down: down, up: up, upBytes: nopBytes{}, dnBytes: nopBytes{}}
	clamp := func() int {
		raw, err := down.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		v := -1
		raw.Control(func(fd uintptr) { v, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP) })
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := clamp()
	mbit := func(m float64) uint64 { return uint64(m * 1e6 / 8) }
	// A BBR download at 200 Mbit/s over 25 + 25 ms, 2 s old.
	legs := [2]ccSample{{rtt: 25 * time.Millisecond, minRTT: 25 * time.Millisecond, deliveryRate: mbit(200), sndWnd: 8 << 20},
		{rtt: 25 * time.Millisecond, minRTT: 25 * time.Millisecond, rcvRTT: 35 * time.Millisecond, sndWnd: 8 << 20}}
	st := &watchState{prev: legs, cc: true, rateBased: [2]bool{true, true}, born: time.Now().Add(-2 * time.Second)}
	o := &offloader{log: slog.New(slog.DiscardHandler)}
	if !o.decide(p, st, true) {
		t.Fatal("frozen handover: a due BBR flow did not pause on its first sample")
	}
	if st.bounding != 0 || clamp() != before {
		t.Errorf("frozen handover: bounded (%d samples, clamp %d -> %d)", st.bounding, before, clamp())
	}
	// The rules still hold: a CUBIC sender short of the joined window.
	cubic := &watchState{prev: legs, cc: true, born: st.born}
	if o.decide(p, cubic, true) {
		t.Error("frozen handover: a CUBIC flow short of the joined window paused")
	}
	// The drain handover bounds the same BBR flow first.
	od := &offloader{cfg: OffloadConfig{Handover: HandoverDrain}, log: slog.New(slog.DiscardHandler)}
	st2 := &watchState{prev: legs, cc: true, rateBased: [2]bool{true, true}, born: st.born}
	if od.decide(p, st2, true) || st2.bounding != 1 {
		t.Errorf("drain handover: want the flow bounded on its first sample (bounding %d)", st2.bounding)
	}
	p.unbound()
	for _, c := range []struct {
		cfg          OffloadConfig
		tail, freeze bool
	}{
		{OffloadConfig{}, true, true},
		{OffloadConfig{Handover: HandoverFrozen}, true, true},
		{OffloadConfig{Handover: HandoverDrain}, false, false},
		{OffloadConfig{Handover: HandoverDrain, Tail: true}, true, false},
		{OffloadConfig{Handover: HandoverDrain, Tail: true, Freeze: true}, true, true},
	} {
		if tail, freeze := c.cfg.XlateHandover(); tail != c.tail || freeze != c.freeze {
			t.Errorf("%+v: XlateHandover() = %v, %v; want %v, %v", c.cfg, tail, freeze, c.tail, c.freeze)
		}
	}
	// The frozen handover paces the out-leg by default (session 14); -1
	// turns it off; the drain handover has none.
	for _, c := range []struct {
		cfg  OffloadConfig
		pace float64
	}{
		{OffloadConfig{}, xlate.DefaultDrainPace},
		{OffloadConfig{DrainPace: 0.8}, 0.8},
		{OffloadConfig{DrainPace: -1}, 0},
		{OffloadConfig{Handover: HandoverDrain, DrainPace: 0.8}, 0},
	} {
		if p := c.cfg.XlateDrainPace(); p != c.pace {
			t.Errorf("%+v: drain pace %v; want %v", c.cfg, p, c.pace)
		}
	}
}

// TestBoundsFixed: the drain bound's bounds never go down. Computed again
// from each sample's delivery rate, a clamped sender's lower rate shrank
// the next clamp (a BBR sender's bandwidth estimate followed it down to
// 0.4x in Fig. 3 and kept it after the join). They follow a faster sample
// up (session 13): kept at the first sample's, a flow still ramping up
// stayed clamped to its early rate (Fig. 4's chain).
func TestBoundsFixed(t *testing.T) {
	_, down := testenv.TCPPair(t)
	up, _ := testenv.TCPPair(t)
	p := &pipe{down: down, up: up, upBytes: nopBytes{}, dnBytes: nopBytes{}}
	clamp := func() int {
		raw, err := down.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		v := -1
		raw.Control(func(fd uintptr) { v, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP) })
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var o offloader
	// 80 Mbit/s out of the origin's leg at 100 ms: one RTT is 1 MB.
	leg := ccSample{rtt: 100 * time.Millisecond, deliveryRate: 10e6}
	st := watchState{prev: [2]ccSample{leg, leg}}
	o.bound(p, &st)
	first := clamp()
	if first != 1000000 {
		t.Fatalf("first clamp = %d, want 1000000", first)
	}
	// The clamped sender slows: the next samples see half the rate.
	slow := leg
	slow.deliveryRate /= 2
	st.prev = [2]ccSample{slow, slow}
	o.bound(p, &st)
	o.bound(p, &st)
	if got := clamp(); got != first {
		t.Errorf("clamp after slower samples = %d, want %d (the bounds of the first sample)", got, first)
	}
	// A flow still ramping up: the bounds follow its rate up.
	fast := leg
	fast.deliveryRate *= 3
	st.prev = [2]ccSample{fast, fast}
	o.bound(p, &st)
	if got := clamp(); got != 3*first {
		t.Errorf("clamp after a faster sample = %d, want %d", got, 3*first)
	}
	st.prev = [2]ccSample{slow, slow}
	o.bound(p, &st)
	if got := clamp(); got != 3*first {
		t.Errorf("clamp after a slower sample again = %d, want %d (never down)", got, 3*first)
	}
	p.unbound()
}

// TestBoundFastLeg: a direction whose held bytes drain within minDrainTime
// at the out-leg's rate is ready to pause whatever its RTT bound (a veth
// leg's 64 KB floor is microseconds there).
func TestBoundFastLeg(t *testing.T) {
	_, down := testenv.TCPPair(t)
	up, origin := testenv.TCPPair(t)
	p := &pipe{down: down, up: up, upBytes: nopBytes{}, dnBytes: nopBytes{}}
	// 1 MB waits in the origin's leg (up -> down).
	if err := up.SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	origin.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := origin.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, ok := readQueues(up)
		if ok && q.inq >= 1<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("1 MB never arrived (%+v)", q)
		}
		time.Sleep(time.Millisecond)
	}
	var o offloader
	// 16 Gbit/s at 50 us: one RTT is 100 KB, far below the 1 MB held, which
	// drains in 0.5 ms.
	leg := ccSample{rtt: 50 * time.Microsecond, deliveryRate: 2e9}
	st := watchState{prev: [2]ccSample{leg, leg}}
	o.bound(p, &st)
	if !o.bound(p, &st) {
		t.Error("a fast leg holding 1 MB (0.5 ms at its rate) was not ready on the second sample")
	}
	p.unbound()
	// The same 1 MB on a 100 Mbit/s leg: not ready.
	slow := ccSample{rtt: 50 * time.Microsecond, deliveryRate: 12.5e6}
	st = watchState{prev: [2]ccSample{slow, slow}}
	o.bound(p, &st)
	if o.bound(p, &st) {
		t.Error("a 100 Mbit/s leg holding 1 MB (80 ms) was ready on the second sample")
	}
	p.unbound()
}
