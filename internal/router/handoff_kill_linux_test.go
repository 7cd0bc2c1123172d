//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package router

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate"
	"golang.org/x/sys/unix"
)

const killChildEnv = "MOSTO_ROUTER_KILL_CHILD"

// rrChild is a router process (this test binary) in the rr namespace.
type rrChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // the child's "RRCHILD ..." lines
	mu    sync.Mutex
	out   strings.Builder
	done  chan struct{}
}

func startRRChild(t *testing.T, w *emu.World, args ...string) *rrChild {
	t.Helper()
	c := &rrChild{lines: make(chan string, 16), done: make(chan struct{})}
	c.cmd = w.Command(context.Background(), "rr", os.Args[0], "-test.run=^TestHandoffSurvivesKill$", "-test.v", "-test.count=1")
	c.cmd.Env = append(os.Environ(), killChildEnv+"="+strings.Join(args, ","))
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stderr = c.cmd.Stdout
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.out.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			if rest, ok := strings.CutPrefix(sc.Text(), "RRCHILD "); ok {
				c.lines <- rest
			}
		}
	}()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		c.cmd.Wait()
		if t.Failed() {
			t.Logf("router child output:\n%s", c.output())
		}
	})
	return c
}

func (c *rrChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

func (c *rrChild) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case l := <-c.lines:
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("router child said %q, want %q...", l, prefix)
		}
		return l
	case <-c.done:
		t.Fatalf("router child ended before %q:\n%s", prefix, c.output())
	case <-time.After(60 * time.Second):
		t.Fatalf("router child did not say %q in 60 s", prefix)
	}
	return ""
}

// silent asks the child how many surrogate legs it holds silent.
func (c *rrChild) silent(t *testing.T) int {
	t.Helper()
	io.WriteString(c.stdin, "silent\n")
	n, _ := strconv.Atoi(strings.TrimPrefix(c.waitLine(t, "silent="), "silent="))
	return n
}

// TestHandoffSurvivesKill: sessions handed off by a router process keep
// flowing after the router is killed with SIGKILL (the translation is
// pinned in bpffs): every body is SHA-256 intact and a further request on
// a handed-off connection is served by the surrogate while no router
// runs. A restarted router adopts the joins (their tuples held again),
// hands off new sessions, removes the joins once their sessions ended,
// and its clean stop leaves no pin and no program behind.
func TestHandoffSurvivesKill(t *testing.T) {
	if env := os.Getenv(killChildEnv); env != "" {
		killChildBody(t, strings.Split(env, ","))
		return
	}
	testenv.RequirePrivileged(t)
	d := 1.0
	spec := &emu.Spec{Name: "rtkill", Hosts: []emu.HostSpec{{Name: "client"}, {Name: "rr"}, {Name: "sur"}},
		Links: []emu.LinkSpec{{A: "client", B: "rr", DelayMS: &d}, {A: "rr", B: "sur", DelayMS: &d}, {A: "client", B: "sur", DelayMS: &d}}}
	w := emutest.Start(t, spec)
	rrAddr := net.JoinHostPort(w.Addr("rr").String(), "80")
	surAddr := net.JoinHostPort(w.Addr("sur").String(), "8080")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sln, err := w.Listen(ctx, "sur", "tcp", surAddr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { origin.New(origin.Config{}, nil).Serve(ctx, sln) })

	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(bpffs, unix.MNT_DETACH) })
	pin := filepath.Join(bpffs, "mosto", "router")
	args := []string{rrAddr, surAddr, pin}
	pinned := func() []xlate.PinnedEntry {
		es, err := xlate.ReadPinned(pin)
		if err != nil {
			t.Fatalf("read pins: %v", err)
		}
		return es
	}

	rr1 := startRRChild(t, w, args...)
	rr1.waitLine(t, "ready adopted=0")

	// Sessions handed off, each paused after its first 64 KiB of body.
	const sessions, size, first = 16, 4 << 20, 64 << 10
	type session struct {
		c   *net.TCPConn
		br  *bufio.Reader
		h   io.Writer
		n   int64 // body length
		sum func() [32]byte
	}
	ss := make([]*session, sessions)
	for i := range ss {
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		nc, err := w.Dial(dctx, "client", "tcp", rrAddr)
		dcancel()
		if err != nil {
			t.Fatal(err)
		}
		c := nc.(*net.TCPConn)
		defer c.Close()
		c.SetDeadline(time.Now().Add(120 * time.Second))
		sz := size + i
		io.WriteString(c, get(sz))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 || resp.ContentLength != int64(sz) {
			t.Fatalf("session %d: %v %v", i, err, resp)
		}
		h := sha256.New()
		if _, err := io.CopyN(h, br, first); err != nil {
			t.Fatalf("session %d: first bytes: %v", i, err)
		}
		ss[i] = &session{c: c, br: br, h: h, n: int64(sz), sum: func() [32]byte { return [32]byte(h.Sum(nil)) }}
	}
	if len(pinned()) != 2*sessions {
		t.Fatalf("%d pinned entries, want %d (2 per handed-off session)", len(pinned()), 2*sessions)
	}
	// Every surrogate leg is silent before the kill (the surrogate answered).
	deadline := time.Now().Add(30 * time.Second)
	for rr1.silent(t) != sessions {
		if time.Now().After(deadline) {
			t.Fatalf("surrogate legs not silent: %d of %d", rr1.silent(t), sessions)
		}
	}

	// SIGKILL: no Close, no unpinning; the sessions finish without a router.
	rr1.cmd.Process.Kill()
	rr1.cmd.Wait()
	for i, s := range ss {
		if _, err := io.CopyN(s.h, s.br, s.n-first); err != nil {
			t.Fatalf("session %d after the kill: %v", i, err)
		}
		if s.sum() != origin.Sum(uint64(s.n), s.n) {
			t.Fatalf("session %d: body differs after the kill", i)
		}
	}
	// Keep-alive: a further request on a handed-off connection, while no
	// router process runs, is answered by the surrogate.
	for i, s := range ss[:4] {
		io.WriteString(s.c, get(100000+i))
		readObject(t, s.br, 100000+i)
	}

	rr2 := startRRChild(t, w, args...)
	rr2.waitLine(t, fmt.Sprintf("ready adopted=%d", sessions))
	// The restarted router holds the surrogate legs' tuples again: a new
	// connection from such a local port is refused.
	for _, e := range pinned() {
		if e.In.Src.Addr().String() != w.Addr("sur").String() {
			continue
		}
		err := w.Do("rr", func() error {
			dl := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(e.In.Dst), Timeout: 5 * time.Second}
			nc, err := dl.Dial("tcp", e.In.Src.String())
			if err == nil {
				nc.Close()
			}
			return err
		})
		if !errors.Is(err, unix.EADDRINUSE) && !errors.Is(err, unix.EADDRNOTAVAIL) {
			t.Errorf("dial from the joined tuple %v after the restart: %v, want it taken", e.In, err)
		}
	}
	// The restarted router hands off a new session.
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	nc, err := w.Dial(dctx, "client", "tcp", rrAddr)
	dcancel()
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	io.WriteString(nc, get(300000))
	readObject(t, bufio.NewReader(nc), 300000)
	nc.Close()
	// Sessions end (FIN both ways): the restarted router removes their joins.
	for _, s := range ss {
		s.c.Close()
	}
	deadline = time.Now().Add(60 * time.Second)
	for len(pinned()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d pinned entries 60 s after every session ended", len(pinned()))
		}
		time.Sleep(50 * time.Millisecond) // polling the map
	}

	// Clean stop: no pin, no program left.
	rr2.stdin.Close()
	if err := rr2.cmd.Wait(); err != nil {
		t.Fatalf("restarted router: %v", err)
	}
	<-rr2.done
	if !strings.Contains(rr2.output(), "--- PASS: TestHandoffSurvivesKill") {
		t.Fatalf("restarted router did not pass:\n%s", rr2.output())
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir after a clean stop: %v, want removed", err)
	}
	w.Do("rr", func() error {
		ifs, err := net.Interfaces()
		for _, ifi := range ifs {
			q, err := link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: ebpf.AttachTCXIngress})
			if err == nil && len(q.Programs) != 0 {
				t.Errorf("%s: %d tcx programs attached after a clean stop", ifi.Name, len(q.Programs))
			}
		}
		return err
	})
}

// killChildBody is the router process: it hands sessions off (pinned
// translation) until its stdin closes (then stops cleanly) or it is
// killed. A line "silent" on stdin is answered with the number of
// surrogate legs held silent.
func killChildBody(t *testing.T, args []string) {
	listen, sur, pin := args[0], args[1], args[2]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := xlate.Open(ctx, xlate.Config{PinDir: pin, CloseLinger: 300 * time.Millisecond, SweepInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	j := &XlateJoiner{Splicer: sp}
	p, err := NewPicker(PickConfig{Surrogates: []Surrogate{{"sur", sur}}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Mode: ModeHandoff, Picker: p, Joiner: j, PoolSize: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	fmt.Printf("RRCHILD ready adopted=%d\n", sp.Stats().Adopted)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "silent" {
			fmt.Printf("RRCHILD silent=%d\n", j.Silent())
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Serve: %v", err)
	}
	j.Wait()
	if err := sp.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}
