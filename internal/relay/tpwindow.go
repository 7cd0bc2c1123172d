package relay

// Stage: copy (tproxy window_bdp). The receive window each leg of an
// intercepted flow advertises follows the leg's measured bandwidth-delay
// product, so the sender feeding the relay cannot overshoot its path's
// queue in slow start (docs/tts.md, session 14).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of the window follower.
const (
	// minFollowWindow is the least window a followed leg advertises
	// (bytes): below it a short leg's window would depend on a few
	// samples and the host's scheduling, and a sender this small cannot
	// overshoot a queue by much.
	minFollowWindow = 256 << 10
	// followTickMin and followTickMax bound the measuring interval, half
	// the leg's minimum RTT: short enough that a slow-start flight that
	// arrives as a burst at the path's bottleneck rate fills an interval
	// in the round before the sender's window reaches the BDP (a shorter
	// flight shows as at least twice its window per RTT, so the bound
	// never holds a slow start back), long enough that jitter and a loaded
	// host's late deliveries do not make one interval look faster than the
	// path (over a quarter of the RTT, 10 ms of jitter showed 108-139
	// Mbit/s on a 100 Mbit/s link).
	followTickMin = 10 * time.Millisecond
	followTickMax = 200 * time.Millisecond
	// rcvbufPerWindow is the locked receive buffer per byte of window:
	// the window a buffer allows is its free space times the bytes per
	// buffer byte the kernel measured (skb truesize: a third or less on
	// the emulator's TUN packets), and what the relay has not read yet
	// takes from it. The clamp bounds what the buffer holds anyway.
	rcvbufPerWindow = 8
)

// arrivalPeak measures a receiving leg's arrival rate over intervals of
// at least one tick and keeps the highest: segments that arrived (in
// order or not: counting in-order bytes, a reordered flight would show as
// a burst when its hole fills) times the peer's segment size. A slow-start
// flight that arrives as a burst at the bottleneck rate shows that rate
// as soon as it fills an interval.
type arrivalPeak struct {
	started bool
	at      time.Time
	segs    uint32  // tcpi_data_segs_in at `at`
	peak    float64 // bytes/s
}

// add takes a sample (now, the leg's data_segs_in and rcv_mss) and
// returns the peak rate so far (bytes/s); a sample less than tick after
// the last one is kept for the next interval.
func (a *arrivalPeak) add(now time.Time, segs, mss uint32, tick time.Duration) float64 {
	if !a.started {
		a.started, a.at, a.segs = true, now, segs
		return a.peak
	}
	dt := now.Sub(a.at)
	if dt < tick || dt <= 0 {
		return a.peak
	}
	rate := float64(segs-a.segs) * float64(mss) / dt.Seconds()
	a.at, a.segs = now, segs
	a.peak = max(a.peak, rate)
	return a.peak
}

// followWindow is the window a leg may advertise: gain x its peak
// arrival rate x its minimum RTT, at least minFollowWindow; 0 when there
// is no estimate yet (no data, or no RTT).
func followWindow(gain, peak float64, minRTT time.Duration) int {
	if peak <= 0 || minRTT <= 0 {
		return 0
	}
	w := gain * peak * minRTT.Seconds()
	if w > 1<<30 {
		w = 1 << 30
	}
	return max(minFollowWindow, int(w))
}

// readEvery is how often the follower reads its legs for an interval of
// tick: four times per interval (so that an interval ends within a
// quarter of its length), but at most every followTickMin (a flow on short
// legs, where the window sits at its floor anyway, costs at most 100
// wakeups a second).
func readEvery(tick time.Duration) time.Duration {
	return max(followTickMin, tick/4)
}

// followTick is the measuring interval of a leg with minimum RTT rtt.
func followTick(rtt time.Duration) time.Duration {
	return min(followTickMax, max(followTickMin, rtt/2))
}

// legFollower holds one leg's window state.
type legFollower struct {
	c      *net.TCPConn
	arr    arrivalPeak
	clamp  int  // the window clamp set (bytes); 0: none yet
	rcvbuf int  // the receive buffer locked (sk_rcvbuf, bytes); 0: not locked
	noLock bool // locking failed (no CAP_NET_ADMIN): re-set the clamp instead
	log    func(string, ...any)
}

// followWindows makes the receive window of each of conns follow
// gain x its peak arrival rate x its minimum RTT until ctx ends: the
// window clamp (TCP_WINDOW_CLAMP) is set as the estimate grows, never
// lowered, and the receive buffer is locked (SO_RCVBUFFORCE) at
// rcvbufPerWindow times the clamp, which stops receive autotuning from raising the clamp
// again (Linux makes the clamp follow an autotuned buffer). A leg
// without data (the request direction of a download) is left alone.
func followWindows(ctx context.Context, gain float64, log func(string, ...any), conns ...*net.TCPConn) {
	legs := make([]*legFollower, len(conns))
	for i, c := range conns {
		legs[i] = &legFollower{c: c, log: log}
	}
	tick := followTickMin
	t := time.NewTicker(readEvery(tick))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, l := range legs {
				if l.clamp > 0 && l.log != nil {
					l.log("tproxy window_bdp: leg done", "peak_mbit", l.arr.peak*8/1e6, "clamp", l.clamp, "rcvbuf", l.rcvbuf)
				}
			}
			return
		case <-t.C:
			next := followTickMax
			for _, l := range legs {
				if rtt, err := l.sample(gain); err == nil && rtt > 0 {
					next = min(next, followTick(rtt))
				}
			}
			if next != tick {
				tick = next
				t.Reset(readEvery(tick))
			}
		}
	}
}

// sample reads the leg's TCP_INFO, updates its estimate and applies the
// window; it returns the leg's minimum RTT.
func (l *legFollower) sample(gain float64) (time.Duration, error) {
	raw, err := l.c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var ti *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) { ti, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return 0, err
	}
	if ierr != nil {
		return 0, ierr
	}
	now := time.Now() // when the counters were read (not when the tick fired)
	rtt := time.Duration(ti.Min_rtt) * time.Microsecond
	peak := l.arr.add(now, ti.Data_segs_in, ti.Rcv_mss, followTick(rtt))
	w := followWindow(gain, peak, rtt)
	if w == 0 || (w <= l.clamp && !l.noLock) {
		return rtt, nil
	}
	var serr error
	raw.Control(func(fd uintptr) { serr = l.apply(int(fd), w) })
	if l.log != nil {
		l.log("tproxy window_bdp: window", "peak_mbit", peak*8/1e6, "min_rtt", rtt, "clamp", w, "rcvbuf", l.rcvbuf, "err", serr)
	}
	return rtt, nil
}

// apply sets the leg's window to w: the buffer first (so that the
// window is never held below w by it), then the clamp.
func (l *legFollower) apply(fd, w int) error {
	var errs []error
	if !l.noLock && rcvbufPerWindow*w > l.rcvbuf {
		// Lock the buffer at rcvbufPerWindow x w, or where autotuning
		// grew it.
		buf := rcvbufPerWindow * w
		if cur, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF); err == nil {
			buf = max(buf, cur)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, buf/2); err != nil { // the kernel doubles it
			l.noLock = true // autotuning stays on: re-set the clamp every sample
			errs = append(errs, fmt.Errorf("so_rcvbufforce: %w", err))
		} else {
			l.rcvbuf = buf
		}
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, w); err != nil {
		errs = append(errs, fmt.Errorf("tcp_window_clamp: %w", err))
	} else {
		l.clamp = w
	}
	return errors.Join(errs...)
}

// followFlow starts the window follower of an intercepted flow's legs
// when the entry has window_bdp; the returned function stops it and
// waits for it.
func (s *Server) followFlow(down, up *net.TCPConn) func() {
	c := s.cfg.TProxy
	if c == nil || c.WindowBDP <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(s.flows.ctx)
	var wg sync.WaitGroup
	log := func(msg string, args ...any) { s.log.Debug(msg, args...) }
	wg.Go(func() { followWindows(ctx, c.WindowBDP, log, down, up) })
	return func() {
		cancel()
		wg.Wait()
	}
}
