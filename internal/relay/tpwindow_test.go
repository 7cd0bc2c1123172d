package relay

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
)

func TestArrivalPeak(t *testing.T) {
	t0 := time.Unix(0, 0)
	var a arrivalPeak
	const tick = 50 * time.Millisecond
	steps := []struct {
		at   time.Duration
		segs uint32
		want float64 // peak, bytes/s
	}{
		{0, 100, 0},                        // first sample: no interval yet
		{20 * time.Millisecond, 200, 0},    // shorter than a tick: kept for the next interval
		{50 * time.Millisecond, 150, 1000}, // 50 segments of 1000 B in 50 ms
		{100 * time.Millisecond, 250, 2000},
		{200 * time.Millisecond, 300, 2000}, // slower: the peak stays
		{250 * time.Millisecond, 550, 5000},
	}
	for _, s := range steps {
		got := a.add(t0.Add(s.at), s.segs, 1, tick) // 1 B segments: segs per second
		if got*1e-3 != s.want*1e-3 && (got < s.want*0.999 || got > s.want*1.001) {
			t.Errorf("add(%v, %d) = %v; want %v", s.at, s.segs, got, s.want)
		}
	}
	// The counter wraps (u32).
	var w arrivalPeak
	w.add(t0, ^uint32(0)-9, 1000, tick)
	if got := w.add(t0.Add(100*time.Millisecond), 10, 1000, tick); got != 200e3 {
		t.Errorf("across the wrap: %v; want 200000 (20 segments of 1000 B in 100 ms)", got)
	}
}

func TestFollowWindow(t *testing.T) {
	for _, tt := range []struct {
		gain, peak float64
		rtt        time.Duration
		want       int
	}{
		{1.25, 0, 200 * time.Millisecond, 0},                            // no data: no estimate
		{1.25, 12.5e6, 0, 0},                                            // no RTT: none
		{1.25, 12.5e6, 200 * time.Millisecond, 3125000},                 // 100 Mbit/s x 200 ms x 1.25
		{1.25, 12.5e6, 4 * time.Millisecond, minFollowWindow},           // below the floor
		{16, 1.25e9, 10 * time.Second, 1 << 30},                         // capped
		{2, 1e6, 500 * time.Millisecond, max(minFollowWindow, 1000000)}, // 2 x 1 MB/s x 0.5 s
	} {
		if got := followWindow(tt.gain, tt.peak, tt.rtt); got != tt.want {
			t.Errorf("followWindow(%v, %v, %v) = %d; want %d", tt.gain, tt.peak, tt.rtt, got, tt.want)
		}
	}
	for _, tt := range []struct{ rtt, want time.Duration }{
		{0, followTickMin}, {4 * time.Millisecond, followTickMin}, {200 * time.Millisecond, 100 * time.Millisecond}, {2 * time.Second, followTickMax},
	} {
		if got := followTick(tt.rtt); got != tt.want {
			t.Errorf("followTick(%v) = %v; want %v", tt.rtt, got, tt.want)
		}
	}
	if got := readEvery(followTickMin); got != followTickMin {
		t.Errorf("readEvery(%v) = %v; want %v (at most 100 reads a second)", followTickMin, got, followTickMin)
	}
	if got := readEvery(100 * time.Millisecond); got != 25*time.Millisecond {
		t.Errorf("readEvery(100ms) = %v; want 25ms", got)
	}
}

// TestTProxyWindowBDP: with window_bdp the window the relay advertises to
// the server of an intercepted download (the server's tcpi_snd_wnd) stays
// near gain x the server leg's rate x its RTT, well under what autotuning
// offers over a deep queue, and follows the rate when the leg gets faster.
// The server's leg: 50 ms each way, 20 Mbit/s then 80 Mbit/s, a queue of
// 4000 packets (a sender without a bound fills it: ~2.4 s at 20 Mbit/s).
func TestTProxyWindowBDP(t *testing.T) {
	spec, err := emu.ParseSpec([]byte(`
hosts: [{name: c}, {name: r}, {name: s}]
links: [{a: c, b: r, delay_ms: 1}, {a: r, b: s, delay_ms: 50, rate_mbit: 20, queue_pkts: 4000}]
routes: [{from: c, to: s, via: [r]}]
tcp: {congestion: cubic}
`))
	if err != nil {
		t.Fatal(err)
	}
	w := emutest.Start(t, spec)
	ctx := context.Background()
	s := w.Addr("s")
	const gain = 1.25
	startTProxyChild(t, w, fmt.Sprintf("id: tt\ndestinations: {allow: [\"%v\"]}\ntproxy: {listen: \"0.0.0.0:15001\", ports: \"8080\", window_bdp: %v}\nsocket: {congestion: cubic}\ntimeouts: {drain: 1s}\n", emu.Prefix, gain))
	l, err := w.Listen(ctx, "s", "tcp4", netip.AddrPortFrom(s, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(s, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := c.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.Close()
	wg.Go(func() { io.Copy(io.Discard, c) })
	stop := make(chan struct{})
	wg.Go(func() {
		buf := make([]byte, 256<<10)
		for {
			select {
			case <-stop:
				sc.(*net.TCPConn).CloseWrite()
				return
			default:
			}
			if _, err := sc.Write(buf); err != nil {
				return
			}
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}()
	// phase samples the server's view for d: the largest send window and
	// the smallest RTT it measured.
	phase := func(d time.Duration) (maxWnd uint32, minRTT time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			ti := tcpInfo(t, sc.(*net.TCPConn))
			maxWnd = max(maxWnd, ti.Snd_wnd)
			minRTT = time.Duration(ti.Min_rtt) * time.Microsecond
			time.Sleep(10 * time.Millisecond) // sampling period, not ordering
		}
		return maxWnd, minRTT
	}
	// Phase 1, 20 Mbit/s: the BDP is 2.5 MB/s x ~100 ms = 250 KB, i.e.
	// the floor (256 KiB) or gain x BDP; autotuning alone offers MBs.
	w1, rtt1 := phase(5 * time.Second)
	bdp1 := 20e6 / 8 * rtt1.Seconds()
	// The estimate can read up to ~20% above the link's rate on a
	// loaded host (jitter of the emulator's deliveries), hence 2x, not
	// gain x.
	if hi := max(float64(minFollowWindow), 2*bdp1); float64(w1) > hi {
		t.Errorf("20 Mbit/s: the server's send window reached %d; want <= %.0f (window_bdp %v x BDP %.0f, with slack)", w1, hi, gain, bdp1)
	}
	// Phase 2: the leg gets 4x faster; the window follows.
	if err := w.SetLink("r", "s", emu.Link{DelayMS: 50, RateMbit: 80, QueuePkts: 4000}); err != nil {
		t.Fatal(err)
	}
	w2, rtt2 := phase(6 * time.Second)
	bdp2 := 80e6 / 8 * rtt2.Seconds()
	if lo := 0.8 * bdp2; float64(w2) < lo {
		t.Errorf("80 Mbit/s: the server's send window reached only %d; want >= %.0f (it should follow the rate: BDP %.0f)", w2, lo, bdp2)
	}
	if hi := 2 * bdp2; float64(w2) > hi {
		t.Errorf("80 Mbit/s: the server's send window reached %d; want <= %.0f", w2, hi)
	}
	if float64(w2) < 2*float64(w1) {
		t.Errorf("the window did not follow the rate: %d at 20 Mbit/s, %d at 80 Mbit/s", w1, w2)
	}
	t.Logf("server's max send window: %d at 20 Mbit/s (BDP %.0f, min RTT %v), %d at 80 Mbit/s (BDP %.0f, min RTT %v)", w1, bdp1, rtt1, w2, bdp2, rtt2)
}
