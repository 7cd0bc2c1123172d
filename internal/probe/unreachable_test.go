package probe

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestTrackerUnreachable(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := NewTracker(3, Threshold{}, time.Hour)
	pending := func(now time.Time) []string {
		t.Helper()
		s, full := tr.Pending(now)
		tr.Commit(s, full, now)
		return reportStrings([][]Sample{s})
	}
	tr.Observe("a", 10*ms, t0)
	tr.Observe("b", 20*ms, t0)
	if got := pending(t0); !slices.Equal(got, []string{"a=10ms", "b=20ms", "|"}) {
		t.Fatalf("first report %v", got)
	}
	tr.MarkUnreachable("a", t0.Add(time.Second))
	tr.MarkUnreachable("a", t0.Add(2*time.Second)) // marking again changes nothing
	if !tr.Unreachable("a") || tr.Unreachable("b") {
		t.Errorf("Unreachable(a, b) = %v, %v; want true, false", tr.Unreachable("a"), tr.Unreachable("b"))
	}
	if _, ok := tr.Estimate("a"); ok {
		t.Error("an unreachable peer keeps an estimate")
	}
	s, _ := tr.Pending(t0.Add(3 * time.Second))
	if len(s) != 1 || !s[0].Unreachable || s[0].RTT != 0 || !s[0].At.Equal(t0.Add(time.Second)) {
		t.Fatalf("pending after a went down = %+v; want one unreachable sample at t0+1s", s)
	}
	// A failed report commits nothing: still pending.
	if got := pending(t0.Add(4 * time.Second)); !slices.Equal(got, []string{"a=down", "|"}) {
		t.Fatalf("report after a went down %v", got)
	}
	if got := pending(t0.Add(5 * time.Second)); !slices.Equal(got, []string{"|"}) {
		t.Errorf("unreachable reported again without a change: %v", got)
	}
	// A full refresh carries the unreachable state.
	if got := pending(t0.Add(2 * time.Hour)); !slices.Equal(got, []string{"a=down", "b=20ms", "|"}) {
		t.Errorf("full refresh %v; want a=down and b", got)
	}
	// a answers again, at the RTT it had (within the threshold): reported at once.
	tr.Observe("a", 10*ms, t0.Add(121*time.Minute))
	if got := pending(t0.Add(121 * time.Minute)); !slices.Equal(got, []string{"a=10ms", "|"}) {
		t.Errorf("report after a answered again %v; want a=10ms at once", got)
	}
	if got := pending(t0.Add(122 * time.Minute)); !slices.Equal(got, []string{"|"}) {
		t.Errorf("report after that %v; want nothing", got)
	}
	// A peer never measured that never answers is reported unreachable too.
	tr.MarkUnreachable("c", t0)
	if got := pending(t0.Add(123 * time.Minute)); !slices.Equal(got, []string{"c=down", "|"}) {
		t.Errorf("never-answering peer: %v", got)
	}
	// Forgotten peers are not reported.
	tr.MarkUnreachable("b", t0)
	tr.Retain([]string{"a"})
	if got := pending(t0.Add(124 * time.Minute)); !slices.Equal(got, []string{"|"}) {
		t.Errorf("after Retain(a): %v", got)
	}
}

// TestProberUnreachable stops a peer's responder: after UnreachableAfter
// failed rounds it is reported unreachable once; when it answers again its
// RTT is reported in the next round.
func TestProberUnreachable(t *testing.T) {
	for _, after := range []int{0, 2} {
		synctest.Test(t, func(t *testing.T) {
			want := after
			if want == 0 {
				want = 3
			}
			m := &scripted{rtt: map[string]time.Duration{"a:1": 10 * ms, "b:1": 80 * ms}}
			p := NewProber(Config{Measurer: m, Interval: 10 * time.Second, Jitter: -1, Refresh: -1, UnreachableAfter: after}, nil)
			var mu sync.Mutex
			var reports [][]Sample
			report := func(ctx context.Context, s []Sample) error {
				mu.Lock()
				defer mu.Unlock()
				reports = append(reports, s)
				return nil
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error)
			go func() { done <- p.Run(ctx, report) }()
			p.SetTargets([]Target{{"a", "a:1"}, {"b", "b:1"}})
			time.Sleep(5 * time.Second) // round at 0
			synctest.Wait()
			check := func(what string, want ...string) {
				t.Helper()
				mu.Lock()
				defer mu.Unlock()
				if got := reportStrings(reports); !slices.Equal(got, want) {
					t.Fatalf("UnreachableAfter %d: %s: reports %v; want %v", after, what, got, want)
				}
			}
			check("first round", "a=10ms", "b=80ms", "|")

			m.unset("b:1") // b's responder stops
			time.Sleep(time.Duration(want-1) * 10 * time.Second)
			synctest.Wait()
			check("before the last failed round", "a=10ms", "b=80ms", "|")
			time.Sleep(10 * time.Second)
			synctest.Wait()
			check("b unreachable", "a=10ms", "b=80ms", "|", "b=down", "|")
			if _, ok := p.Estimates()["b"]; ok {
				t.Error("Estimates() still has b")
			}
			time.Sleep(50 * time.Second)
			synctest.Wait()
			check("b still down", "a=10ms", "b=80ms", "|", "b=down", "|")

			m.set("b:1", 81*ms) // back, within the threshold of the old 80 ms
			time.Sleep(10 * time.Second)
			synctest.Wait()
			check("b back", "a=10ms", "b=80ms", "|", "b=down", "|", "b=81ms", "|")
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
		})
	}
}

// TestTrackerUnsureReport: a report that failed may still have reached the
// controller (a timeout after the controller stored it, a lost answer).
// Its peers are reported again, at their current state, by the next report,
// whatever the threshold: otherwise an "unreachable" the controller applied
// while the prober saw an error stuck there after the peer came back at its
// old RTT (nothing left to report until the next full refresh).
func TestTrackerUnsureReport(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := NewTracker(3, Threshold{}, time.Hour)
	commit := func(now time.Time) []string {
		t.Helper()
		s, full := tr.Pending(now)
		tr.Commit(s, full, now)
		return reportStrings([][]Sample{s})
	}
	fail := func(now time.Time) []string {
		t.Helper()
		s, _ := tr.Pending(now)
		tr.Failed(s)
		return reportStrings([][]Sample{s})
	}
	tr.Observe("a", 10*ms, t0)
	tr.Observe("b", 20*ms, t0)
	if got := commit(t0); !slices.Equal(got, []string{"a=10ms", "b=20ms", "|"}) {
		t.Fatalf("first report %v", got)
	}
	tr.MarkUnreachable("a", t0.Add(time.Second))
	if got := fail(t0.Add(time.Second)); !slices.Equal(got, []string{"a=down", "|"}) {
		t.Fatalf("report of a down %v", got)
	}
	// a answers again, at its old RTT, before a report got through.
	tr.Observe("a", 10*ms, t0.Add(2*time.Second))
	if got := commit(t0.Add(2 * time.Second)); !slices.Equal(got, []string{"a=10ms", "|"}) {
		t.Errorf("report after the failed one %v; want a=10ms (the controller may hold a=down)", got)
	}
	if got := commit(t0.Add(3 * time.Second)); !slices.Equal(got, []string{"|"}) {
		t.Errorf("then %v; want nothing", got)
	}
	// The same for an RTT within the threshold of the reported one: b's
	// 21 ms fails, then b is back at 20 ms: reported again.
	tr.Observe("b", 30*ms, t0.Add(4*time.Second))
	tr.Observe("b", 30*ms, t0.Add(5*time.Second))
	if got := fail(t0.Add(5 * time.Second)); !slices.Equal(got, []string{"b=30ms", "|"}) {
		t.Fatalf("b moved: %v", got)
	}
	tr.Observe("b", 20*ms, t0.Add(6*time.Second))
	tr.Observe("b", 20*ms, t0.Add(7*time.Second))
	if got := commit(t0.Add(7 * time.Second)); !slices.Equal(got, []string{"b=20ms", "|"}) {
		t.Errorf("b back within the threshold of its last committed value: %v; want b=20ms again", got)
	}
}

// TestProberUnsureReport runs the case above through the prober against a
// controller that applies a report and still answers with an error (the
// agent's 15 s timeout ran out meanwhile): the pair must not stay
// unreachable at the controller once the peer answers again.
func TestProberUnsureReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &scripted{rtt: map[string]time.Duration{"a:1": 10 * ms}}
		p := NewProber(Config{Measurer: m, Interval: 10 * time.Second, Jitter: -1, Refresh: -1, ConfirmAfter: -1}, nil)
		var mu sync.Mutex
		controller := map[string]string{} // what the controller applied
		lose := false                     // apply, then fail
		report := func(ctx context.Context, s []Sample) error {
			mu.Lock()
			defer mu.Unlock()
			for _, x := range s {
				controller[x.Peer] = reportStrings([][]Sample{{x}})[0]
			}
			if lose {
				lose = false
				return errors.New("context deadline exceeded")
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- p.Run(ctx, report) }()
		p.SetTargets([]Target{{"a", "a:1"}})
		state := func() string {
			mu.Lock()
			defer mu.Unlock()
			return controller["a"]
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got := state(); got != "a=10ms" {
			t.Fatalf("controller holds %q after the first round; want a=10ms", got)
		}
		m.unset("a:1")
		mu.Lock()
		lose = true // the report saying a is down is applied but fails
		mu.Unlock()
		time.Sleep(30 * time.Second) // three failed rounds
		synctest.Wait()
		if got := state(); got != "a=down" {
			t.Fatalf("controller holds %q after three failed rounds; want a=down", got)
		}
		m.set("a:1", 10*ms) // back at its old RTT
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := state(); got != "a=10ms" {
			t.Errorf("controller holds %q a round after a answered again; want a=10ms", got)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}
