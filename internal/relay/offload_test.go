package relay

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
)

const offloadChild = "MOSTO_RELAY_OFFLOAD_CHILD"

// TestOffloadService relays service flows between namespaces (client --
// relay -- origin over veths) with offload after 1 MB, on goroutines and on
// the event loops. An upload (the origin answers the SHA-256 of what it
// received) must leave the relay (outcome offloaded, entries joined) with
// every byte intact. A full-duplex echo that keeps both directions busy may
// never reach the handover's quiescent point: it must come back intact
// whether it was offloaded or stayed relayed after a refused handover (a
// blocking write in the handover once deadlocked such a flow until it was
// reset). The relay runs in a child process inside the relay namespace, so
// that every socket it dials is there.
func TestOffloadService(t *testing.T) {
	if offloadChildTest(t, offloadChild, offloadChildBody) {
		return
	}
	for _, loops := range []string{"-1", "0"} {
		for _, flow := range []string{"upload", "echo"} {
			t.Run("loops="+loops+"/"+flow, func(t *testing.T) {
				offloadServiceChild(t, loops, flow)
			})
		}
	}
	t.Run("loops=0/loop-first", func(t *testing.T) { offloadServiceChild(t, "0", "loop-first") })
}

// loopFirstFlows runs n echo flows at once, each first in small exchanges
// (8 KB, each waiting for its echo: the event loop relays them) past
// offload.after_bytes, then in bulk (the loop hands the flow to the
// goroutine path, which splices, and the offload watcher finds the flow due
// at once). Every flow must come back intact, offloaded or not: a pause that
// landed before the goroutine path's first read used to reset the flow
// (the emulator's Fig. 4 chain with offload lost fetches that way).
func loopFirstFlows(t *testing.T, r *running, p1, relayAddr string, n int) {
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { errs <- loopFirstFlow(t, p1, relayAddr) }()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d flows intact; handovers %+v; outcomes: offloaded %v, ok %v, reset %v", n, r.offload.Load().stats(),
		flows(r.Server, roleInP, outcomeOffloaded), flows(r.Server, roleInP, outcomeOK), flows(r.Server, roleInP, outcomeReset))
}

func loopFirstFlow(t *testing.T, p1, relayAddr string) error {
	var c *net.TCPConn
	if err := xlatetest.In(t, p1, func() error {
		nc, err := net.DialTimeout("tcp", net.JoinHostPort(relayAddr, "8080"), 10*time.Second)
		if err == nil {
			c = nc.(*net.TCPConn)
		}
		return err
	}); err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	msg, back := make([]byte, 8<<10), make([]byte, 8<<10)
	for sent := 0; sent < 5<<18; sent += len(msg) { // 1.25 MiB > after_bytes
		rand.Read(msg)
		if _, err := c.Write(msg); err != nil {
			return fmt.Errorf("small exchanges, after %d bytes: write: %w", sent, err)
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return fmt.Errorf("small exchanges, after %d bytes: read: %w", sent, err)
		}
		if !bytes.Equal(msg, back) {
			return fmt.Errorf("small exchanges, after %d bytes: the echo differs", sent)
		}
	}
	got := make(chan [32]byte, 1)
	var rerr error
	go func() {
		h := sha256.New()
		_, rerr = io.Copy(h, c)
		got <- [32]byte(h.Sum(nil))
	}()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(c, h), io.LimitReader(rand.Reader, 8<<20)); err != nil {
		return fmt.Errorf("bulk: send: %w", err)
	}
	c.CloseWrite()
	if sum := <-got; sum != [32]byte(h.Sum(nil)) {
		return fmt.Errorf("bulk: the echo differs (read error %v)", rerr)
	}
	return nil
}

func offloadServiceChild(t *testing.T, loops, flow string) {
	runOffloadChild(t, "TestOffloadService", loops, flow)
}

// runOffloadChild runs test name in a child process inside the relay
// namespace of a new line, with args after the line's.
func runOffloadChild(t *testing.T, name string, args ...string) {
	l := xlatetest.NewLine(t, false)
	cmd := exec.CommandContext(t.Context(), "ip", "netns", "exec", l.R, os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), offloadChild+"="+strings.Join(append([]string{l.P1, l.P2, l.RAddr1, l.P2Addr}, args...), ","))
	out, err := cmd.CombinedOutput()
	t.Logf("relay child:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatal("child did not pass")
	}
}

// offloadChildTest skips t where xlate is not supported. In the relay
// child process (env set) it runs body with the child's arguments and
// returns true; else it requires privileges and returns false.
func offloadChildTest(t *testing.T, env string, body func(*testing.T, []string)) bool {
	t.Helper()
	if !xlate.Supported {
		testenv.Unmet(t, "xlate not supported on this OS")
	}
	if v := os.Getenv(env); v != "" {
		body(t, strings.Split(v, ","))
		return true
	}
	testenv.RequirePrivileged(t)
	return false
}

// offloadOrigin listens on addr:80 in namespace ns and runs handle on its
// own goroutine for every connection until the caller closes the listener.
func offloadOrigin(t *testing.T, ns, addr string, handle func(*net.TCPConn)) net.Listener {
	t.Helper()
	var ln net.Listener
	xlatetest.MustIn(t, ns, func() (err error) { ln, err = net.Listen("tcp", net.JoinHostPort(addr, "80")); return })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c.(*net.TCPConn))
		}
	}()
	return ln
}

// digestAll answers the SHA-256 of all c sent, then half-closes: an
// upload's origin.
func digestAll(c *net.TCPConn) {
	defer c.Close()
	h := sha256.New()
	if _, err := io.Copy(h, c); err == nil {
		c.Write(h.Sum(nil))
	}
	c.CloseWrite()
}

// offloadConfig is relay a serving service svc on relayAddr:8080 to
// originAddr:80, offloading as o says.
func offloadConfig(relayAddr, originAddr string, o OffloadConfig) *Config {
	cfg := baseConfig("a")
	cfg.Destinations.Allow = []string{"10.71.0.0/16"}
	cfg.Services = []ServiceConfig{{Name: "svc", Listen: net.JoinHostPort(relayAddr, "8080"), Origin: net.JoinHostPort(originAddr, "80")}}
	cfg.Offload = o
	return cfg
}

// dialService connects to the service on relayAddr:8080 from namespace ns.
func dialService(t *testing.T, ns, relayAddr string) *net.TCPConn {
	t.Helper()
	var c *net.TCPConn
	xlatetest.MustIn(t, ns, func() error {
		nc, err := net.DialTimeout("tcp", net.JoinHostPort(relayAddr, "8080"), 5*time.Second)
		if err == nil {
			c = nc.(*net.TCPConn)
		}
		return err
	})
	return c
}

// TestOffloadRetry: refused handovers are retried with a backoff, a
// bounded number of times. The relay may join one flow at a time
// (max_flows 1). Flow A is offloaded and stays open; flow B1's handovers
// are refused (map-full) exactly `attempts` times, then B1 stays relayed
// and intact. Flow B2 is refused once; A then ends, its entries go after
// the linger, and a retry offloads B2, whose later bytes go through the
// kernel intact.
func TestOffloadRetry(t *testing.T) {
	if offloadChildTest(t, offloadChild, offloadRetryBody) {
		return
	}
	runOffloadChild(t, "TestOffloadRetry")
}

// uploader is one client flow of an upload service whose origin answers
// the SHA-256 of what it received.
type uploader struct {
	c *net.TCPConn
	h hash.Hash
}

func (u *uploader) send(t *testing.T, n int64) {
	t.Helper()
	if _, err := io.Copy(io.MultiWriter(u.c, u.h), io.LimitReader(rand.Reader, n)); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// finish ends the upload and checks the origin's digest.
func (u *uploader) finish(t *testing.T, name string) {
	t.Helper()
	u.c.CloseWrite()
	got, err := io.ReadAll(u.c)
	if err != nil {
		t.Fatalf("%s: read the digest: %v", name, err)
	}
	if want := u.h.Sum(nil); !bytes.Equal(got, want) {
		t.Fatalf("%s: the origin got other bytes (digest %x, want %x)", name, got, want)
	}
	u.c.Close()
}

func offloadRetryBody(t *testing.T, args []string) {
	p1, p2, relayAddr, originAddr := args[0], args[1], args[2], args[3]
	defer offloadOrigin(t, p2, originAddr, digestAll).Close()
	const attempts = 6
	cfg := offloadConfig(relayAddr, originAddr, OffloadConfig{Mode: OffloadBytes, AfterBytes: 1 << 20, MaxFlows: 1, Attempts: attempts,
		RetryBackoff: Duration(200 * time.Millisecond), Linger: Duration(100 * time.Millisecond)})
	cfg.Loops = -1
	r := start(t, cfg)
	testenv.WaitFor(t, 10*time.Second, "offload ready", func() bool { return r.offloadReady() })
	o := r.offload.Load()
	dial := func() *uploader {
		c := dialService(t, p1, relayAddr)
		c.SetDeadline(time.Now().Add(2 * time.Minute))
		return &uploader{c: c, h: sha256.New()}
	}
	refusedFull := func() uint64 { return o.sp.Stats().Refused[xlate.ReasonMapFull] }
	waitFor := func(d time.Duration, what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %v waiting for %s; handovers %+v, refused %v, flows offloaded %v ok %v",
					d, what, o.stats(), o.sp.Stats().Refused, flows(r.Server, roleInP, outcomeOffloaded), flows(r.Server, roleInP, outcomeOK))
			}
		}
	}

	// A: offloaded, left open (idle).
	a := dial()
	a.send(t, 2<<20)
	waitFor(30*time.Second, "flow A joined", func() bool { return o.stats().Joined == 1 })

	// B1: every handover meets a full map; after `attempts` the relay
	// gives up and B1 stays relayed.
	b1 := dial()
	b1.send(t, 2<<20)
	waitFor(60*time.Second, "B1 given up", func() bool { return o.stats().Final == 1 })
	st := o.stats()
	if st.Tried != 1+attempts || st.Refused != attempts || st.Retried != attempts-1 || refusedFull() != attempts {
		t.Fatalf("after B1 gave up: %+v, map-full refusals %d; want %d refused (map-full), %d retried, 1 final",
			st, refusedFull(), attempts, attempts-1)
	}
	b1.send(t, 1<<20)
	b1.finish(t, "B1")
	waitFor(10*time.Second, "B1 ended relayed", func() bool { return flows(r.Server, roleInP, outcomeOK) == 1 })
	if st := o.stats(); st.Tried != 1+attempts {
		t.Fatalf("handovers after B1 gave up: %+v, want no more tries", st)
	}

	// B2: refused once while A holds the map; A ends; a retry joins B2.
	b2 := dial()
	b2.send(t, 2<<20)
	// (>=: a loaded test may look only after B2's next retry)
	waitFor(60*time.Second, "B2 refused", func() bool { return refusedFull() >= attempts+1 })
	a.finish(t, "A")
	waitFor(60*time.Second, "B2 joined by a retry", func() bool { return o.stats().Joined == 2 })
	b2.send(t, 4<<20) // through the kernel
	b2.finish(t, "B2")
	waitFor(10*time.Second, "A and B2 offloaded", func() bool { return flows(r.Server, roleInP, outcomeOffloaded) == 2 })
	st = o.stats()
	if st.Final != 1 || st.Retried < attempts {
		t.Errorf("final stats %+v: want B2 joined by a retry and only B1 final", st)
	}
	got := map[string]float64{}
	for _, mf := range r.Registry().Gather() {
		if m := mf.Series; len(m) == 1 {
			got[mf.Name] = m[0].Value
		}
	}
	for name, want := range map[string]uint64{"mosto_relay_offload_handovers_total": st.Tried, "mosto_relay_offload_joined_total": 2,
		"mosto_relay_offload_refused_total": st.Refused, "mosto_relay_offload_retries_total": st.Retried} {
		if got[name] != float64(want) {
			t.Errorf("metric %s = %v, want %d", name, got[name], want)
		}
	}
	t.Logf("handovers %+v; B2 joined after %d map-full refusals", st, refusedFull()-attempts)
}

func offloadChildBody(t *testing.T, args []string) {
	p1, p2, relayAddr, originAddr, loops, flow := args[0], args[1], args[2], args[3], args[4], args[5]
	handle := testenv.Echo
	if flow == "upload" {
		handle = digestAll // answer the digest of what came
	}
	defer offloadOrigin(t, p2, originAddr, handle).Close()
	cfg := offloadConfig(relayAddr, originAddr, OffloadConfig{Mode: OffloadBytes, AfterBytes: 1 << 20})
	if loops == "-1" {
		cfg.Loops = -1
	}
	r := start(t, cfg)
	testenv.WaitFor(t, 10*time.Second, "offload ready", func() bool { return r.offloadReady() })
	if flow == "loop-first" {
		loopFirstFlows(t, r, p1, relayAddr, 4)
		return
	}

	c := dialService(t, p1, relayAddr)
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	const n = 24 << 20
	got := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		io.Copy(h, c)
		got <- [32]byte(h.Sum(nil))
	}()
	// Send until the relay has joined the flow, then 4 MiB more: a fixed
	// size could end before the handover reached its quiescent point (the
	// flow then ends relayed, correctly, but the test saw no offload).
	h := sha256.New()
	joined := func() bool { return r.offload.Load().sp.Stats().Joined > 0 }
	var sent int64
	for sent < n || (flow == "upload" && !joined()) {
		if sent > 1<<30 {
			t.Fatalf("no join after %d bytes", sent)
		}
		if _, err := io.Copy(io.MultiWriter(c, h), io.LimitReader(rand.Reader, 1<<20)); err != nil {
			t.Fatalf("send: %v", err)
		}
		sent += 1 << 20
	}
	if _, err := io.Copy(io.MultiWriter(c, h), io.LimitReader(rand.Reader, 4<<20)); err != nil {
		t.Fatalf("send: %v", err)
	}
	c.CloseWrite()
	want := [32]byte(h.Sum(nil))
	if flow == "upload" {
		want = sha256.Sum256(want[:]) // the digest of the origin's 32-byte answer
	}
	if <-got != want {
		t.Fatalf("%s: bytes differ", flow)
	}
	if flow == "echo" {
		t.Logf("echo intact; joins %d", r.offload.Load().sp.Stats().Joined)
		return
	}
	testenv.WaitFor(t, 10*time.Second, "the flow offloaded", func() bool { return flows(r.Server, roleInP, outcomeOffloaded) == 1 })
	st := r.offload.Load().sp.Stats()
	if st.Joined != 1 || st.Bytes == 0 {
		t.Errorf("splicer stats %+v: want 1 join and translated bytes", st)
	}
	t.Logf("offloaded: %d bytes translated by the program", st.Bytes)
}

// TestXlatePreDrain: the frozen handover pre-drains the relay's backlog
// by default (session 15); -1 turns it off; the drain handover has none.
func TestXlatePreDrain(t *testing.T) {
	for _, c := range []struct {
		cfg OffloadConfig
		pre float64
	}{
		{OffloadConfig{}, xlate.DefaultPreDrain},
		{OffloadConfig{PreDrain: 1.5}, 1.5},
		{OffloadConfig{PreDrain: -1}, 0},
		{OffloadConfig{Handover: HandoverDrain, PreDrain: 1.5}, 0},
	} {
		if p := c.cfg.XlatePreDrain(); p != c.pre {
			t.Errorf("%+v: XlatePreDrain() = %v; want %v", c.cfg, p, c.pre)
		}
	}
}

func TestOffloadConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg OffloadConfig
		ok  bool
	}{
		{OffloadConfig{}, true},
		{OffloadConfig{Mode: "off"}, true},
		{OffloadConfig{Mode: "slow-start"}, true},
		{OffloadConfig{Mode: "slow-start", AfterBytes: 5 << 20}, true},
		{OffloadConfig{Mode: "bytes", AfterBytes: 1}, true},
		{OffloadConfig{Mode: "bytes"}, false},
		{OffloadConfig{Mode: "always"}, false},
		{OffloadConfig{Mode: "slow-start", MaxFlows: -1}, false},
		{OffloadConfig{Mode: "slow-start", PinDir: "off"}, true},
		{OffloadConfig{Mode: "slow-start", PinDir: "/sys/fs/bpf/x"}, true},
		{OffloadConfig{Mode: "slow-start", PinDir: "relative/dir"}, false},
		{OffloadConfig{Mode: "slow-start", Linger: -1}, false},
		{OffloadConfig{Mode: "slow-start", Handover: "frozen"}, true},
		{OffloadConfig{Mode: "slow-start", Handover: "drain"}, true},
		{OffloadConfig{Mode: "slow-start", Handover: "fast"}, false},
		{OffloadConfig{Mode: "slow-start", DrainPace: -1}, true},
		{OffloadConfig{Mode: "slow-start", DrainPace: 0.9}, true},
		{OffloadConfig{Mode: "slow-start", DrainPace: 1.5}, false},
		{OffloadConfig{Mode: "slow-start", DrainPace: -0.5}, false},
		{OffloadConfig{Mode: "slow-start", PreDrain: -1}, true},
		{OffloadConfig{Mode: "slow-start", PreDrain: 2}, true},
		{OffloadConfig{Mode: "slow-start", PreDrain: -0.5}, false},
		{OffloadConfig{Mode: "slow-start", PreDrain: math.NaN()}, false},
		{OffloadConfig{Mode: "slow-start", PreDrain: math.Inf(1)}, false},
		{OffloadConfig{Mode: "slow-start", DrainPace: math.NaN()}, false},
	} {
		if err := c.cfg.validate(); (err == nil) != c.ok {
			t.Errorf("validate(%+v) = %v, want ok %v", c.cfg, err, c.ok)
		}
	}
	cfg := baseConfig("a")
	cfg.Offload.Mode = "bogus"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "offload.mode") {
		t.Errorf("Config.Validate with a bad offload mode = %v", err)
	}
}

// TestKeepSplit: the loss rule keeps a flow split when a joined connection
// could not sustain the relayed rate (Mathis estimate over the end-to-end
// RTT with the legs' loss summed), and offloads it otherwise.
func TestKeepSplit(t *testing.T) {
	leg := func(rtt time.Duration, segs, retr uint32, mbit float64) ccSample {
		return ccSample{rtt: rtt, mss: 1448, dataSegsOut: segs, totalRetrans: retr, deliveryRate: uint64(mbit * 1e6 / 8)}
	}
	for _, c := range []struct {
		name string
		legs [2]ccSample
		keep bool
	}{
		{"no loss", [2]ccSample{leg(25*time.Millisecond, 100000, 0, 200), leg(25*time.Millisecond, 1000, 0, 0)}, false},
		// 1% on the sending leg: a joined flow at 50 ms sustains ~2.8 Mbit/s.
		{"1% loss, 200 Mbit/s relayed", [2]ccSample{leg(25*time.Millisecond, 100000, 1000, 200), leg(25*time.Millisecond, 1000, 0, 0)}, true},
		// 0.01% at 10 Mbit/s: the estimate (~28 Mbit/s) is above the rate.
		{"0.01% loss, 10 Mbit/s relayed", [2]ccSample{leg(25*time.Millisecond, 100000, 10, 10), leg(25*time.Millisecond, 1000, 0, 0)}, false},
		// Loss on both legs adds up.
		{"0.05% each way, 20 Mbit/s", [2]ccSample{leg(25*time.Millisecond, 100000, 50, 20), leg(25*time.Millisecond, 100000, 50, 20)}, true},
		// Too few segments to say anything.
		{"50 segments", [2]ccSample{leg(25*time.Millisecond, 50, 10, 200), leg(25*time.Millisecond, 10, 0, 0)}, false},
	} {
		keep, est, rate := keepSplit(c.legs)
		if keep != c.keep {
			t.Errorf("%s: keepSplit = %v (joined estimate %.1f Mbit/s, relayed %.1f), want %v", c.name, keep, est/1e6, rate/1e6, c.keep)
		}
	}
}
