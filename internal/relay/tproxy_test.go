package relay

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/intercept"
	"github.com/mosto-net/mosto/internal/testenv"
)

func TestTProxyConfig(t *testing.T) {
	base := "id: r-1\ndestinations: {allow: [\"*\"]}\n"
	for _, tt := range []struct{ name, yaml, want string }{
		{"no listen", "tproxy: {ports: \"80\"}", "tproxy: listen: missing"},
		{"bad ports", "tproxy: {listen: \":15001\", ports: \"80-70\"}", "tproxy: ports"},
		{"own port", "tproxy: {listen: \":15001\", ports: \"15000-15002\"}", "listener's own port"},
		{"zero port", "tproxy: {listen: \":0\"}", "fixed port"},
		{"bad source", "tproxy: {listen: \":15001\", sources: [\"::1\"]}", "tproxy: sources"},
		{"bad name", "tproxy: {listen: \":15001\", name: \"a b\"}", "bad name"},
		{"workers", "workers: 2\ntproxy: {listen: \":15001\"}", "workers"},
		{"unknown key", "tproxy: {listen: \":15001\", bogus: 1}", "bogus"},
		{"pacing", "tproxy: {listen: \":15001\", pacing_mbit: -1}", "pacing_mbit"},
		{"initcwnd", "tproxy: {listen: \":15001\", initcwnd: -1}", "initcwnd"},
		{"window clamp", "tproxy: {listen: \":15001\", window_clamp: 2GB}", "window_clamp"},
		{"handshake hold", "tproxy: {listen: \":15001\", handshake_hold: 300ms}", "handshake_hold"},
		{"window bdp", "tproxy: {listen: \":15001\", window_bdp: 0.5}", "window_bdp"},
		{"window bdp and clamp", "tproxy: {listen: \":15001\", window_bdp: 1.25, window_clamp: 3MB}", "exclude each other"},
		{"initcwnd table", "tproxy: {listen: \":15001\", initcwnd: 100, route_table: 252}", "route table 253"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig(strings.NewReader(base+tt.yaml), ".")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseConfig = %v; want an error containing %q", err, tt.want)
			}
		})
	}
	cfg, err := ParseConfig(strings.NewReader(base+"tproxy: {listen: \"0.0.0.0:15001\", ports: \"80,8000-8100\", dests: [10.0.0.0/8], fail_closed: true}"), ".")
	if err != nil {
		t.Fatal(err)
	}
	ic, err := cfg.TProxy.interceptConfig(cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ic.Name != "r_1" || ic.Port != 15001 || !ic.FailClosed || len(ic.Ports) != 2 || len(ic.Dests) != 1 {
		t.Errorf("interceptConfig = %+v", ic)
	}
}

// tproxyWorld: client c, proxy host r on the path, server s.
func tproxyWorld(t *testing.T) *emu.World {
	t.Helper()
	spec, err := emu.ParseSpec([]byte(`
hosts: [{name: c}, {name: r}, {name: s}]
links: [{a: c, b: r, delay_ms: 1}, {a: r, b: s, delay_ms: 1}]
routes: [{from: c, to: s, via: [r]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return emutest.Start(t, spec)
}

// startTProxyChild runs `mosto proxy` with a tproxy entry as a child
// process in host r and waits until its rules are installed.
func startTProxyChild(t *testing.T, w *emu.World, cfgYAML string) *exec.Cmd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := w.Command(context.Background(), "r", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MOSTO_RELAY_CHILD="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	// The child says SERVING once Run has installed its rules: after a
	// SIGKILL the killed child's leftover rules are still there, and the
	// restarted one replaces them (routes first, the table last).
	serving := make(chan error, 1)
	go func() {
		r := bufio.NewReader(out)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				serving <- fmt.Errorf("child ended before serving: %w", err)
				return
			}
			if strings.TrimSpace(line) == "SERVING" {
				serving <- nil
				io.Copy(io.Discard, r)
				return
			}
		}
	}()
	select {
	case err := <-serving:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy did not serve within 30 s")
	}
	if ts, err := intercept.Tables(context.Background(), w.NetNS("r")); err != nil || !slices.Contains(ts, "mosto_tp_tt") {
		t.Fatalf("serving without its interception table (tables %v, %v)", ts, err)
	}
	return cmd
}

// TestTProxyEntry runs the proxy with a tproxy entry in a child process on
// the path of c-s flows: intercepted flows are split and fully
// transparent, out-of-scope flows untouched, 200 echo flows are
// byte-exact; SIGKILL resets the live flow, a restart replaces the
// leftover rules, SIGTERM removes them.
func TestTProxyEntry(t *testing.T) {
	w := tproxyWorld(t)
	ctx := context.Background()
	s := w.Addr("s")
	// The legs' congestion control is the entry's (reno), not the proxy's
	// socket.congestion (cubic), they pace (pacing_mbit), start at
	// cwnd 250 (initcwnd) and advertise at most 20000 bytes of window
	// (window_clamp).
	conf := fmt.Sprintf("id: tt\ndestinations: {allow: [\"%v\"]}\ntproxy: {listen: \"0.0.0.0:15001\", ports: \"8080\", congestion: reno, pacing_mbit: 80, initcwnd: 250, window_clamp: 20000}\nsocket: {congestion: cubic}\ntimeouts: {drain: 1s}\n", emu.Prefix)
	child := startTProxyChild(t, w, conf)

	// Echo server on 8080 (in scope) and 9090 (out of scope), recording
	// the peers it sees.
	type seen struct {
		remote netip.AddrPort
		conn   *net.TCPConn
	}
	accepted := make(chan seen, 512)
	for _, port := range []uint16{8080, 9090} {
		l, err := w.Listen(ctx, "s", "tcp4", netip.AddrPortFrom(s, port).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted <- seen{c.RemoteAddr().(*net.TCPAddr).AddrPort(), c.(*net.TCPConn)}
				go func() {
					io.Copy(c, c)
					c.(*net.TCPConn).CloseWrite()
				}()
			}
		}()
	}
	dial := func(port uint16) *net.TCPConn {
		t.Helper()
		c, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(s, port).String())
		if err != nil {
			t.Fatalf("dial s:%d: %v", port, err)
		}
		c.SetDeadline(time.Now().Add(60 * time.Second))
		return c.(*net.TCPConn)
	}
	relayUp := true // the proxy runs: in-scope flows are split
	// sameSeq sends 10 bytes, waits for the echo and compares the client's
	// send sequence with the server's receive sequence.
	check := func(port uint16) (split bool) {
		t.Helper()
		c := dial(port)
		defer c.Close()
		if _, err := c.Write([]byte("0123456789")); err != nil {
			t.Fatal(err)
		}
		var b [10]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatal(err)
		}
		// The server's accept for this flow (earlier flows' may be queued).
		var sv seen
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case sv = <-accepted:
				if sv.remote == c.LocalAddr().(*net.TCPAddr).AddrPort() {
					break wait
				}
			case <-timeout:
				t.Fatalf("port %d: the server never accepted the client %v", port, c.LocalAddr())
			}
		}
		if sv.remote != c.LocalAddr().(*net.TCPAddr).AddrPort() {
			t.Errorf("port %d: server sees the client as %v; want %v", port, sv.remote, c.LocalAddr())
		}
		if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != netip.AddrPortFrom(s, port) {
			t.Errorf("port %d: client sees the server as %v", port, got)
		}
		if port == 8080 && relayUp {
			// Both of the relay's legs of this flow run tproxy.congestion.
			p := c.LocalAddr().(*net.TCPAddr).Port
			out, err := w.Command(ctx, "r", "ss", "-tin", "state", "established", fmt.Sprintf("( sport = :8080 or dport = :8080 ) and ( sport = :%d or dport = :%d )", p, p)).CombinedOutput()
			if n := strings.Count(string(out), " reno "); err != nil || n != 2 {
				t.Errorf("relay legs: %d with reno (err %v); want both:\n%s", n, err, out)
			}
			// ... and pace at most at 80 Mbit/s (tproxy.pacing_mbit: ss
			// shows the cap after the pacing rate, in bit/s).
			if n := len(regexp.MustCompile(`pacing_rate \d+bps/80000000bps`).FindAllString(string(out), -1)); n != 2 {
				t.Errorf("relay legs: %d with a max pacing rate; want both:\n%s", n, out)
			}
			// ... and started at tproxy.initcwnd (10 bytes each way
			// do not grow it).
			if n := strings.Count(string(out), " cwnd:250 "); n != 2 {
				t.Errorf("relay legs: %d at cwnd 250; want both:\n%s", n, out)
			}
		}
		// The window the server may fill: the relay's clamp on an
		// intercepted flow, the client's (64 KiB or more) untouched.
		if wnd := sndWnd(t, sv.conn); port == 8080 && relayUp && wnd > 20000 {
			t.Errorf("intercepted flow: the server's send window is %d; want <= 20000 (window_clamp)", wnd)
		} else if port != 8080 && wnd <= 20000 {
			t.Errorf("out-of-scope flow: the server's send window is %d; want the client's (> 20000)", wnd)
		}
		snd, err1 := testenv.TCPQueueSeq(c, testenv.SendQueue)
		rcv, err2 := testenv.TCPQueueSeq(sv.conn, testenv.RecvQueue)
		if err1 != nil || err2 != nil {
			t.Fatalf("sequence numbers: %v %v", err1, err2)
		}
		return snd != rcv
	}
	if !check(8080) {
		t.Error("in-scope flow: same sequence numbers at both ends; want it split by the proxy")
	}
	if check(9090) {
		t.Error("out-of-scope flow: sequence numbers differ; want it untouched")
	}

	// 200 echo flows, SHA-256 checked.
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	sem := make(chan struct{}, 16)
	for i := range 200 {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(s, 8080).String())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			msg := make([]byte, 1+i*331)
			rand.Read(msg)
			go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
			h := sha256.New()
			if _, err := io.Copy(h, c); err != nil {
				errs <- err
				return
			}
			if [32]byte(h.Sum(nil)) != sha256.Sum256(msg) {
				errs <- fmt.Errorf("flow %d: echo differs", i)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// SIGKILL mid-flow: the client sees a reset. Only the reader runs at
	// the kill (a concurrent write would take the reset error and leave
	// the read an EOF).
	c := dial(8080)
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 2<<20))
		wrote <- err
	}()
	if _, err := io.CopyN(io.Discard, c, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	syscall.Kill(-child.Process.Pid, syscall.SIGKILL)
	child.Wait()
	_, err := io.Copy(io.Discard, c)
	c.Close()
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client after SIGKILL of the proxy: %v; want a reset", err)
	}
	if ts, _ := intercept.Tables(ctx, w.NetNS("r")); len(ts) != 1 {
		t.Errorf("tables after SIGKILL = %v; want the leftover", ts)
	}
	// Fail-open while it is down: a new flow passes untouched.
	relayUp = false
	if check(8080) {
		t.Error("proxy dead (fail-open): flow not untouched")
	}
	// Restart: rules replaced, flows split again; SIGTERM removes them.
	child = startTProxyChild(t, w, conf)
	relayUp = true
	if ts, _ := intercept.Tables(ctx, w.NetNS("r")); len(ts) != 1 {
		t.Errorf("tables after restart = %v; want one", ts)
	}
	if !check(8080) {
		t.Error("after restart: flow not split")
	}
	syscall.Kill(child.Process.Pid, syscall.SIGTERM)
	if err := child.Wait(); err != nil {
		t.Fatalf("proxy exit after SIGTERM: %v", err)
	}
	if ts, _ := intercept.Tables(ctx, w.NetNS("r")); len(ts) != 0 {
		t.Errorf("tables after SIGTERM = %v; want none", ts)
	}
	if out, _ := exec.Command("ip", "-n", w.NetNS("r"), "rule", "show").Output(); strings.Contains(string(out), "fwmark") {
		t.Errorf("policy rules after SIGTERM:\n%s", out)
	}
}

// sndWnd returns the peer's advertised receive window as c sees it
// (tcpi_snd_wnd).
func sndWnd(t *testing.T, c *net.TCPConn) uint32 {
	t.Helper()
	return tcpInfo(t, c).Snd_wnd
}

// tcpInfo returns c's TCP_INFO.
func tcpInfo(t *testing.T, c *net.TCPConn) *unix.TCPInfo {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	return info
}

// TestTProxyHandshakeHold: with handshake_hold the server's first RTT
// sample of an intercepted flow (its SYN-ACK to the relay's ACK, read at
// accept) includes the hold, on 2 ms of RTT; the flow's bytes arrive.
func TestTProxyHandshakeHold(t *testing.T) {
	w := tproxyWorld(t)
	ctx := context.Background()
	s := w.Addr("s")
	startTProxyChild(t, w, fmt.Sprintf("id: tt\ndestinations: {allow: [\"%v\"]}\ntproxy: {listen: \"0.0.0.0:15001\", ports: \"8080\", handshake_hold: 150ms}\ntimeouts: {drain: 1s}\n", emu.Prefix))
	l, err := w.Listen(ctx, "s", "tcp4", netip.AddrPortFrom(s, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 3 {
		c, err := w.Dial(ctx, "c", "tcp4", netip.AddrPortFrom(s, 8080).String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		sc, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		rtt := time.Duration(tcpInfo(t, sc.(*net.TCPConn)).Rtt) * time.Microsecond
		sc.SetDeadline(time.Now().Add(30 * time.Second))
		var b [1]byte
		if _, err := io.ReadFull(sc, b[:]); err != nil || b[0] != byte(i) {
			t.Errorf("flow %d: the server read %v, %v; want the client's byte", i, b, err)
		}
		if rtt < 140*time.Millisecond {
			t.Errorf("flow %d: the server's first RTT sample is %v; want >= 140ms (the 150 ms hold on a 2 ms RTT)", i, rtt)
		}
		sc.Close()
		c.Close()
	}
}
