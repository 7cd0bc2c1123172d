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
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
)

const killChildEnv = "MOSTO_ROUTER_KILL_CHILD"

// startRRChild starts a router process (this test binary) on host rr of
// w; it prints its lines behind "RRCHILD".
func startRRChild(t *testing.T, w *emu.World, args ...string) *testenv.Child {
	t.Helper()
	cmd := w.Command(context.Background(), "rr", os.Args[0], "-test.run=^TestHandoffSurvivesKill$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+strings.Join(args, ","))
	return testenv.StartChild(t, cmd, "router child", "RRCHILD", 60*time.Second)
}

// silent asks router child c how many surrogate legs it holds silent.
func silent(t *testing.T, c *testenv.Child) int {
	t.Helper()
	io.WriteString(c.Stdin, "silent\n")
	n, _ := strconv.Atoi(strings.TrimPrefix(c.WaitLine(t, "silent="), "silent="))
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

	pin := filepath.Join(xlatetest.BPFFS(t), "mosto", "router")
	args := []string{rrAddr, surAddr, pin}
	pinned := func() []xlate.PinnedEntry {
		es, err := xlate.ReadPinned(pin)
		if err != nil {
			t.Fatalf("read pins: %v", err)
		}
		return es
	}

	rr1 := startRRChild(t, w, args...)
	rr1.WaitLine(t, "ready adopted=0")

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
	for silent(t, rr1) != sessions {
		if time.Now().After(deadline) {
			t.Fatalf("surrogate legs not silent: %d of %d", silent(t, rr1), sessions)
		}
	}

	// SIGKILL: no Close, no unpinning; the sessions finish without a router.
	rr1.Kill()
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
	rr2.WaitLine(t, fmt.Sprintf("ready adopted=%d", sessions))
	// The restarted router holds the surrogate legs' tuples again: a new
	// connection from such a local port is refused.
	for _, e := range pinned() {
		if e.In.Src.Addr().String() != w.Addr("sur").String() {
			continue
		}
		xlatetest.CheckTaken(t, w.NetNS("rr"), e.In.Dst, e.In.Src)
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
	rr2.Stop(t, "TestHandoffSurvivesKill")
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir after a clean stop: %v, want removed", err)
	}
	xlatetest.CheckNoTCX(t, w.NetNS("rr"), "after a clean stop")
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
