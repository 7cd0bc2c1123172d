//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package router

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xagent"
	"github.com/mosto-net/mosto/internal/xlate"
)

// handoffWorld is client -- rr -- sur, every pair 1 ms one way.
type handoffWorld struct {
	w       *emu.World
	rr      string // router's listen address
	sur     string // surrogate's address
	r       *Router
	joiner  *XlateJoiner
	splicer *xlate.Splicer
	kill    func() // stops the surrogate
	// Surrogate-side placement (startTriangleWorld): the surrogate's
	// translation and agent, the router's placer.
	surSplicer *xlate.Splicer
	agent      *xagent.Agent
	placer     *xagent.Placer
}

func startHandoffWorld(t *testing.T, slowSurrogate bool) *handoffWorld {
	t.Helper()
	return startWorld(t, slowSurrogate, false)
}

// startTriangleWorld is startHandoffWorld with the surrogate-side
// placement: an agent on sur with xlate's egress program, the router's
// joiner placing the response direction there.
func startTriangleWorld(t *testing.T) *handoffWorld {
	t.Helper()
	return startWorld(t, false, true)
}

func startWorld(t *testing.T, slowSurrogate, triangle bool) *handoffWorld {
	t.Helper()
	return startWorldDelays(t, slowSurrogate, triangle, 1, 1, 1)
}

// startWorldDelays is startWorld with the one-way delays (ms) of the
// client -- rr, rr -- sur and client -- sur links.
func startWorldDelays(t *testing.T, slowSurrogate, triangle bool, dcr, drs, dcs float64) *handoffWorld {
	t.Helper()
	spec := &emu.Spec{Name: "rthandoff", Hosts: []emu.HostSpec{{Name: "client"}, {Name: "rr"}, {Name: "sur"}},
		Links: []emu.LinkSpec{{A: "client", B: "rr", DelayMS: &dcr}, {A: "rr", B: "sur", DelayMS: &drs}, {A: "client", B: "sur", DelayMS: &dcs}}}
	w := emutest.Start(t, spec)
	hw := &handoffWorld{w: w, rr: net.JoinHostPort(w.Addr("rr").String(), "80"), sur: net.JoinHostPort(w.Addr("sur").String(), "8080")}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	sln, err := w.Listen(ctx, "sur", "tcp", hw.sur)
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(ctx)
	hw.kill = scancel
	if slowSurrogate {
		// Answers a header and part of the body, then dies (reset).
		wg.Go(func() {
			context.AfterFunc(sctx, func() { sln.Close() })
			for {
				c, err := sln.Accept()
				if err != nil {
					return
				}
				wg.Go(func() {
					br := bufio.NewReader(c)
					if _, err := readHead(br); err != nil {
						c.Close()
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n")
					c.Write(make([]byte, 100000))
					c.(*net.TCPConn).SetLinger(0)
					c.Close()
				})
			}
		})
	} else {
		wg.Go(func() { origin.New(origin.Config{}, nil).Serve(sctx, sln) })
	}

	var ifindex int
	if err := w.Do("rr", func() error {
		var err error
		hw.splicer, err = xlate.Open(ctx, xlate.Config{})
		if err != nil {
			return err
		}
		ifs, err := net.Interfaces()
		for _, ifi := range ifs {
			if ifi.Flags&net.FlagLoopback == 0 {
				ifindex = ifi.Index
			}
		}
		return err
	}); err != nil {
		t.Fatalf("xlate.Open in rr: %v", err)
	}
	// After the router and its lingering legs stopped (they read the map).
	t.Cleanup(func() { cancel(); wg.Wait(); hw.splicer.Close() })
	hw.joiner = &XlateJoiner{Splicer: hw.splicer, Ifindex: ifindex, Linger: time.Second}
	if triangle {
		key := []byte("test key for the surrogate agent")
		if err := w.Do("sur", func() (err error) {
			hw.surSplicer, err = xlate.Open(ctx, xlate.Config{Egress: true})
			return err
		}); err != nil {
			t.Fatalf("xlate.Open with egress in sur: %v", err)
		}
		t.Cleanup(func() { cancel(); wg.Wait(); hw.surSplicer.Close() })
		agentAddr := net.JoinHostPort(w.Addr("sur").String(), "7070")
		aln, err := w.Listen(ctx, "sur", "tcp", agentAddr)
		if err != nil {
			t.Fatal(err)
		}
		// One device in sur: the agent's installs need no route lookup
		// (in sur's namespace).
		hw.agent = &xagent.Agent{Key: key, Xlate: hw.surSplicer, Priority: 10}
		wg.Go(func() { hw.agent.Serve(ctx, aln) })
		hw.placer, err = xagent.NewPlacer(xagent.PlacerConfig{Key: key, Agents: map[netip.Addr]string{w.Addr("sur"): agentAddr},
			Dial: func(ctx context.Context, n, a string) (net.Conn, error) { return w.Dial(ctx, "rr", n, a) }})
		if err != nil {
			t.Fatal(err)
		}
		hw.placer.Start(ctx)
		wg.Go(hw.placer.Wait)
		rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
		defer rcancel()
		if err := hw.placer.WaitReady(rctx); err != nil {
			t.Fatal(err)
		}
		hw.joiner.Placer = hw.placer
		// Not the fallback's test (TestHandoffSurrogateSideVeth): no
		// take-back on a stalled, loaded machine.
		hw.joiner.PlaceTimeout = time.Minute
	}
	p, err := NewPicker(PickConfig{Surrogates: []Surrogate{{"sur", hw.sur}}})
	if err != nil {
		t.Fatal(err)
	}
	hw.r, err = New(Config{Mode: ModeHandoff, Picker: p, Joiner: hw.joiner, PoolSize: 4,
		Dial: func(ctx context.Context, n, a string) (net.Conn, error) { return w.Dial(ctx, "rr", n, a) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := w.Listen(ctx, "rr", "tcp", hw.rr)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { hw.r.Serve(ctx, ln); hw.joiner.Wait() })
	return hw
}

func readHead(br *bufio.Reader) (string, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return "", err
		}
		head = append(head, line...)
		if string(line) == "\r\n" {
			return string(head), nil
		}
	}
}

func (hw *handoffWorld) client(t *testing.T) *net.TCPConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := hw.w.Dial(ctx, "client", "tcp", hw.rr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	return c.(*net.TCPConn)
}

// 500 sessions with random object sizes, handed off, SHA-256 checked; a
// second request on each handed-off connection is served by the surrogate
// (keep-alive). The router never relays a byte.
func TestHandoffSessions(t *testing.T) {
	hw := startHandoffWorld(t, false)
	const sessions = 500
	r := rand.New(rand.NewPCG(7, 8))
	sizes := make([]int, sessions)
	for i := range sizes {
		sizes[i] = r.IntN(512 << 10)
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, size := range sizes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c := hw.client(t)
			done := false
			defer func() {
				if !done { // readObject failed: what the translation saw
					hw.logEntry(t, c)
				}
			}()
			io.WriteString(c, get(size))
			br := bufio.NewReader(c)
			readObject(t, br, size)
			if i%10 == 0 {
				io.WriteString(c, get(size/2+1))
				readObject(t, br, size/2+1)
			}
			done = true
		})
	}
	wg.Wait()
	st := hw.r.Stats()
	t.Logf("router stats %+v; xlate %+v", st, hw.splicer.Stats())
	if st.HandedOff+st.HandoffFallbacks != sessions || st.Failed != 0 {
		t.Fatalf("stats %+v; want %d sessions handed off or proxied, none failed", st, sessions)
	}
	if st.HandedOff < sessions*9/10 {
		t.Errorf("%d of %d sessions handed off (%d proxied after a refusal); want at least 90%%", st.HandedOff, sessions, st.HandoffFallbacks)
	}
	if n := hw.joiner.ReserveFailed(); n != 0 {
		t.Errorf("%d surrogate legs not held after the join", n)
	}
	if jt := hw.joiner.Times(); jt.Joins != st.HandedOff || jt.Prepared < jt.Joins/2 || jt.Prepared > st.PoolHits || jt.Read <= 0 || jt.Install <= 0 || jt.Verify <= 0 || jt.Send <= 0 ||
		st.Forwarded != sessions || st.ForwardTime < jt.Read+jt.Install+jt.Verify+jt.Send {
		t.Errorf("join times %+v, router %+v; want a join per handoff, most on prepared surrogate legs (at most one per pool hit), every phase timed, within the forward time", jt, st)
	} else {
		n := time.Duration(jt.Joins)
		t.Logf("%d of %d joins on prepared legs; per handoff: forward %v (pool %v); join read %v install %v verify %v send %v", jt.Prepared, jt.Joins, st.ForwardTime/time.Duration(st.Forwarded),
			st.PoolTime/time.Duration(st.Forwarded), jt.Read/n, jt.Install/n, jt.Verify/n, jt.Send/n)
	}
	if xs := hw.splicer.Stats(); xs.Passed != 0 || xs.Errors != 0 {
		t.Errorf("xlate stats %+v; want no packet passed or failed", xs)
	}
}

// logEntry logs the client -> router entry of c's session (a failed
// session's FIN, RST and counters; it is removed CloseLinger after a RST).
func (hw *handoffWorld) logEntry(t *testing.T, c *net.TCPConn) {
	in := xlate.Tuple{Src: c.LocalAddr().(*net.TCPAddr).AddrPort(), Dst: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
	st, ok := hw.splicer.Entry(in)
	t.Logf("session %v: entry %+v (present %v)", in, st, ok)
}

// Two pipelined requests before the handoff: both are answered by the
// surrogate on the handed-off connection.
func TestHandoffPipelined(t *testing.T) {
	hw := startHandoffWorld(t, false)
	c := hw.client(t)
	io.WriteString(c, get(300000)+get(5000))
	br := bufio.NewReader(c)
	readObject(t, br, 300000)
	readObject(t, br, 5000)
	if st := hw.r.Stats(); st.HandedOff != 1 {
		t.Errorf("stats %+v; want 1 handed off", st)
	}
}

// A surrogate that dies mid-response: the client sees a reset (through the
// translation), not a hang.
func TestHandoffSurrogateDies(t *testing.T) {
	hw := startHandoffWorld(t, true)
	c := hw.client(t)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, get(10000000))
	start := time.Now()
	n, err := io.Copy(io.Discard, c)
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("client read %d bytes then %v after %v; want a reset", n, err, time.Since(start))
	}
	if st := hw.r.Stats(); st.HandedOff != 1 {
		t.Errorf("stats %+v; want 1 handed off", st)
	}
	t.Logf("client: %d bytes, then %v", n, err)
}

// Once the surrogate has answered, the router's surrogate leg sends
// nothing more: a socket in TCP_REPAIR mode still retransmitted the request
// on its RTO timer (its ACK went to the client), which the surrogate
// received as duplicates (D-SACKs to the client) for as long as the
// session lived. The leg's 4-tuple stays held.
func TestHandoffLegQuiet(t *testing.T) {
	hw := startHandoffWorld(t, false)
	dsacks := func() int64 {
		var v int64
		err := hw.w.Do("sur", func() (err error) {
			v, err = testenv.ProcNetCounter("/proc/thread-self/net/netstat", "TcpExt:", "TCPDSACKOldSent")
			return err
		})
		if err != nil {
			t.Fatalf("surrogate's TcpExt: %v", err)
		}
		return v
	}
	c := hw.client(t)
	before := dsacks()
	io.WriteString(c, get(20000))
	br := bufio.NewReader(c)
	readObject(t, br, 20000)
	// The session stays open (keep-alive) across several of the leg's RTOs
	// (200 ms minimum, doubling): 2 s covers at least 3 retransmissions.
	time.Sleep(2 * time.Second)
	if d := dsacks() - before; d != 0 {
		t.Errorf("the surrogate received %d duplicate segments after answering; want none", d)
	}
	io.WriteString(c, get(3000))
	readObject(t, br, 3000)
	if n := hw.joiner.ReserveFailed(); n != 0 {
		t.Errorf("%d surrogate legs not held after the join", n)
	}
}
