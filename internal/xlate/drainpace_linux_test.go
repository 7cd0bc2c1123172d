//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
)

// TestHandoverDrainPace: a BBR flow relayed peer2 -> relay -> peer1 (as
// Fig. 3: equal links) keeps the relay -> peer1 link's 20 ms queue nearly
// full while the frozen handover relays up to the edge (the relay's own
// BBR: twice its bandwidth x min RTT in flight). The early join then puts
// the resumed sender's first round on top of that queue (Fig. 3, session
// 13: drops, recovered one end-to-end RTT later). With Config.DrainPace the
// relay's socket toward peer1 is paced below its rate during the
// handover: over the 50 ms before the join the queue must never be more
// than a quarter full. Without it (the "off" case) it reaches at least
// half in those 50 ms: what the pace removes, and that the setup builds
// the queue.
func TestHandoverDrainPace(t *testing.T) {
	if testing.Short() {
		t.Skip("emulator test")
	}
	for _, c := range []struct {
		name string
		pace float64
	}{{"off", 0}, {"paced", DefaultDrainPace}} {
		t.Run(c.name, func(t *testing.T) {
			testDrainPace(t, c.pace)
		})
	}
}

func testDrainPace(t *testing.T, pace float64) {
	const (
		oneWay  = 10.0 // ms per link: 40 ms end to end, 20 ms per leg
		rate    = 40.0 // Mbit/s
		queueMS = 20.0
	)
	one, r, q := oneWay, rate, queueMS
	whole := 2 * oneWay
	spec := &emu.Spec{
		Name:  "xpace",
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
		s, err = Open(ctx, Config{Freeze: true, Tail: true, DrainPace: pace})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv, err := w.Listen(ctx, "p2", "tcp", ":9301")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rl, err := w.Listen(ctx, "relay", "tcp", ":9300")
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()

	// peer2 streams until the test ends; peer1 reads and counts.
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := srv.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		context.AfterFunc(sctx, func() { c.Close() })
		buf := make([]byte, 128<<10)
		for sctx.Err() == nil {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c1, err := w.Dial(ctx, "p1", "tcp", fmt.Sprintf("%s:9300", w.Addr("relay")))
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
	cb, err := w.Dial(ctx, "relay", "tcp", fmt.Sprintf("%s:9301", w.Addr("p2")))
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	a, b := ca.(*net.TCPConn), cb.(*net.TCPConn)
	copies := make(chan error, 2)
	go copyHalf(b, a, copies)
	go copyHalf(a, b, copies)

	// The relay -> peer1 link's queueing delay, sampled every millisecond
	// from now on (the samples' times are since t0, the handover's start,
	// once it is set).
	type sample struct {
		at      time.Duration
		backlog time.Duration
	}
	var mu sync.Mutex
	var samples []sample
	var t0 time.Time
	sampled := make(chan struct{})
	samplerCtx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-samplerCtx.Done():
				return
			case <-tick.C:
				bl := w.Stats("relay", "p1").Backlog
				mu.Lock()
				samples = append(samples, sample{time.Since(t0), bl}) // t0 is set under mu
				mu.Unlock()
			}
		}
	}()

	// Steady state: BBR's startup is over within a second on a 40 ms
	// path; then the queue before the handover, over 500 ms.
	waitBytes(t, &got, 4<<20, 20*time.Second)
	mu.Lock()
	from := len(samples)
	mu.Unlock()
	waitBytes(t, &got, got.Load()+2<<20, 20*time.Second)
	mu.Lock()
	var before time.Duration
	for _, x := range samples[from:] {
		before += x.backlog
	}
	before /= time.Duration(max(1, len(samples)-from))
	mu.Unlock()

	a.SetReadDeadline(time.Now())
	b.SetReadDeadline(time.Now())
	for range 2 {
		if err := <-copies; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("relay copy: %v", err)
		}
	}
	q0 := w.Stats("relay", "p1").QueueDrops
	mu.Lock()
	t0 = time.Now()
	samples = samples[:0]
	mu.Unlock()
	var sp *Splice
	if err := w.Do("relay", func() (err error) {
		hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		sp, err = s.Handover(hctx, a, b)
		return err
	}); err != nil {
		t.Fatalf("handover: %v", err)
	}
	// The resumed sender's first round crosses the link within about one
	// end-to-end RTT of the join (the tail ends about as it comes).
	after := got.Load()
	waitBytes(t, &got, after+1<<20, 20*time.Second)
	drops := w.Stats("relay", "p1").QueueDrops - q0
	stopSampler()
	<-sampled

	// The backlog as the join came: the samples of the last 50 ms before
	// it (the sampler may lag on a loaded machine; over 50 ms the queue
	// moves little: full without the pace, drained over the handover's
	// last few hundred ms with it). Asserted: their largest (high); low,
	// their least, is logged.
	var low, high time.Duration
	n := 0
	for _, x := range samples {
		if x.at >= sp.Phases.Joined-50*time.Millisecond && x.at <= sp.Phases.Joined {
			if n == 0 || x.backlog < low {
				low = x.backlog
			}
			high = max(high, x.backlog)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no queue sample in the 50 ms before the join (%v after the handover's start)", sp.Phases.Joined)
	}
	t.Logf("pace %.2f: queue before the handover %v, in the 50 ms before the join %v-%v (%d samples; joined %v after the start, tail %v); link drops from the start to the first joined MB: %d",
		pace, before.Round(100*time.Microsecond), low.Round(100*time.Microsecond), high.Round(100*time.Microsecond), n, sp.Phases.Joined.Round(time.Millisecond), sp.Phases.Tail.Round(time.Millisecond), drops)
	if pace == 0 {
		// (Its least varies: BBR's own phases dip it for a few ms.)
		if high < queueMS/2*time.Millisecond {
			t.Errorf("without a drain pace the queue before the join reached only %v (before the handover %v): want at least half the link's %v ms", high, before, queueMS)
		}
		return
	}
	if high > queueMS/4*time.Millisecond {
		t.Errorf("queue before the join up to %v (before the handover %v): want at most a quarter of the link's %v ms", high, before, queueMS)
	}
}

// waitBytes waits until got reaches n (polled every 5 ms).
func waitBytes(t *testing.T, got *atomic.Int64, n int64, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for got.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("peer1 read %d bytes in %v: want %d", got.Load(), limit, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
