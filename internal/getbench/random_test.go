package getbench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/origin"
)

// TestRandomScenarios runs 100 downloads in the emulator (client in Athens,
// three WonderProxy-city sources) with random object and range sizes,
// random per-source bottlenecks and random faults: a source silent for a
// while from a random moment, a source that refuses connections, a mirror
// of another object, a source slowed to a trickle mid-way. Every download
// must succeed with the right SHA-256 (checked by Get and again here).
func TestRandomScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("emulator scenarios: not with -short")
	}
	spec := &emu.Spec{Name: "get-random", Dataset: "wonderproxy"}
	off := false
	spec.Offload = &off
	spec.Hosts = append(spec.Hosts, emu.HostSpec{Name: client, Location: "Athens"})
	for _, s := range sources {
		spec.Hosts = append(spec.Hosts, emu.HostSpec{Name: s.host, Location: s.city})
	}
	w := emutest.Start(t, spec)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, len(sources))
	origins := map[string]*origin.Server{}
	for _, s := range sources {
		ln, err := w.Listen(ctx, s.host, "tcp", fmt.Sprintf("%s:%d", w.Addr(s.host), portHTTP))
		if err != nil {
			t.Fatal(err)
		}
		o := origin.New(origin.Config{Seed: 3}, nil)
		origins[s.host] = o
		go func() { done <- o.Serve(ctx, ln) }()
	}
	t.Cleanup(func() {
		cancel()
		for range sources {
			if err := <-done; err != nil {
				t.Errorf("origin: %v", err)
			}
		}
	})
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return w.Dial(ctx, client, network, addr)
	}
	out := filepath.Join(t.TempDir(), "obj")
	rng := rand.New(rand.NewPCG(2026, 17))
	faults := map[string]int{}
	for n := 0; n < 100; n++ {
		size := 64<<10 + rng.Int64N(1<<20)
		for _, s := range sources {
			l, err := w.Link(client, s.host)
			if err != nil {
				t.Fatal(err)
			}
			l.RateMbit = float64(20 + rng.IntN(180))
			if err := w.SetLink(client, s.host, l); err != nil {
				t.Fatal(err)
			}
			origins[s.host].SetRate(0)
			origins[s.host].Silence(0)
		}
		var srcs []mget.Source
		for _, s := range sources {
			srcs = append(srcs, mget.Source{URL: fmt.Sprintf("http://%s:%d/obj?size=%d", w.Addr(s.host), portHTTP, size), Dial: dial})
		}
		victim := rng.IntN(len(sources))
		fault := []string{"none", "silent", "refuses", "other object", "trickle"}[rng.IntN(5)]
		faults[fault]++
		var timer *time.Timer
		switch fault {
		case "silent":
			o, d := origins[sources[victim].host], time.Duration(200+rng.IntN(1000))*time.Millisecond
			timer = time.AfterFunc(time.Duration(rng.IntN(300))*time.Millisecond, func() { o.Silence(d) })
		case "refuses":
			srcs[victim].URL = fmt.Sprintf("http://%s:%d/obj?size=%d", w.Addr(sources[victim].host), portHTTP+1, size)
		case "other object":
			srcs[victim].URL = fmt.Sprintf("http://%s:%d/obj?size=%d&seed=9", w.Addr(sources[victim].host), portHTTP, size)
		case "trickle":
			o := origins[sources[victim].host]
			timer = time.AfterFunc(time.Duration(rng.IntN(300))*time.Millisecond, func() { o.SetRate(20 << 10) })
		}
		sum := origin.Sum(3, size)
		gctx, gcancel := context.WithTimeout(ctx, 60*time.Second)
		st, err := mget.Get(gctx, mget.Config{Sources: srcs, Out: out, SHA256: sum[:], Block: int64(16<<10) << rng.IntN(4), Stall: 400 * time.Millisecond})
		gcancel()
		if timer != nil {
			timer.Stop()
		}
		if fault == "other object" && victim == 0 {
			// The reference itself serves another object: the other
			// mirrors are refused and the hash check must fail.
			if err == nil || !strings.Contains(err.Error(), "SHA-256") {
				t.Fatalf("scenario %d: reference of another object: err %v; want a SHA-256 mismatch", n, err)
			}
			if _, serr := os.Stat(out + ".mget"); serr == nil {
				t.Fatalf("scenario %d: resume file left after a hash mismatch", n)
			}
			continue
		}
		if err != nil {
			t.Fatalf("scenario %d (size %d, fault %q on %s): %v", n, size, fault, sources[victim].host, err)
		}
		b, err := os.ReadFile(out)
		if err != nil || sha256.Sum256(b) != sum {
			t.Fatalf("scenario %d: file differs from the object (%v)", n, err)
		}
		if fault == "other object" && st.Subflows[victim].Bytes != 0 && victim != 0 {
			t.Fatalf("scenario %d: the mirror of another object delivered %d bytes", n, st.Subflows[victim].Bytes)
		}
	}
	t.Logf("faults: %v", faults)
}
