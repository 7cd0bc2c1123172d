//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
)

// TestHandoverPreDrain: a BBR flow relayed peer2 -> relay -> peer1 (40
// Mbit/s, 25 ms per link, so 50 ms per leg) whose relay holds a backlog
// toward peer1 of 6 in-leg BDPs when it is handed over (Fig. 3: the in-leg
// sender's startup excess, never drained while both legs move at one rate,
// 6 MB at 100 ms; built here by pausing the relay's copies until its
// queue from peer2 holds 1.5 MB). The frozen handover lets the sender run
// to its edge and then waits, the sender stopped with nothing in flight,
// until that backlog is down to about one in-leg RTT (tailReady). With
// Config.PreDrain the sender is first held to a small window while the
// backlog drains, then runs a few RTTs to a short frozen edge and reaches
// it with little backlog left: the join comes before it stops.
//
// Asserted: the longest time peer2 had nothing in flight between the
// handover's start and the join: at most 100 ms (two in-leg RTTs) with the
// pre-drain, at least 150 ms without it (the control: what the pre-drain
// removes, and that the setup builds the backlog; the best of three
// tries). 22:29-23:18 (load 1.2-2.7, some with -race, the package's other
// tests or a CPU hog on both cores beside it): off 140-1521 ms (9 runs),
// on 0-65 ms (9 runs; the 65 with the hog, before the sampler ignored its
// own late wakeups).
func TestHandoverPreDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("emulator test")
	}
	t.Run("off", func(t *testing.T) {
		if stops, ok := controlTries(t, 3, func(t *testing.T) (time.Duration, bool) {
			stop := measurePreDrain(t, 0)
			return stop, stop >= 150*time.Millisecond
		}); !ok {
			t.Errorf("without a pre-drain the sender was stopped at most %v before the join in three tries: want at least 150 ms once (the backlog's drain)", stops)
		}
	})
	t.Run("on", func(t *testing.T) {
		if stop := measurePreDrain(t, DefaultPreDrain); stop > 100*time.Millisecond {
			t.Errorf("with a pre-drain the sender was stopped %v before the join: want at most 100 ms", stop)
		}
	})
}

// measurePreDrain builds the relay's backlog, hands the flow over with the
// given pre-drain and returns the longest time peer2's socket had nothing
// in flight between the handover's start and the join.
func measurePreDrain(t *testing.T, pre float64) time.Duration {
	const (
		oneWay = 25.0 // ms per link: 100 ms end to end, 50 ms per leg
		rate   = 40.0 // Mbit/s, both links
		queue  = 20.0 // ms
	)
	one, r, q := oneWay, rate, queue
	whole := 2 * oneWay
	spec := &emu.Spec{
		Name:  "xpre",
		Hosts: []emu.HostSpec{{Name: "p1"}, {Name: "relay"}, {Name: "p2"}},
		Links: []emu.LinkSpec{
			{A: "p1", B: "relay", DelayMS: &one, RateMbit: &r, QueueMS: &q},
			{A: "relay", B: "p2", DelayMS: &one, RateMbit: &r, QueueMS: &q},
			{A: "p1", B: "p2", DelayMS: &whole},
		},
		TCP: emu.TCP{Congestion: "bbr"},
	}
	w := emutest.Start(t, spec)
	ctx := t.Context()
	var s *Splicer
	if err := w.Do("relay", func() (err error) {
		s, err = Open(ctx, Config{Freeze: true, Tail: true, DrainPace: DefaultDrainPace, PreDrain: pre, Log: testLog(t)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv, err := w.Listen(ctx, "p2", "tcp", ":9311")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rl, err := w.Listen(ctx, "relay", "tcp", ":9310")
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()

	// peer2 streams until the test ends; peer1 reads and counts.
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	sender := make(chan *net.TCPConn, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := srv.Accept()
		if err != nil {
			close(sender)
			return
		}
		defer c.Close()
		sender <- c.(*net.TCPConn)
		context.AfterFunc(sctx, func() { c.Close() })
		buf := make([]byte, 128<<10)
		for sctx.Err() == nil {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c1, err := w.Dial(ctx, "p1", "tcp", fmt.Sprintf("%s:9310", w.Addr("relay")))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	var got atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 128<<10)
		for {
			n, err := c1.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	ca, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	// (The buffer is forced before connecting, so the window scale fits;
	// the window is clamped at 2 MB, so the frozen edge without a
	// pre-drain is at most that far: the sender reaches it within about
	// 0.4 s with the backlog still there. With the whole 16 MB window the
	// sender ran 4-5 s to its edge and the out-leg had sometimes caught up
	// by then: stops of 1-135 ms in one CI run's three tries.)
	var cb net.Conn
	if err := w.Do("relay", func() (err error) {
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
				if serr == nil {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, 2<<20)
				}
			}); err != nil {
				return err
			}
			return serr
		}}
		cb, err = d.DialContext(ctx, "tcp", fmt.Sprintf("%s:9311", w.Addr("p2")))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	a, b := ca.(*net.TCPConn), cb.(*net.TCPConn)
	copies := make(chan error, 2)
	go copyHalf(b, a, copies)
	go copyHalf(a, b, copies)
	c2, ok := <-sender
	if !ok {
		t.Fatal("peer2 accepted no connection")
	}
	fd2, err := connFD(c2)
	if err != nil {
		t.Fatal(err)
	}

	// Steady state, then the backlog: the relay stops copying and lets
	// its receive queue from peer2 grow to 1.5 MB (6 in-leg BDPs: what a
	// relay whose in-leg sender outran its out-leg holds, Fig. 3's 6 MB at
	// 100 ms), its buffer big enough that the window never stops peer2
	// first. Peer2 keeps sending at its rate meanwhile.
	waitBytes(t, &got, 2<<20, 20*time.Second)
	a.SetReadDeadline(time.Now())
	b.SetReadDeadline(time.Now())
	for range 2 {
		if err := <-copies; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("relay copy: %v", err)
		}
	}
	bfd, err := connFD(b)
	if err != nil {
		t.Fatal(err)
	}
	const backlogWant = 1500 << 10
	deadline := time.Now().Add(20 * time.Second)
	backlog := 0
	for backlog < backlogWant {
		if time.Now().After(deadline) {
			t.Fatalf("the relay's queue from peer2 reached only %d bytes in 20 s: want %d", backlog, backlogWant)
		}
		time.Sleep(5 * time.Millisecond) // (polling a queue, not ordering)
		if backlog, err = unix.IoctlGetInt(bfd, unix.SIOCINQ); err != nil {
			t.Fatal(err)
		}
	}

	// peer2's packets in flight, sampled every millisecond from the
	// handover's start: the longest run with none (the sender stopped at
	// its edge, everything acknowledged), counted between samples at most
	// 5 ms apart.
	var mu sync.Mutex
	var longest, run time.Duration
	var last time.Time
	samplerCtx, stopSampler := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		last = time.Now()
		for {
			select {
			case <-samplerCtx.Done():
				return
			case <-tick.C:
			}
			info, err := unix.GetsockoptTCPInfo(fd2, unix.IPPROTO_TCP, unix.TCP_INFO)
			now := time.Now()
			mu.Lock()
			switch {
			case now.Sub(last) > 5*time.Millisecond:
				// The sampler itself was late (a loaded machine): what
				// the sender did in between is unknown, so a run is
				// neither extended nor started across the gap.
				run = -1
			case err == nil && info.Unacked == 0:
				if run >= 0 {
					run += now.Sub(last)
					longest = max(longest, run)
				} else {
					run = 0
				}
			default:
				run = 0
			}
			mu.Unlock()
			last = now
		}
	}()
	var sp *Splice
	if err := w.Do("relay", func() (err error) {
		hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		sp, err = s.Handover(hctx, a, b)
		return err
	}); err != nil {
		stopSampler()
		t.Fatalf("handover: %v", err)
	}
	stopSampler()
	<-sampled
	// The flow goes on through the join.
	waitBytes(t, &got, got.Load()+1<<20, 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("pre-drain %.2f: relay backlog at the handover %d KB; joined %v after the start (pre-drain %v, tail %v); sender stopped at most %v",
		pre, backlog>>10, sp.Phases.Joined.Round(time.Millisecond), sp.Phases.PreDrain.Round(time.Millisecond), sp.Phases.Tail.Round(time.Millisecond), longest.Round(time.Millisecond))
	return longest
}

// testLog is the splicer's logger in TestHandoverPreDrain: the handover's
// debug log on stderr with MOSTO_XLATE_DEBUG set, else none.
func testLog(t *testing.T) *slog.Logger {
	if os.Getenv("MOSTO_XLATE_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
