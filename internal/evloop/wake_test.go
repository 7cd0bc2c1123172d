//go:build linux

package evloop

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// loopCounters is a snapshot of one loop's test counters.
type loopCounters struct{ polls, deadlineSets, wakes int64 }

// counters reads every loop's counters on its own thread. Reading them
// is itself a command, so a loop's wakes and polls include the wakeup
// that ran it.
func counters(ls *Loops) []loopCounters {
	out := make([]loopCounters, len(ls.loops))
	var mu sync.Mutex
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.each(func(l *loop) {
		mu.Lock()
		defer mu.Unlock()
		for i, x := range ls.loops {
			if x == l {
				out[i] = loopCounters{l.polls, l.deadlineSets, l.wakes}
			}
		}
	})
	return out
}

// shortFlow runs one request and reply through addr: the client sends
// req and half-closes, the upstream (an echo of the bytes' count) answers
// and closes, the client reads to EOF.
func shortFlow(t testing.TB, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "7" {
		t.Fatalf("reply %q, %v; want \"7\"", got, err)
	}
}

// countServer answers each connection with the number of bytes it read
// before the client's EOF.
func countServer(t testing.TB) *upServer {
	return newUpServer(t, func(c *net.TCPConn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprint(c, n)
	})
}

// TestListenEachWakesOneLoop: with a listening socket per loop
// (ListenEach), a connection wakes only the loop whose socket took it; the
// other loop sleeps through any number of them. With one socket shared by
// every loop (Listen), each connection also wakes the loops that find
// nothing to accept (the runtime's poller, not a thread, waits on their
// epoll descriptors, so EPOLLEXCLUSIVE does not apply); that count is only
// logged, as it depends on the kernel.
func TestListenEachWakesOneLoop(t *testing.T) {
	testenv.CheckLeaks(t)
	const flows = 20
	srv := countServer(t)
	h := newTestHandler(t, srv.addr)
	ls, err := Start(Config{Loops: 2}, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	fdA, a := listenFD(t, 128)
	defer closeFD(fdA)
	fdB, b := listenFD(t, 128)
	defer closeFD(fdB)
	if err := ls.ListenEach([]int{fdA}, "svc"); err == nil {
		t.Errorf("ListenEach with one socket for two loops: no error")
	}
	if err := ls.ListenEach([]int{fdA, fdB}, "svc"); err != nil {
		t.Fatalf("ListenEach: %v", err)
	}
	// Loop i accepts from a duplicate of fds[i] alone.
	ls.mu.Lock()
	ls.each(func(l *loop) {
		want := a
		if l == ls.loops[1] {
			want = b
		}
		if len(l.lns) != 1 {
			t.Errorf("loop has %d listening sockets; want 1", len(l.lns))
			return
		}
		if got, err := LocalAddr(l.lns[0].fd); err != nil || got != want {
			t.Errorf("loop's listening socket is on %v (%v); want %v", got, err, want)
		}
	})
	ls.mu.Unlock()

	before := counters(ls)
	for range flows {
		shortFlow(t, a.String())
	}
	h.waitEnded(t, flows, 10*time.Second)
	after := counters(ls)
	// Loop 1's only wakeup is the one that read its counters.
	if w := after[1].wakes - before[1].wakes; w != 1 {
		t.Errorf("loop 1 woke %d times during %d connections to loop 0's socket; want 0 (+1 reading the counters)", w-1, flows)
	}
	// (Loop 0 wakes about once per flow, fewer if a connection arrives
	// before it parks.)
	if w := after[0].wakes - before[0].wakes; w < 2 {
		t.Errorf("loop 0 woke %d times for %d flows and the counters; want more", w, flows)
	}
	// Loop 1 serves its own socket.
	shortFlow(t, b.String())
	h.waitEnded(t, 1, 10*time.Second)

	// The shared socket, for comparison (logged).
	h2 := newTestHandler(t, srv.addr)
	r := newRig(t, Config{Loops: 2}, h2)
	before = counters(r.ls)
	for range flows {
		shortFlow(t, r.addr)
	}
	h2.waitEnded(t, flows, 10*time.Second)
	after = counters(r.ls)
	t.Logf("one socket shared by two loops, %d connections: wakeups %d and %d (each includes 1 reading the counters)",
		flows, after[0].wakes-before[0].wakes, after[1].wakes-before[1].wakes)
}

func closeFD(fd int) { rawClose(fd) }

// TestDeadlineNotPerFlow: the loop's read deadline is moved only when it
// must come earlier (or has passed), not for every flow. Setting the exact
// next deadline would add a connect deadline, move it to an idle one and
// remove it again for each flow: 2-3 runtime timer changes per flow, each
// of which may wake another thread.
func TestDeadlineNotPerFlow(t *testing.T) {
	testenv.CheckLeaks(t)
	const flows = 30
	srv := countServer(t)
	h := newTestHandler(t, srv.addr)
	r := newRig(t, Config{ConnectTimeout: 30 * time.Second, Idle: time.Minute}, h)
	before := counters(r.ls)
	for range flows {
		shortFlow(t, r.addr)
	}
	h.waitEnded(t, flows, 10*time.Second)
	after := counters(r.ls)
	// One to arm the first connect deadline; another only if 30 s passed.
	if n := after[0].deadlineSets - before[0].deadlineSets; n > 2 {
		t.Errorf("%d read deadlines set for %d sequential flows; want at most 2", n, flows)
	}
}

// TestArmDeadline checks when the loop moves its read deadline.
func TestArmDeadline(t *testing.T) {
	now := time.Unix(1000, 0)
	at := func(s int) time.Time { return now.Add(time.Duration(s) * time.Second) }
	var none time.Time
	for _, tc := range []struct {
		name            string
		cur, need, want time.Time
		set             bool
	}{
		{"none needed, none set", none, none, none, false},
		{"first deadline", none, at(10), at(10), true},
		{"later one needed: keep the earlier", at(10), at(20), at(10), false},
		{"same", at(10), at(10), at(10), false},
		{"earlier one needed", at(10), at(5), at(5), true},
		{"none needed, one pending: keep it", at(10), none, at(10), false},
		{"passed, later needed", at(-1), at(20), at(20), true},
		{"passed, none needed: clear it", at(-1), none, none, true},
		{"passed exactly now", at(0), at(20), at(20), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := newLoop(&Loops{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.ep.Close()
			defer rawClose(l.evfd)
			l.deadline = tc.cur
			l.armDeadline(tc.need, now)
			if !l.deadline.Equal(tc.want) {
				t.Errorf("deadline %v; want %v", l.deadline, tc.want)
			}
			if set := l.deadlineSets == 1; set != tc.set {
				t.Errorf("set the deadline: %v; want %v", set, tc.set)
			}
		})
	}
}

// TestIdleWaitPolls: a loop that finds nothing to do polls its epoll
// descriptor once before it parks, and once when woken: two epoll_pwait
// calls per command it is woken for (a poll before the runtime's callback
// would be a third, repeated inside it). A spurious wakeup costs one more
// now and then, hence the slack.
func TestIdleWaitPolls(t *testing.T) {
	testenv.CheckLeaks(t)
	const cmds = 50
	ls, err := Start(Config{}, newTestHandler(t, closedPort(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	before := counters(ls)
	for range cmds {
		ls.mu.Lock()
		ls.each(func(*loop) {})
		ls.mu.Unlock()
	}
	after := counters(ls)
	if n := after[0].polls - before[0].polls; n > cmds*5/2 {
		t.Errorf("%d polls for %d wakeups; want about 2 each (at most %d)", n, cmds+1, cmds*5/2)
	}
}
