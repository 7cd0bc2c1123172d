package getbench

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/origin"
)

// TestCoupledSharedBottleneck: two coupled sub-flows through one 16 Mbit/s
// bottleneck, beside one competing TCP flow, take no more than one
// sub-flow (one TCP flow) takes there (RFC 6356's goal 2; two independent
// ones take about twice as much, logged), while a sub-flow on a disjoint
// 8 Mbit/s path fills its path.
func TestCoupledSharedBottleneck(t *testing.T) {
	if testing.Short() {
		t.Skip("emulator: not with -short")
	}
	spec := &emu.Spec{Name: "get-coupled", Dataset: "wonderproxy"}
	off := false
	spec.Offload = &off
	// CUBIC: the loss-based TCP flow RFC 6356 measures a share against.
	spec.TCP.Congestion = "cubic"
	spec.Hosts = append(spec.Hosts, emu.HostSpec{Name: client, Location: "Athens"},
		emu.HostSpec{Name: "shared", Location: "Milan"}, emu.HostSpec{Name: "solo", Location: "Budapest"})
	// A 20 ms queue (about the path's RTT, not the default 100 ms): flows
	// that start while another fills a deep queue take tens of seconds to
	// reach their share.
	r1, r2, q := 16.0, 8.0, 20.0
	spec.Links = append(spec.Links, emu.LinkSpec{A: client, B: "shared", RateMbit: &r1, QueueMS: &q}, emu.LinkSpec{A: client, B: "solo", RateMbit: &r2})
	w := emutest.Start(t, spec)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 2)
	for _, h := range []string{"shared", "solo"} {
		ln, err := w.Listen(ctx, h, "tcp", fmt.Sprintf("%s:%d", w.Addr(h), portHTTP))
		if err != nil {
			t.Fatal(err)
		}
		o := origin.New(origin.Config{Seed: 3}, nil)
		go func() { done <- o.Serve(ctx, ln) }()
	}
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("origin: %v", err)
			}
		}
	})
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return w.Dial(ctx, client, network, addr)
	}
	const size = 16_000_000
	u := func(h string, size int64) string {
		return fmt.Sprintf("http://%s:%d/obj?size=%d", w.Addr(h), portHTTP, size)
	}
	out := filepath.Join(t.TempDir(), "obj")
	frac := map[SharedMode]float64{}
	for _, mode := range []SharedMode{OnePath, TwoCoupled, TwoPaths} {
		// The disjoint sub-flow's path is not shared with anything: below
		// 0.75 of its rate it shows a starved emulator (a loaded CI run
		// saw 0.71-0.73 MB/s in one mode after 0.95 in the others), and
		// the mode is run once more; twice is a failure below.
		var r Shared
		for attempt := 1; attempt <= 2; attempt++ {
			gctx, gcancel := context.WithTimeout(ctx, 90*time.Second)
			var err error
			r, err = SharedBottleneck(gctx, dial, u("shared", size), u("solo", size), u("shared", 1<<30), size, mode, out)
			gcancel()
			if err != nil {
				t.Fatalf("%v: %v", mode, err)
			}
			if r.Solo >= 0.75 {
				break
			}
			t.Logf("%v attempt %d: the disjoint sub-flow ran at %.2f MB/s of its 1 MB/s path (starved emulator?)", mode, attempt, r.Solo)
		}
		frac[mode] = r.Ours / (r.Ours + r.Competitor)
		t.Logf("%v: %.2f s, ours %.2f MB/s, competitor %.2f MB/s (our fraction %.2f), solo %.2f MB/s", mode, r.Seconds, r.Ours, r.Competitor, frac[mode], r.Solo)
		sub := r.Stats.Subflows
		for _, sf := range sub {
			t.Logf("  %s: %d bytes, %d requests, rtt %.1f ms, %.2f MB/s, led %.1f s", sf.Path, sf.Bytes, sf.Requests, sf.RTTms, sf.MBps, sf.Led)
		}
		if r.Solo < 0.75 {
			t.Errorf("%v: the disjoint sub-flow ran at %.2f MB/s of its 1 MB/s path: want >= 0.75", mode, r.Solo)
		}
		if mode == TwoCoupled && sub[1].Bytes > 0 && sub[2].Bytes > 0 {
			t.Errorf("both coupled sub-flows carried bytes (%d, %d) with no fault: want one at a time", sub[1].Bytes, sub[2].Bytes)
		}
	}
	// The competing flow's share is noisy on a loaded machine (CUBIC, 10 s
	// downloads): two independent sub-flows took 0.51-0.67 in runs where
	// one took 0.39-0.47, and a loaded CI run saw one sub-flow take 0.28
	// (it started behind the competitor) while the coupled pair took a fair
	// 0.52; a quiet CI run (load 0.7-1.9) saw one sub-flow take 0.33 and
	// the coupled pair, whose leader carried every byte (one TCP flow),
	// 0.63. One TCP flow's share thus spreads over 0.28-0.63 from run to
	// run, so this bound is the fair share of two flows (0.5), or the
	// measured one if larger, with 0.2 of slack: it catches a pair that
	// takes far more than one flow, while the check that fails without
	// coupling is the one above (one sub-flow at a time).
	if one := max(frac[OnePath], 0.5); frac[TwoCoupled] > one+0.2 {
		t.Errorf("two coupled sub-flows took %.2f of the bottleneck, one sub-flow %.2f: want about one flow's share (<= %.2f)", frac[TwoCoupled], frac[OnePath], one+0.2)
	}
}
