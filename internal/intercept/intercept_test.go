package intercept

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// The test world: client c, on-path relay host r, server s; c-s packets
// cross r (seed 002's topology).
const worldSpec = `
name: intercept
hosts: [{name: c}, {name: r}, {name: s}]
links: [{a: c, b: r, delay_ms: 1}, {a: r, b: s, delay_ms: 1}]
routes: [{from: c, to: s, via: [r]}]
`

const (
	inScope  = 8080
	outScope = 9090
	tpPort   = 15001
)

func startWorld(t *testing.T) *emu.World {
	t.Helper()
	spec, err := emu.ParseSpec([]byte(worldSpec))
	if err != nil {
		t.Fatal(err)
	}
	return emutest.Start(t, spec)
}

// testRelay is a minimal transparent relay over an interception: accept,
// dial the original destination from the client's address, copy both ways
// with half-close, abort (reset) if the process dies mid-flow.
type testRelay struct {
	do    func(func() error) error // runs socket creation in the relay's netns
	mark  uint32                   // the legs' SO_MARK (Config.LegMark); 0: none
	cwnds chan [2]uint32           // the first flows' legs' snd_cwnd once connected
	flows atomic.Int64
	wg    sync.WaitGroup
}

func (r *testRelay) serve(ctx context.Context, l *net.TCPListener) {
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			return
		}
		r.flows.Add(1)
		r.wg.Go(func() { r.flow(ctx, c) })
	}
}

func (r *testRelay) flow(ctx context.Context, c *net.TCPConn) {
	defer c.Close()
	dst, err := OriginalDst(c)
	if err != nil {
		return
	}
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	var up *net.TCPConn
	if err := r.do(func() error {
		var err error
		d := net.Dialer{Timeout: 10 * time.Second}
		if r.mark != 0 {
			d.Control = MarkControl(r.mark, nil)
		}
		up, err = DialTransparent(ctx, src, dst, d)
		return err
	}); err != nil {
		return
	}
	defer up.Close()
	select { // the first flows' only: tests that read it make few
	case r.cwnds <- [2]uint32{sndCwnd(c), sndCwnd(up)}:
	default:
	}
	AbortOnClose(c, true)
	AbortOnClose(up, true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(up, c); err == nil {
			AbortOnClose(up, false)
			up.CloseWrite()
		}
	}()
	if _, err := io.Copy(c, up); err == nil {
		AbortOnClose(c, false)
		c.CloseWrite()
	}
	<-done
}

type flowView struct {
	clientLocal, clientRemote, serverRemote, serverLocal netip.AddrPort
	sameSeq                                              bool // client's send seq == server's receive seq
}

// oneFlow connects c -> s:port, sends 100 bytes, and reports what each end
// sees.
func oneFlow(t *testing.T, w *emu.World, l net.Listener, port int) flowView {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, sc := dialServer(t, ctx, w, l, port)
	defer cc.Close()
	defer sc.Close()
	msg := make([]byte, 100)
	if _, err := cc.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(sc, msg); err != nil {
		t.Fatal(err)
	}
	snd, err := testenv.TCPQueueSeq(cc.(*net.TCPConn), testenv.SendQueue)
	if err != nil {
		t.Fatalf("client send seq: %v", err)
	}
	rcv, err := testenv.TCPQueueSeq(sc.(*net.TCPConn), testenv.RecvQueue)
	if err != nil {
		t.Fatalf("server receive seq: %v", err)
	}
	ap := func(a net.Addr) netip.AddrPort { return a.(*net.TCPAddr).AddrPort() }
	return flowView{ap(cc.LocalAddr()), ap(cc.RemoteAddr()), ap(sc.RemoteAddr()), ap(sc.LocalAddr()), snd == rcv}
}

// acceptOne accepts one connection on l in the background; the channel is
// closed without one when Accept fails.
func acceptOne(l net.Listener) <-chan net.Conn {
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	return accepted
}

// dialServer connects host c to s:port and returns the client's end and
// the server's (accepted on l), failing t when either does not come
// before ctx ends.
func dialServer(t *testing.T, ctx context.Context, w *emu.World, l net.Listener, port int) (cc, sc net.Conn) {
	t.Helper()
	accepted := acceptOne(l)
	cc, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(w.Addr("s"), uint16(port)).String())
	if err != nil {
		t.Fatalf("dial s:%d: %v", port, err)
	}
	select {
	case sc = <-accepted:
	case <-ctx.Done():
		cc.Close()
		t.Fatal("server accepted nothing")
	}
	if sc == nil {
		cc.Close()
		t.Fatal("accept failed")
	}
	return cc, sc
}

func listenServer(t *testing.T, w *emu.World, port int) net.Listener {
	t.Helper()
	l, err := w.Listen(context.Background(), "s", "tcp4", netip.AddrPortFrom(w.Addr("s"), uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// startRelay installs the interception in r and serves it in this process.
func startRelay(t *testing.T, w *emu.World, cfg Config) *testRelay {
	t.Helper()
	r, _ := startRelayIC(t, w, cfg)
	return r
}

// startRelayIC is startRelay that also returns the interception.
func startRelayIC(t *testing.T, w *emu.World, cfg Config) (*testRelay, *Interception) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ic, err := Install(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var l *net.TCPListener
	icCfg := ic.Config()
	mark := icCfg.LegMark()
	if err := w.Do("r", func() error {
		var ctl func(string, string, syscall.RawConn) error
		if mark != 0 {
			ctl = MarkControl(mark, nil)
		}
		var err error
		l, err = ListenTransparent(ctx, fmt.Sprintf("0.0.0.0:%d", cfg.Port), ctl)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r := &testRelay{do: func(fn func() error) error { return w.Do("r", fn) }, mark: mark, cwnds: make(chan [2]uint32, 16)}
	done := make(chan struct{})
	go func() { defer close(done); r.serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		l.Close()
		<-done
		r.wg.Wait()
		if err := ic.Remove(); err != nil {
			t.Errorf("remove: %v", err)
		}
	})
	return r, ic
}

// TestSetScopesKeepsFlows: a controller's decision turns the interception
// off and on again while an intercepted flow runs; that flow goes on
// through the relay, new flows pass untouched while off and are split
// again when on.
func TestSetScopesKeepsFlows(t *testing.T) {
	w := startWorld(t)
	lin := listenServer(t, w, inScope)
	r, ic := startRelayIC(t, w, Config{Name: "ts", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, NetNS: w.NetNS("r")})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cc, sc := dialServer(t, ctx, w, lin, inScope)
	defer cc.Close()
	defer sc.Close()
	deadline, _ := ctx.Deadline()
	cc.SetDeadline(deadline)
	sc.SetDeadline(deadline)
	roundTrip := func(n int) {
		t.Helper()
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i * 7)
		}
		if _, err := cc.Write(msg); err != nil {
			t.Fatalf("client write: %v", err)
		}
		got := make([]byte, n)
		if _, err := io.ReadFull(sc, got); err != nil {
			t.Fatalf("server read: %v", err)
		}
		if _, err := sc.Write(got); err != nil {
			t.Fatalf("server write: %v", err)
		}
		back := make([]byte, n)
		if _, err := io.ReadFull(cc, back); err != nil {
			t.Fatalf("client read: %v", err)
		}
		if string(back) != string(msg) {
			t.Fatal("bytes differ after the round trip")
		}
	}
	roundTrip(1000)
	if r.flows.Load() != 1 {
		t.Fatalf("relay carried %d flows; want the first one", r.flows.Load())
	}
	// Off: managed without scopes.
	if err := ic.SetScopes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	roundTrip(200_000) // the established flow goes on through the relay
	if v := oneFlow(t, w, lin, inScope); !v.sameSeq || r.flows.Load() != 1 {
		t.Errorf("interception off: new flow same seq %v, relay flows %d; want untouched and 1", v.sameSeq, r.flows.Load())
	}
	// On again, by a scope of the destination address.
	if err := ic.SetScopes(ctx, []Scope{{Dests: []netip.Prefix{netip.PrefixFrom(w.Addr("s"), 32)}, Ports: []PortRange{{inScope, inScope}}}}); err != nil {
		t.Fatal(err)
	}
	roundTrip(200_000)
	if v := oneFlow(t, w, lin, inScope); v.sameSeq || r.flows.Load() != 2 {
		t.Errorf("interception on again: new flow same seq %v, relay flows %d; want split and 2", v.sameSeq, r.flows.Load())
	}
	if n, err := Tables(ctx, w.NetNS("r")); err != nil || len(n) != 1 {
		t.Errorf("tables after two updates: %v, %v; want one", n, err)
	}
}

// TestTransparency: an intercepted flow is split (the relay carries it
// and the two legs have their own sequence numbers) while both ends see
// each other's real address and port; a flow out of scope is untouched
// (the same sequence numbers at both ends).
func TestTransparency(t *testing.T) {
	w := startWorld(t)
	lin, lout := listenServer(t, w, inScope), listenServer(t, w, outScope)
	r := startRelay(t, w, Config{Name: "t", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, NetNS: w.NetNS("r")})

	v := oneFlow(t, w, lin, inScope)
	if r.flows.Load() != 1 {
		t.Errorf("relay carried %d flows; want the in-scope flow", r.flows.Load())
	}
	if v.serverRemote != v.clientLocal {
		t.Errorf("server sees the client as %v; want the client's own %v", v.serverRemote, v.clientLocal)
	}
	if v.clientRemote != v.serverLocal || v.clientRemote.Addr() != w.Addr("s") {
		t.Errorf("client sees the server as %v; want %v (the server's own)", v.clientRemote, v.serverLocal)
	}
	if v.sameSeq {
		t.Error("intercepted flow: client's send seq equals the server's receive seq; want two segments with their own ISNs")
	}

	v = oneFlow(t, w, lout, outScope)
	if r.flows.Load() != 1 {
		t.Errorf("relay carried %d flows; want only the in-scope one", r.flows.Load())
	}
	if v.serverRemote != v.clientLocal || v.clientRemote != v.serverLocal {
		t.Errorf("out-of-scope flow: ends see %v / %v; want %v / %v", v.serverRemote, v.clientRemote, v.clientLocal, v.serverLocal)
	}
	if !v.sameSeq {
		t.Error("out-of-scope flow: sequence numbers differ at the two ends; want it untouched (same ISN)")
	}
}

// TestThousandFlows echoes 1000 intercepted flows of random sizes and
// checks every byte (SHA-256) and every flow's addresses.
func TestThousandFlows(t *testing.T) {
	w := startWorld(t)
	l := listenServer(t, w, inScope)
	r := startRelay(t, w, Config{Name: "t", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, NetNS: w.NetNS("r")})

	var seen sync.Map // client addr:port seen by the server
	var srv sync.WaitGroup
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			seen.Store(c.RemoteAddr().String(), true)
			srv.Go(func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			})
		}
	}()
	const flows, workers = 1000, 16
	jobs := make(chan int)
	errs := make(chan error, flows)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range jobs {
				errs <- echoFlow(w)
			}
		})
	}
	for i := range flows {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	bad := 0
	for err := range errs {
		if err != nil {
			if bad < 5 {
				t.Error(err)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d flows failed", bad, flows)
	}
	if got := r.flows.Load(); got != flows {
		t.Errorf("relay carried %d flows; want %d", got, flows)
	}
	l.Close()
	srv.Wait()
}

func echoFlow(w *emu.World) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n, _ := rand.Int(rand.Reader, big.NewInt(64<<10))
	payload := make([]byte, n.Int64()+1)
	rand.Read(payload)
	c, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(w.Addr("s"), inScope).String())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	got, err := io.Copy(h, c)
	if err != nil {
		return fmt.Errorf("flow %v: read: %w", c.LocalAddr(), err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("flow %v: write: %w", c.LocalAddr(), err)
	}
	if want := sha256.Sum256(payload); got != int64(len(payload)) || [32]byte(h.Sum(nil)) != want {
		return fmt.Errorf("flow %v: echoed %d bytes (sha256 %x); want %d (%x)", c.LocalAddr(), got, h.Sum(nil), len(payload), want)
	}
	return nil
}

const helperEnv = "MOSTO_INTERCEPT_HELPER"

// TestRelayHelper is the relay process of TestKilled: it runs only when
// started by it, inside the world's relay namespace.
func TestRelayHelper(t *testing.T) {
	arg := os.Getenv(helperEnv)
	if arg == "" {
		t.Skip("helper process of TestKilled")
	}
	ctx := context.Background()
	cfg := Config{Name: "k", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, FailClosed: arg == "closed"}
	ic, err := Install(ctx, cfg, nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	l, err := ListenTransparent(ctx, fmt.Sprintf("0.0.0.0:%d", tpPort), nil)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	r := &testRelay{do: func(fn func() error) error { return fn() }}
	go r.serve(ctx, l)
	fmt.Println("READY")
	io.Copy(io.Discard, os.Stdin) // until the parent closes stdin (or kills us)
	l.Close()
	if err := ic.Remove(); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	os.Exit(0)
}

type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

func startHelper(t *testing.T, w *emu.World, mode string) *helper {
	t.Helper()
	cmd := w.Command(context.Background(), "r", os.Args[0], "-test.run=^TestRelayHelper$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin}
	t.Cleanup(func() { h.kill() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "READY" {
		t.Fatalf("relay helper: %q, %v", line, err)
	}
	go io.Copy(io.Discard, out)
	return h
}

func (h *helper) kill() {
	if h.cmd.Process != nil && h.cmd.ProcessState == nil {
		syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
		h.cmd.Wait()
	}
}

func tables(t *testing.T, w *emu.World) []string {
	t.Helper()
	ts, err := Tables(context.Background(), w.NetNS("r"))
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// TestKilled kills the relay process mid-flow (SIGKILL), in both modes:
// the intercepted flow ends with a reset on both legs, the rules stay;
// fail-open lets new flows pass untouched, fail-closed refuses them. A
// restart replaces the leftovers and an orderly exit removes everything.
func TestKilled(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			w := startWorld(t)
			l := listenServer(t, w, inScope)
			h := startHelper(t, w, mode)
			if ts := tables(t, w); len(ts) != 1 || ts[0] != "mosto_tp_k" {
				t.Fatalf("tables in r = %v; want [mosto_tp_k]", ts)
			}
			// A streaming flow through the relay.
			srvErr := make(chan error, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					srvErr <- err
					return
				}
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						srvErr <- err
						return
					}
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cc, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(w.Addr("s"), inScope).String())
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			cc.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.CopyN(io.Discard, cc, 1<<20); err != nil {
				t.Fatalf("stream before the kill: %v", err)
			}
			h.kill()
			_, err = io.Copy(io.Discard, cc)
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("client after the relay was killed: %v; want a reset (not a clean end)", err)
			}
			select {
			case err := <-srvErr:
				if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
					t.Errorf("server after the relay was killed: %v; want a reset", err)
				}
			case <-ctx.Done():
				t.Error("server kept writing after the relay was killed")
			}
			if ts := tables(t, w); len(ts) != 1 {
				t.Errorf("tables after the crash = %v; want the leftover", ts)
			}
			// New flows.
			switch mode {
			case "open":
				v := oneFlow(t, w, l, inScope)
				if !v.sameSeq || v.serverRemote != v.clientLocal {
					t.Errorf("fail-open, relay dead: flow not untouched (same seq %v, server sees %v, client is %v)", v.sameSeq, v.serverRemote, v.clientLocal)
				}
			case "closed":
				c, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(w.Addr("s"), inScope).String())
				if err == nil {
					c.Close()
					if sc, err := l.Accept(); err == nil {
						sc.Close()
					}
				}
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("fail-closed, relay dead: dial = %v; want connection refused", err)
				}
			}
			// Restart: the leftovers are replaced and the relay works.
			h = startHelper(t, w, mode)
			if ts := tables(t, w); len(ts) != 1 || ts[0] != "mosto_tp_k" {
				t.Errorf("tables after the restart = %v; want [mosto_tp_k]", ts)
			}
			if rules := ipRules(t, w); strings.Count(rules, "fwmark 0x4d53") != 1 {
				t.Errorf("policy rules after the restart:\n%s\nwant one fwmark 0x4d53 rule", rules)
			}
			if v := oneFlow(t, w, l, inScope); v.sameSeq {
				t.Error("after the restart: flow not intercepted (same seq at both ends)")
			}
			// Orderly exit removes everything.
			h.stdin.Close()
			if err := h.cmd.Wait(); err != nil {
				t.Fatalf("relay helper exit: %v", err)
			}
			if ts := tables(t, w); len(ts) != 0 {
				t.Errorf("tables after exit = %v; want none", ts)
			}
			if rules := ipRules(t, w); strings.Contains(rules, "fwmark") {
				t.Errorf("policy rules after exit:\n%s\nwant no fwmark rule", rules)
			}
			if out, _ := exec.Command("ip", "-n", w.NetNS("r"), "route", "show", "table", strconv.Itoa(DefaultRouteTable)).Output(); len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("route table %d after exit: %s; want empty", DefaultRouteTable, out)
			}
		})
	}
}

func ipRules(t *testing.T, w *emu.World) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", w.NetNS("r"), "rule", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("ip rule: %v: %s", err, out)
	}
	return string(out)
}

// TestOptionsPerSegment: each segment of an intercepted flow negotiates
// its own options. The client advertises an MSS of 600; the server's
// connection of an intercepted flow has the relay's full MSS, while an
// untouched flow carries the client's 600 to the server.
func TestOptionsPerSegment(t *testing.T) {
	testenv.CheckLeaks(t)
	w := startWorld(t)
	lin, lout := listenServer(t, w, inScope), listenServer(t, w, outScope)
	startRelay(t, w, Config{Name: "t", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, NetNS: w.NetNS("r")})
	serverMSS := func(l net.Listener, port uint16) (client, server int) {
		t.Helper()
		accepted := acceptOne(l)
		var cc net.Conn
		err := w.Do("c", func() error {
			d := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, 600) })
				return serr
			}}
			var err error
			cc, err = d.Dial("tcp4", netip.AddrPortFrom(w.Addr("s"), port).String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		sc, ok := <-accepted
		if !ok {
			t.Fatal("accept failed")
		}
		defer sc.Close()
		mss := func(c net.Conn) int {
			rc, _ := c.(*net.TCPConn).SyscallConn()
			var v int
			rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) })
			return v
		}
		return mss(cc), mss(sc)
	}
	if c, s := serverMSS(lout, outScope); c > 600 || s > 600 {
		t.Errorf("untouched flow: client MSS %d, server MSS %d; want both <= 600 (end to end)", c, s)
	}
	if c, s := serverMSS(lin, inScope); c > 600 || s <= 600 {
		t.Errorf("intercepted flow: client MSS %d, server MSS %d; want the client's <= 600 and the server's its own segment's (> 600)", c, s)
	}
}

// TestCleanupAfterCrash: after the relay process is killed (its rules
// stay), Cleanup with the same config removes the table, the policy rule
// and the route, and in-scope flows then pass untouched.
func TestCleanupAfterCrash(t *testing.T) {
	w := startWorld(t)
	l := listenServer(t, w, inScope)
	h := startHelper(t, w, "closed")
	h.kill()
	if ts := tables(t, w); len(ts) != 1 {
		t.Fatalf("tables after the crash = %v; want the leftover", ts)
	}
	cfg := Config{Name: "k", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, FailClosed: true, NetNS: w.NetNS("r")}
	if err := Cleanup(context.Background(), cfg); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if ts := tables(t, w); len(ts) != 0 {
		t.Errorf("tables after Cleanup = %v; want none", ts)
	}
	if rules := ipRules(t, w); strings.Contains(rules, "fwmark") {
		t.Errorf("policy rules after Cleanup:\n%s\nwant no fwmark rule", rules)
	}
	if out, _ := exec.Command("ip", "-n", w.NetNS("r"), "route", "show", "table", strconv.Itoa(DefaultRouteTable)).Output(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("route table %d after Cleanup: %s; want empty", DefaultRouteTable, out)
	}
	// The fail-closed leftover refused in-scope flows; after Cleanup they
	// pass untouched.
	if v := oneFlow(t, w, l, inScope); !v.sameSeq || v.serverRemote != v.clientLocal {
		t.Errorf("after Cleanup: flow not untouched (same seq %v, server sees %v, client is %v)", v.sameSeq, v.serverRemote, v.clientLocal)
	}
	// Cleaning again (nothing left) is not an error.
	if err := Cleanup(context.Background(), cfg); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
}

// TestNoSACK: with NoSACK both legs of an intercepted flow run without
// SACK, while a flow out of scope keeps the SACK its ends negotiate.
func TestNoSACK(t *testing.T) {
	w := startWorld(t)
	lin, lout := listenServer(t, w, inScope), listenServer(t, w, outScope)
	r := startRelay(t, w, Config{Name: "ns", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, NoSACK: true, NetNS: w.NetNS("r")})
	sack := func(c net.Conn) bool {
		t.Helper()
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var info *unix.TCPInfo
		var ierr error
		rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if ierr != nil {
			t.Fatal(ierr)
		}
		return info.Options&tcpiOptSACK != 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		l     net.Listener
		port  int
		flows int64
		sack  bool
	}{
		{"out of scope", lout, outScope, 0, true},
		{"intercepted", lin, inScope, 1, false},
	} {
		cc, sc := dialServer(t, ctx, w, tc.l, tc.port)
		// One byte through, so the server's accepted socket is the leg's
		// established end.
		if _, err := cc.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(sc, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if c, s := sack(cc), sack(sc); c != tc.sack || s != tc.sack {
			t.Errorf("%s flow: SACK at the client %v, at the server %v; want %v at both", tc.name, c, s, tc.sack)
		}
		cc.Close()
		sc.Close()
		if got := r.flows.Load(); got != tc.flows {
			t.Errorf("after the %s flow the relay carried %d flows; want %d", tc.name, got, tc.flows)
		}
	}
}

// tcpiOptSACK is TCPI_OPT_SACK of linux/tcp.h (tcpi_options).
const tcpiOptSACK = 2

// sndCwnd returns c's congestion window (tcpi_snd_cwnd), 0 when it cannot
// be read.
func sndCwnd(c *net.TCPConn) uint32 {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var info *unix.TCPInfo
	rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if err != nil {
		return 0
	}
	return info.Snd_cwnd
}

// TestInitCwnd: with InitCwnd both of the relay's legs of an intercepted
// flow start at that congestion window, while the relay's other
// connections (unmarked) and the end hosts keep the kernel's 10; Remove
// takes the legs' rule and route table away.
func TestInitCwnd(t *testing.T) {
	const iw = 321
	w := startWorld(t)
	lin := listenServer(t, w, inScope)
	cfg := Config{Name: "iw", Port: tpPort, Ports: []PortRange{{inScope, inScope}}, InitCwnd: iw, NetNS: w.NetNS("r")}
	table := strconv.Itoa(DefaultRouteTable + 1)
	legRule := fmt.Sprintf("fwmark %#x lookup %s", DefaultMark+1, table)
	routes := func() string {
		out, err := exec.Command("ip", "-n", w.NetNS("r"), "route", "show", "table", table).CombinedOutput()
		if strings.Contains(string(out), "does not exist") {
			return "" // never made, or flushed
		}
		if err != nil {
			t.Fatalf("ip route show table %s: %v: %s", table, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	rules := func() string {
		out, err := exec.Command("ip", "-n", w.NetNS("r"), "rule", "show").CombinedOutput()
		if err != nil {
			t.Fatalf("ip rule: %v: %s", err, out)
		}
		return string(out)
	}
	// Registered first, so it runs after the relay's cleanup (Remove).
	t.Cleanup(func() {
		if got := routes(); got != "" {
			t.Errorf("table %s after Remove: %q; want empty", table, got)
		}
		if got := rules(); strings.Contains(got, legRule) {
			t.Errorf("rules after Remove:\n%s\nstill hold %q", got, legRule)
		}
	})
	r := startRelay(t, w, cfg)
	if got := routes(); !strings.Contains(got, fmt.Sprintf("initcwnd %d", iw)) {
		t.Errorf("table %s while installed: %q; want routes with initcwnd %d", table, got, iw)
	}
	if got := rules(); !strings.Contains(got, legRule) {
		t.Errorf("rules while installed:\n%s\nwant %q", got, legRule)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, sc := dialServer(t, ctx, w, lin, inScope)
	defer cc.Close()
	defer sc.Close()
	select {
	case got := <-r.cwnds:
		if got != [2]uint32{iw, iw} {
			t.Errorf("the relay's legs (towards the client, towards the server) start at cwnd %v; want %d on both", got, iw)
		}
	case <-ctx.Done():
		t.Fatal("the relay carried no flow")
	}
	if got := sndCwnd(cc.(*net.TCPConn)); got != 10 {
		t.Errorf("the client starts at cwnd %d; want the kernel's 10", got)
	}
	if got := sndCwnd(sc.(*net.TCPConn)); got != 10 {
		t.Errorf("the server starts at cwnd %d; want the kernel's 10", got)
	}
	// The relay host's own connection without the mark.
	accepted := acceptOne(lin)
	var plain net.Conn
	if err := w.Do("r", func() error {
		var err error
		plain, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp4", netip.AddrPortFrom(w.Addr("s"), inScope).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if sc2 := <-accepted; sc2 != nil {
		sc2.Close()
	}
	if got := sndCwnd(plain.(*net.TCPConn)); got != 10 {
		t.Errorf("the relay host's unmarked connection starts at cwnd %d; want 10", got)
	}
}
