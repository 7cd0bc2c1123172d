package probe

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

const (
	ms = time.Millisecond
	us = time.Microsecond
)

func TestWindowRobust(t *testing.T) {
	tests := []struct {
		name    string
		n       int
		samples []time.Duration
		want    time.Duration
	}{
		{"single", 5, []time.Duration{10 * ms}, 10 * ms},
		{"one spike", 5, []time.Duration{10 * ms, 10 * ms, 500 * ms, 10 * ms, 11 * ms}, 10 * ms},
		{"two spikes", 5, []time.Duration{10 * ms, 900 * ms, 500 * ms, 10 * ms, 11 * ms}, 11 * ms},
		{"low outlier", 5, []time.Duration{50 * ms, 50 * ms, 1 * ms, 51 * ms, 49 * ms}, 50 * ms},
		{"even count", 4, []time.Duration{10 * ms, 20 * ms, 30 * ms, 1000 * ms}, 25 * ms},
		{"old samples roll out", 3, []time.Duration{500 * ms, 500 * ms, 500 * ms, 20 * ms, 20 * ms}, 20 * ms},
		{"sustained change shows after a majority", 5, []time.Duration{10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms, 40 * ms, 40 * ms, 40 * ms}, 40 * ms},
		{"but not before", 5, []time.Duration{10 * ms, 10 * ms, 10 * ms, 10 * ms, 10 * ms, 40 * ms, 40 * ms}, 10 * ms},
		{"non-positive ignored", 5, []time.Duration{0, -5 * ms, 7 * ms}, 7 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWindow(tt.n)
			for _, s := range tt.samples {
				w.Add(s)
			}
			got, ok := w.Estimate()
			if !ok || got != tt.want {
				t.Errorf("Estimate() = %v, %v; want %v", got, ok, tt.want)
			}
		})
	}
	if _, ok := NewWindow(3).Estimate(); ok {
		t.Error("empty window has an estimate")
	}
}

func TestThreshold(t *testing.T) {
	tests := []struct {
		last, now time.Duration
		want      bool
	}{
		{100 * ms, 109 * ms, false},
		{100 * ms, 111 * ms, true},
		{100 * ms, 89 * ms, true},
		{100 * ms, 91 * ms, false},
		{5 * ms, 6900 * time.Microsecond, false}, // 2 ms beats 10% on short links
		{5 * ms, 7100 * time.Microsecond, true},
		{5 * ms, 2900 * time.Microsecond, true},
		{20 * ms, 22 * ms, false}, // exactly the limit is not a change
	}
	for _, tt := range tests {
		if got := (Threshold{}).Changed(tt.last, tt.now); got != tt.want {
			t.Errorf("Changed(%v, %v) = %v; want %v", tt.last, tt.now, got, tt.want)
		}
	}
	if !(Threshold{Rel: 0.01, Abs: time.Microsecond}).Changed(100*ms, 102*ms) {
		t.Error("custom threshold ignored")
	}
}

func TestTracker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		observe map[string]time.Duration // round samples
		at      time.Duration            // since t0
		want    []string                 // "peer=rtt" pending, in order
		full    bool
		fail    bool // the report fails: commit nothing
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first report carries all, then silence", []step{
			{observe: map[string]time.Duration{"a": 10 * ms, "b": 50 * ms}, want: []string{"a=10ms", "b=50ms"}, full: true},
			{observe: map[string]time.Duration{"a": 11 * ms, "b": 52 * ms}, at: 10 * time.Second, want: nil},
			{observe: map[string]time.Duration{"a": 10 * ms, "b": 49 * ms}, at: 20 * time.Second, want: nil},
		}},
		{"a spike is not reported, a change is", []step{
			{observe: map[string]time.Duration{"a": 100 * ms, "b": 50 * ms}, want: []string{"a=100ms", "b=50ms"}, full: true},
			{observe: map[string]time.Duration{"a": 100 * ms, "b": 50 * ms}, at: 10 * time.Second},
			{observe: map[string]time.Duration{"a": 900 * ms, "b": 50 * ms}, at: 20 * time.Second},
			{observe: map[string]time.Duration{"a": 100 * ms, "b": 80 * ms}, at: 30 * time.Second},
			{observe: map[string]time.Duration{"a": 100 * ms, "b": 80 * ms}, at: 40 * time.Second},
			{observe: map[string]time.Duration{"a": 100 * ms, "b": 80 * ms}, at: 50 * time.Second, want: []string{"b=80ms"}},
			{observe: map[string]time.Duration{"a": 100 * ms, "b": 80 * ms}, at: 60 * time.Second},
		}},
		{"failed report stays pending", []step{
			{observe: map[string]time.Duration{"a": 10 * ms}, want: []string{"a=10ms"}, full: true, fail: true},
			{observe: map[string]time.Duration{"a": 10 * ms}, at: 10 * time.Second, want: []string{"a=10ms"}, full: true},
			{observe: map[string]time.Duration{"a": 10 * ms}, at: 20 * time.Second},
		}},
		{"a new peer is reported alone", []step{
			{observe: map[string]time.Duration{"a": 10 * ms}, want: []string{"a=10ms"}, full: true},
			{observe: map[string]time.Duration{"a": 10 * ms, "c": 30 * ms}, at: 10 * time.Second, want: []string{"c=30ms"}},
		}},
		{"refresh re-reports all", []step{
			{observe: map[string]time.Duration{"a": 10 * ms, "b": 20 * ms}, want: []string{"a=10ms", "b=20ms"}, full: true},
			{observe: map[string]time.Duration{"a": 10 * ms, "b": 20 * ms}, at: 5 * time.Minute},
			{observe: map[string]time.Duration{"a": 10 * ms, "b": 20 * ms}, at: 10 * time.Minute, want: []string{"a=10ms", "b=20ms"}, full: true},
			{observe: map[string]time.Duration{"a": 10 * ms, "b": 20 * ms}, at: 11 * time.Minute},
		}},
		{"an inflated first round is corrected once the window is full", []step{
			// The first report is a single round (a loaded prober: 1.3 ms
			// high, under the threshold); once the window holds its 5
			// rounds, its median is reported once, then silence.
			{observe: map[string]time.Duration{"a": 24300 * us, "b": 50 * ms}, want: []string{"a=24.3ms", "b=50ms"}, full: true},
			{observe: map[string]time.Duration{"a": 23 * ms, "b": 50 * ms}, at: 2 * time.Second},
			{observe: map[string]time.Duration{"a": 23 * ms, "b": 50 * ms}, at: 4 * time.Second},
			{observe: map[string]time.Duration{"a": 23 * ms, "b": 50 * ms}, at: 6 * time.Second},
			{observe: map[string]time.Duration{"a": 23 * ms, "b": 50 * ms}, at: 8 * time.Second, want: []string{"a=23ms"}},
			{observe: map[string]time.Duration{"a": 23100 * us, "b": 50 * ms}, at: 10 * time.Second},
			{observe: map[string]time.Duration{"a": 22900 * us, "b": 50100 * us}, at: 12 * time.Second},
		}},
		{"a settling report that fails is sent again", []step{
			{observe: map[string]time.Duration{"a": 24 * ms}, want: []string{"a=24ms"}, full: true},
			{observe: map[string]time.Duration{"a": 23 * ms}, at: 2 * time.Second},
			{observe: map[string]time.Duration{"a": 23 * ms}, at: 4 * time.Second},
			{observe: map[string]time.Duration{"a": 23 * ms}, at: 6 * time.Second},
			{observe: map[string]time.Duration{"a": 23 * ms}, at: 8 * time.Second, want: []string{"a=23ms"}, fail: true},
			{observe: map[string]time.Duration{"a": 23 * ms}, at: 10 * time.Second, want: []string{"a=23ms"}},
			{observe: map[string]time.Duration{"a": 23 * ms}, at: 12 * time.Second},
		}},
		{"peer without samples is not reported", []step{
			{observe: map[string]time.Duration{"a": 10 * ms, "b": 0}, want: []string{"a=10ms"}, full: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(5, Threshold{}, 10*time.Minute)
			for i, st := range tt.steps {
				now := t0.Add(st.at)
				for p, d := range st.observe {
					tr.Observe(p, d, now)
				}
				got, full := tr.Pending(now)
				var names []string
				for _, s := range got {
					names = append(names, s.Peer+"="+s.RTT.String())
				}
				if !slices.Equal(names, st.want) || (len(got) > 0 && full != st.full) {
					t.Fatalf("step %d: Pending = %v (full %v); want %v (full %v)", i, names, full, st.want, st.full)
				}
				if !st.fail {
					tr.Commit(got, full, now)
				}
			}
		})
	}
}

// scripted is a Measurer whose RTT per address a test sets.
type scripted struct {
	mu    sync.Mutex
	rtt   map[string]time.Duration
	next  map[string][]time.Duration // consumed first, one per call
	calls int
}

func (s *scripted) push(addr string, ds ...time.Duration) {
	s.mu.Lock()
	if s.next == nil {
		s.next = map[string][]time.Duration{}
	}
	s.next[addr] = append(s.next[addr], ds...)
	s.mu.Unlock()
}

func (s *scripted) set(addr string, d time.Duration) {
	s.mu.Lock()
	s.rtt[addr] = d
	s.mu.Unlock()
}

func (s *scripted) unset(addr string) {
	s.mu.Lock()
	delete(s.rtt, addr)
	s.mu.Unlock()
}

func (s *scripted) Measure(ctx context.Context, addr string) (time.Duration, error) {
	s.mu.Lock()
	d, ok := s.rtt[addr]
	if q := s.next[addr]; len(q) > 0 {
		d, ok = q[0], true
		s.next[addr] = q[1:]
	}
	s.calls++
	s.mu.Unlock()
	if !ok {
		return 0, errors.New("unreachable")
	}
	time.Sleep(d) // fake time inside the bubble
	return d, nil
}

// reportStrings flattens reports to "peer=rtt" (or "peer=down") with "|"
// after each report.
func reportStrings(reports [][]Sample) []string {
	var got []string
	for _, r := range reports {
		for _, s := range r {
			if s.Unreachable {
				got = append(got, s.Peer+"=down")
			} else {
				got = append(got, s.Peer+"="+s.RTT.String())
			}
		}
		got = append(got, "|")
	}
	return got
}

func TestProberRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &scripted{rtt: map[string]time.Duration{"a:1": 10 * ms, "b:1": 80 * ms}}
		p := NewProber(Config{Measurer: m, Interval: 10 * time.Second, Jitter: -1, Refresh: -1}, nil)
		var mu sync.Mutex
		var reports [][]Sample
		fail := false
		report := func(ctx context.Context, s []Sample) error {
			mu.Lock()
			defer mu.Unlock()
			if fail {
				return errors.New("controller down")
			}
			reports = append(reports, s)
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- p.Run(ctx, report) }()
		p.SetTargets([]Target{{"a", "a:1"}, {"b", "b:1"}, {"c", "c:1"}}) // c unreachable
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		check := func(what string, want ...string) {
			t.Helper()
			mu.Lock()
			defer mu.Unlock()
			got := reportStrings(reports)
			if !slices.Equal(got, want) {
				t.Fatalf("%s: reports %v; want %v", what, got, want)
			}
		}
		check("first round", "a=10ms", "b=80ms", "|")

		time.Sleep(60 * time.Second) // 6 stable rounds; c fails its third at 20 s
		synctest.Wait()
		check("stable", "a=10ms", "b=80ms", "|", "c=down", "|")

		m.set("b:1", 120*ms)
		mu.Lock()
		fail = true
		mu.Unlock()
		time.Sleep(30 * time.Second) // 3 rounds: the window's majority is now 120 ms, but reports fail
		synctest.Wait()
		check("controller down", "a=10ms", "b=80ms", "|", "c=down", "|")
		mu.Lock()
		fail = false
		mu.Unlock()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		check("recovered", "a=10ms", "b=80ms", "|", "c=down", "|", "b=120ms", "|")

		if est := p.Estimates(); est["a"] != 10*ms || est["b"] != 120*ms {
			t.Errorf("Estimates() = %v", est)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

func TestServerAndUDPEcho(t *testing.T) {
	testenv.CheckLeaks(t)
	ctx := t.Context()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerConfig{}, nil)
	done := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() { done <- srv.Serve(sctx, pc) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	addr := pc.LocalAddr().String()

	u := &UDPEcho{Timeout: time.Second}
	rtt, err := u.Measure(ctx, addr)
	if err != nil {
		t.Fatalf("Measure: %v", err)
	}
	if rtt <= 0 || rtt > time.Second {
		t.Errorf("loopback rtt %v", rtt)
	}

	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	good := mustAppend(t, Packet{Type: TypeRequest, ID: 7, Seq: 1}, nil)
	reply := mustAppend(t, Packet{Type: TypeReply, ID: 7, Seq: 1}, nil)
	bad := [][]byte{
		append(append([]byte(nil), good...), 0), // oversized by one
		make([]byte, 1500),                      // oversized
		[]byte("GET / HTTP/1.0\r\n\r\n"),        // garbage
		reply,                                   // a reply is not a request
		good[:PacketSize-1],                     // truncated
	}
	for _, b := range bad {
		c.Write(b)
	}
	c.Write(good) // the last one is answered
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePacket(buf[:n])
	if err != nil || p.Type != TypeReply || p.ID != 7 {
		t.Fatalf("reply %+v, %v; want a reply to id 7 (no reply to the bad datagrams before it)", p, err)
	}
	st := srv.Stats()
	want := ServerStats{Replied: 2, Oversized: 2, Garbage: 3}
	if st != want {
		t.Errorf("Stats() = %+v; want %+v", st, want)
	}
}

func TestServerRateLimit(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	srv := NewServer(ServerConfig{Rate: 10, Burst: 3, Now: func() time.Time { return now }}, nil)
	req := func() bool { return srv.handle(mustAppend(t, Packet{Type: TypeRequest}, nil), 1) != nil }
	for i := range 3 {
		if !req() {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	if req() {
		t.Fatal("request over the burst answered")
	}
	now = now.Add(100 * ms) // one token at 10/s
	if !req() {
		t.Fatal("request after refill refused")
	}
	if req() {
		t.Fatal("second request after a one-token refill answered")
	}
	if st := srv.Stats(); st.Limited != 2 || st.Replied != 4 {
		t.Errorf("Stats() = %+v", st)
	}
}

func TestTCPHandshake(t *testing.T) {
	testenv.CheckLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := TCPHandshake{}.Measure(t.Context(), ln.Addr().String())
	if err != nil || d <= 0 {
		t.Fatalf("Measure = %v, %v", d, err)
	}
	ln.Close()
	if _, err := (TCPHandshake{Timeout: time.Second}).Measure(t.Context(), ln.Addr().String()); err == nil {
		t.Error("Measure to a closed port succeeded")
	}
}

func TestUDPEchoTimeout(t *testing.T) {
	testenv.CheckLeaks(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0") // never answers
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	start := time.Now()
	if _, err := (&UDPEcho{Timeout: 200 * ms}).Measure(t.Context(), pc.LocalAddr().String()); err == nil {
		t.Fatal("Measure of a silent endpoint succeeded")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("timeout took %v", el)
	}
}

// TestProberConfirmation checks that a one-round spike costs a confirmation
// round but no report, and that a sustained change is reported within one
// interval plus the confirmation delay.
func TestProberConfirmation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &scripted{rtt: map[string]time.Duration{"a:1": 50 * ms}}
		p := NewProber(Config{Measurer: m, Interval: 10 * time.Second, Jitter: -1, Probes: 1, Refresh: -1}, nil)
		var mu sync.Mutex
		var reports []Sample
		var at []time.Time
		report := func(ctx context.Context, s []Sample) error {
			mu.Lock()
			defer mu.Unlock()
			reports = append(reports, s...)
			for range s {
				at = append(at, time.Now())
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		p.SetTargets([]Target{{"a", "a:1"}})
		start := time.Now()
		go p.Run(ctx, report)
		time.Sleep(25 * time.Second) // rounds at 0, 10, 20 s
		synctest.Wait()

		m.push("a:1", 400*ms) // the round at 30 s sees a spike
		m.mu.Lock()
		calls := m.calls
		m.mu.Unlock()
		time.Sleep(10 * time.Second) // round at 30 s + confirmation at 31 s
		synctest.Wait()
		m.mu.Lock()
		if got := m.calls - calls; got != 2 {
			t.Errorf("%d probes around the spike; want 2 (the round and its confirmation)", got)
		}
		m.mu.Unlock()
		mu.Lock()
		if len(reports) != 1 {
			t.Fatalf("reports %v; want only the first (the spike must not be reported)", reports)
		}
		mu.Unlock()

		changed := time.Now() // 35 s; the next round is at 41 s
		m.set("a:1", 90*ms)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(reports) != 2 || reports[1].RTT != 90*ms {
			t.Fatalf("reports %v; want the change to 90ms reported", reports)
		}
		if d := at[1].Sub(changed); d > 10*time.Second+time.Second+time.Second {
			t.Errorf("change reported %v after it happened; want <= interval + confirmation (+ probe time)", d)
		}
		t.Logf("change reported %v after it happened (start %v)", at[1].Sub(changed), changed.Sub(start))
	})
}

func TestSetTargetsWakesOnlyOnChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &scripted{rtt: map[string]time.Duration{"a:1": ms, "b:1": ms}}
		p := NewProber(Config{Measurer: m, Interval: time.Hour, Jitter: -1, Probes: 1}, nil)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go p.Run(ctx, func(context.Context, []Sample) error { return nil })
		calls := func() int {
			synctest.Wait()
			time.Sleep(time.Second) // let a round finish
			synctest.Wait()
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.calls
		}
		p.SetTargets([]Target{{"a", "a:1"}})
		n := calls()
		p.SetTargets([]Target{{"a", "a:1"}})
		if got := calls(); got != n {
			t.Errorf("same targets caused %d probes", got-n)
		}
		p.SetTargets([]Target{{"a", "a:1"}, {"b", "b:1"}})
		if got := calls(); got != n+2 {
			t.Errorf("new targets caused %d probes; want a round of 2", got-n)
		}
	})
}

// TestBurstConcurrent checks that a round's probes to one peer are in flight
// together (a round costs one RTT plus the spacing, not Probes RTTs) and
// that one delayed probe of a burst is neither reported nor even a suspect
// for a confirmation round: the burst minimum already rejects it.
func TestBurstConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &scripted{rtt: map[string]time.Duration{"a:1": 100 * ms}}
		p := NewProber(Config{Measurer: m, Interval: 10 * time.Second, Jitter: -1, Probes: 3, Refresh: -1}, nil)
		p.SetTargets([]Target{{"a", "a:1"}})
		start := time.Now()
		p.Round(t.Context())
		if d := time.Since(start); d != 100*ms+2*5*ms {
			t.Errorf("a round of 3 probes of 100ms took %v; want 110ms (in flight together, 5ms apart)", d)
		}
		var reports []Sample
		report := func(ctx context.Context, s []Sample) error {
			reports = append(reports, s...)
			return nil
		}
		p.Flush(t.Context(), report)
		for _, spike := range [][]time.Duration{{400 * ms}, {100 * ms, 900 * ms}, {300 * ms, 300 * ms}} {
			m.push("a:1", spike...)
			p.Round(t.Context())
			p.mu.Lock()
			suspects := p.tracker.Suspects()
			p.mu.Unlock()
			if len(suspects) != 0 {
				t.Errorf("delayed probes %v of a burst of 3: suspects %v; want none", spike, suspects)
			}
			p.Flush(t.Context(), report)
		}
		if len(reports) != 1 || reports[0].RTT != 100*ms {
			t.Errorf("reports %v; want only the first (a=100ms)", reports)
		}
		m.push("a:1", 300*ms, 300*ms, 300*ms) // a whole bad burst: a suspect
		p.Round(t.Context())
		p.mu.Lock()
		suspects := p.tracker.Suspects()
		p.mu.Unlock()
		if !slices.Equal(suspects, []string{"a"}) {
			t.Errorf("a whole delayed burst: suspects %v; want [a]", suspects)
		}
	})
}

// TestRoundsArePeriodic checks that rounds start every Interval whatever a
// round takes, and that jitter only shortens the wait.
func TestRoundsArePeriodic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &countingStarts{d: 700 * ms}
		p := NewProber(Config{Measurer: m, Interval: 2 * time.Second, Jitter: 0.2, Probes: 1, Refresh: -1}, nil)
		p.SetTargets([]Target{{"a", "a:1"}})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.Run(ctx, func(context.Context, []Sample) error { return nil })
		}()
		time.Sleep(30 * time.Second)
		cancel()
		<-done
		if len(m.starts) < 15 {
			t.Fatalf("%d rounds in 30 s at a 2 s interval; want at least 15", len(m.starts))
		}
		for k := 1; k < len(m.starts); k++ {
			gap := m.starts[k].Sub(m.starts[k-1])
			if gap > 2*time.Second || gap < 1600*ms {
				t.Errorf("round %d started %v after the previous one; want 1.6 s..2 s", k, gap)
			}
		}
	})
}

// countingStarts records when each measurement started.
type countingStarts struct {
	mu     sync.Mutex
	d      time.Duration
	starts []time.Time
}

func (c *countingStarts) Measure(ctx context.Context, addr string) (time.Duration, error) {
	c.mu.Lock()
	c.starts = append(c.starts, time.Now())
	c.mu.Unlock()
	time.Sleep(c.d)
	return c.d, nil
}

func mustAppend(t testing.TB, p Packet, k *Key) []byte {
	t.Helper()
	b, err := p.Append(nil, k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve runs a Server on a loopback socket and returns its address.
func serve(t *testing.T, cfg ServerConfig) (string, *Server) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(cfg, nil)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, pc) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	return pc.LocalAddr().String(), srv
}

// TestAuthenticatedProbes checks the tags: a server with keys answers only
// requests tagged under one of them (also the previous key, answered under
// it), a server without keys only untagged ones, and a prober counts only
// replies tagged under its keys.
func TestAuthenticatedProbes(t *testing.T) {
	k1 := Key{ID: 1, Secret: []byte("key one, thirty-two bytes long!!")}
	k2 := Key{ID: 2, Secret: []byte("key two, thirty-two bytes long!!")}
	k1b := Key{ID: 1, Secret: []byte("an impostor's key with id one!!!")}
	// The server's keys carry reusable HMAC state (NewKey), the prober's
	// are literals: both tag alike.
	srvKeys := []Key{NewKey(k2.ID, k2.Secret), NewKey(k1.ID, k1.Secret)}
	keyed, keyedSrv := serve(t, ServerConfig{Keys: func() []Key { return srvKeys }})
	open, openSrv := serve(t, ServerConfig{})
	tests := []struct {
		name   string
		addr   string
		keys   []Key
		answer bool
	}{
		{"current key", keyed, []Key{k2}, true},
		{"previous key", keyed, []Key{k1, k2}, true},
		{"no key", keyed, nil, false},
		{"unknown key", keyed, []Key{{ID: 3, Secret: k1.Secret}}, false},
		{"wrong secret", keyed, []Key{k1b}, false},
		{"open server, no key", open, nil, true},
		{"open server, key", open, []Key{k1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Answers get a long timeout (a loaded machine under -race);
			// silences cost the short one.
			timeout := 300 * ms
			if tt.answer {
				timeout = 5 * time.Second
			}
			u := &UDPEcho{Timeout: timeout, Keys: func() []Key { return tt.keys }}
			rtt, err := u.Measure(t.Context(), tt.addr)
			if tt.answer && (err != nil || rtt <= 0) {
				t.Errorf("Measure = %v, %v; want an RTT", rtt, err)
			}
			if !tt.answer && err == nil {
				t.Errorf("Measure = %v; want no answer", rtt)
			}
		})
	}
	if st := keyedSrv.Stats(); st.Replied != 2 || st.Unauth != 3 {
		t.Errorf("keyed server Stats() = %+v; want 2 replied, 3 unauthenticated", st)
	}
	if st := openSrv.Stats(); st.Replied != 1 || st.Unauth != 1 {
		t.Errorf("open server Stats() = %+v; want 1 replied, 1 unauthenticated", st)
	}

	// A reply under another key, or tampered with, does not count.
	forger := responder(t, func(p Packet, _ int64) [][]byte {
		p.Type = TypeReply
		forged, _ := p.Append(nil, &Key{ID: p.KeyID, Secret: k1b.Secret})
		tampered, _ := p.Append(nil, &k1)
		tampered[20] ^= 1
		return [][]byte{forged, tampered}
	})
	u := &UDPEcho{Timeout: 300 * ms, Keys: func() []Key { return []Key{k1} }}
	if rtt, err := u.Measure(t.Context(), forger); err == nil {
		t.Errorf("Measure took a forged reply: %v", rtt)
	}
}

// responder is a UDP probe responder on loopback for the test: it answers
// every probe packet with what reply returns (rx: when the packet was
// read); packets that do not parse go unanswered. It returns its address.
func responder(t *testing.T, reply func(p Packet, rx int64) [][]byte) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			rx := time.Now().UnixNano()
			p, err := ParsePacket(buf[:n])
			if err != nil {
				continue
			}
			for _, b := range reply(p, rx) {
				pc.WriteTo(b, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}

// TestTurnaroundSubtracted checks the TWAMP-like measurement: a responder
// that holds each request 80 ms and says so in its reply is measured at the
// loopback RTT, not at 80 ms; one that says nothing is measured at 80 ms.
func TestTurnaroundSubtracted(t *testing.T) {
	for _, honest := range []bool{true, false} {
		addr := responder(t, func(p Packet, rx int64) [][]byte {
			time.Sleep(80 * ms)
			p.Type = TypeReply
			if honest {
				p.RxNano, p.TxNano = rx, time.Now().UnixNano()
			}
			b, _ := p.Append(nil, nil)
			return [][]byte{b}
		})
		rtt, err := (&UDPEcho{Timeout: time.Second}).Measure(t.Context(), addr)
		if err != nil {
			t.Fatal(err)
		}
		if honest && rtt > 40*ms || !honest && rtt < 80*ms {
			t.Errorf("responder reporting its turnaround %v: measured %v", honest, rtt)
		}
	}
}

// TestUDPEchoStarved: the prober is not scheduled between sending a probe
// and its timeout (a loaded machine under -race). A reply the kernel
// received within the timeout still counts, at its kernel-stamped RTT; one
// that arrived after it does not, nor does silence.
func TestUDPEchoStarved(t *testing.T) {
	const timeout = 200 * ms
	tests := []struct {
		name string
		hold time.Duration // the responder's delay before it answers; <0: never
		ok   bool
	}{
		{"answered in time, read late", 20 * ms, true},
		{"answered after the timeout", 2 * timeout, false},
		{"silent", -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := responder(t, func(p Packet, _ int64) [][]byte {
				if tc.hold < 0 {
					return nil
				}
				time.Sleep(tc.hold)
				p.Type = TypeReply
				b, _ := p.Append(nil, nil)
				return [][]byte{b}
			})
			u := &UDPEcho{Timeout: timeout, starve: func() { time.Sleep(3 * timeout) }}
			rtt, err := u.Measure(t.Context(), addr)
			if !tc.ok {
				if err == nil {
					t.Fatalf("Measure = %v, nil; want no reply within %v", rtt, timeout)
				}
				return
			}
			if err != nil {
				t.Fatalf("Measure: %v; want the reply queued within the timeout", err)
			}
			if rtt < tc.hold || rtt >= timeout {
				t.Errorf("Measure = %v; want the kernel's %v..%v, not the late read", rtt, tc.hold, timeout)
			}
		})
	}
}
