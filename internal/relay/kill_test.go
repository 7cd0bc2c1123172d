package relay_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestMain lets the test binary run a proxy daemon as a child process
// (MOSTO_RELAY_CHILD=config path), so a test can kill it with SIGKILL.
func TestMain(m *testing.M) {
	if path := os.Getenv("MOSTO_RELAY_CHILD"); path != "" {
		os.Exit(runChild(path))
	}
	os.Exit(m.Run())
}

func runChild(path string) int {
	cfg, err := relay.LoadConfig(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := relay.New(cfg, slog.New(servingHandler{slog.DiscardHandler}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("HOP %s\n", s.HopAddr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := s.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// servingHandler prints "SERVING" on stdout when the proxy logs that it
// serves: Run has installed its interception rules and opened its
// listeners, which a test of a restarted child cannot tell from the rules
// the killed one left.
type servingHandler struct{ slog.Handler }

func (h servingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h servingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "proxy serving" {
		fmt.Println("SERVING")
	}
	return nil
}

func (h servingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h servingHandler) WithGroup(string) slog.Handler { return h }

// startChild runs the proxy of cfgYAML in a child process and returns it
// with its hop address.
func startChild(t *testing.T, cfgYAML string) (*exec.Cmd, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(path, []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
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
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "HOP ")
	if err != nil || !ok {
		t.Fatalf("child said %q, %v", line, err)
	}
	return cmd, addr
}

// TestHopKilled kills the transit proxy (SIGKILL) in the middle of a
// download: the client must see its flow end (reset or early EOF)
// promptly, long before the idle timeout, and the other proxies must go on
// serving.
func TestHopKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	testenv.CheckLeaks(t)
	// The origin streams to clients that send "d" and swallows the
	// uploads of clients that send "u" (counting them).
	uploaded := new(countingWriter)
	o := testenv.NewServer(t, func(c *net.TCPConn) {
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		if b[0] == 'u' {
			io.Copy(uploaded, c)
			return
		}
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	w := relaytest.OverlayWith(t, relaytest.Options{OriginAddr: o.Addr(), Tweak: func(c *relay.Config) { c.Timeouts.Idle = relay.Duration(time.Minute) }}, "a", "b", "c")
	cmd, bAddr := startChild(t, fmt.Sprintf(`id: b
hop: {listen: "127.0.0.1:0"}
members: {c: %q}
keys: {current: {id: 1, secret_hex: %s}}
timeouts: {idle: 1m}
`, w.Members["c"].HopAddr(), relaytest.Config("b").Keys.Current.SecretHex))
	members := map[string]string{"a": w.Members["a"].HopAddr().String(), "b": bAddr, "c": w.Members["c"].HopAddr().String()}
	w.Members["a"].SetMembers(members)
	w.Members["c"].SetMembers(members)

	dial := func(kind string) net.Conn {
		c, err := net.Dial("tcp", w.Members["a"].ServiceAddr(0).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write([]byte(kind))
		return c
	}
	down, up := dial("d"), dial("u")
	if _, err := io.ReadFull(down, make([]byte, 1<<20)); err != nil {
		t.Fatalf("download before the kill: %v", err)
	}
	upDone := make(chan error, 1)
	go func() {
		buf := make([]byte, 16<<10)
		for {
			if _, err := up.Write(buf); err != nil {
				upDone <- err
				return
			}
		}
	}()
	testenv.WaitFor(t, 10*time.Second, "the upload reaching the origin", func() bool { return uploaded.n.Load() > 0 })
	killed := time.Now()
	cmd.Process.Kill()
	n, err := io.Copy(io.Discard, down)
	took := time.Since(killed)
	if isTimeoutErr(err) {
		t.Fatalf("download hung until its deadline after the hop died (read %d bytes)", n)
	}
	t.Logf("download saw %v after %v (%d more bytes)", errOrEOF(err), took, n)
	if took > 5*time.Second {
		t.Errorf("download learned of the dead hop after %v; want promptly", took)
	}
	// An upload writes into the dead hop: the RST comes back to the client.
	err = <-upDone
	took = time.Since(killed)
	t.Logf("upload saw %v after %v", err, took)
	if isTimeoutErr(err) || took > 5*time.Second {
		t.Errorf("upload: %v after %v; want a reset promptly", err, took)
	}
	if !relay.IsReset(err) && !errors.Is(err, syscall.EPIPE) {
		t.Errorf("upload error %v; want connection reset or broken pipe", err)
	}
	// The surviving proxies keep serving: a new flow finds b down and goes
	// direct; with a chain around b it goes through c.
	// The client's flows end as the first of b's sockets is closed; the
	// kernel may still be closing b's other sockets (its listeners among
	// them) when the new flows start. Wait until b has fully exited.
	waitExited(t, cmd.Process.Pid)
	for _, route := range [][]string{{"a", "b", "c"}, {"a", "c"}} {
		w.Members["a"].SetChains(relaytest.ChainTable{{"a", "c"}: route})
		t.Logf("route %v", route)
		if err := download(w.Members["a"].ServiceAddr(0).String()); err != nil {
			t.Fatalf("route %v: download after the kill: %v; counters: a %s; c %s", route, err, flowCounters(w.Members["a"]), flowCounters(w.Members["c"]))
		}
	}
	t.Logf("counters: a %s; c %s", flowCounters(w.Members["a"]), flowCounters(w.Members["c"]))
	if n := relay.DirectCount(w.Members["a"], "hop_unreachable"); n != 1 {
		t.Errorf("direct{hop_unreachable} = %v; want 1", n)
	}
	if n := connectCount(w.Members["a"], "c"); n != 1 {
		t.Errorf("a connected to c %d times; want 1 (the flow routed around b)", n)
	}
}

// waitExited waits until the process pid has exited (a zombie or gone):
// every file of a killed process is closed by then.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the killed child to exit", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		i := strings.LastIndexByte(string(b), ')')
		return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
	})
}

// download reads 1 MiB from the streaming origin through addr.
func download(addr string) error {
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(10 * time.Second))
	c2.Write([]byte("d"))
	if n, err := io.ReadFull(c2, make([]byte, 1<<20)); err != nil {
		return fmt.Errorf("after %d bytes: %w", n, err)
	}
	return nil
}

// flowCounters lists s's non-zero flow, refusal, direct and upstream
// counters, to say how a failed flow ended at each proxy.
func flowCounters(s *relay.Server) string {
	fams := s.Registry().Gather()
	var b strings.Builder
	for _, name := range []string{"mosto_relay_flows_total", "mosto_relay_refusals_total", "mosto_relay_direct_total", "mosto_relay_upstream_total"} {
		f, _ := metrics.Find(fams, name)
		for _, m := range f.Series {
			if m.Value == 0 {
				continue
			}
			b.WriteString(strings.TrimPrefix(name, "mosto_relay_") + "{")
			for i, l := range m.Labels {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString(l.Name + "=" + l.Value)
			}
			fmt.Fprintf(&b, "}=%v ", m.Value)
		}
	}
	return strings.TrimSpace(b.String())
}

func errOrEOF(err error) string {
	if err == nil {
		return "EOF"
	}
	return err.Error()
}

// connectCount is the number of connections s made to peer.
func connectCount(s *relay.Server, peer string) uint64 {
	f, _ := metrics.Find(s.Registry().Gather(), "mosto_relay_connect_seconds")
	for _, m := range f.Series {
		if m.Label("peer") == peer {
			return m.Count
		}
	}
	return 0
}

// countingWriter discards what it is given and counts the bytes.
type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}
