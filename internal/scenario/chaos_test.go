package scenario_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/cli/clitest"
	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/scenario"
	"github.com/mosto-net/mosto/internal/testenv"
)

// chaosYAML is the chaos world: six FEPs on two continents, a client host
// (the flows' clients and the flooding stranger) and the origin host the
// scenario needs (unused).
const chaosYAML = `
name: chaos
dataset: wonderproxy
hosts:
  - {name: client, location: Dublin}
  - {name: origin, location: SanFrancisco}
  - {name: Dublin, location: Dublin}
  - {name: London, location: London}
  - {name: Frankfurt, location: Frankfurt}
  - {name: NewYork, location: NewYork}
  - {name: Chicago, location: Chicago}
  - {name: SanFrancisco, location: SanFrancisco}
`

const (
	chaosPairPort = 8300    // each FEP host's object server
	chaosSize     = 100_000 // bytes per flow
	chaosFlood    = 150     // hop connections the stranger opens at once
)

// chaosObject is the object the server of a FEP host sends for seed.
func chaosObject(seed uint64) []byte {
	var k [32]byte
	binary.LittleEndian.PutUint64(k[:], seed)
	b := make([]byte, chaosSize)
	rand.NewChaCha8(k).Read(b)
	return b
}

// serveObjects serves chaosObject(seed) for an 8-byte seed on ln.
func serveObjects(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			var s [8]byte
			if _, err := io.ReadFull(c, s[:]); err != nil {
				return
			}
			c.Write(chaosObject(binary.LittleEndian.Uint64(s[:])))
		}()
	}
}

// metric sums the samples of name whose labels contain label.
func metric(t *testing.T, ctx context.Context, hc *http.Client, url, name, label string) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || !strings.Contains(l, label) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// flowError is a flow that ended with an error after n bytes.
type flowError struct {
	n   int64
	err error
}

func (e *flowError) Error() string { return fmt.Sprintf("after %d B: %v", e.n, e.err) }

// stallWatch records the largest gap between 100 ms ticks of the test
// process, which hosts the emulated network: a gap of seconds is a world
// stall (every packet held up), to tell a loaded machine from a product
// fault when flows fail.
type stallWatch struct {
	mu   sync.Mutex
	max  time.Duration
	at   time.Time
	stop chan struct{}
	done chan struct{}
}

func watchStalls() *stallWatch {
	sw := &stallWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(sw.done)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		last := time.Now()
		for {
			select {
			case <-sw.stop:
				return
			case now := <-tk.C:
				if g := now.Sub(last); g > sw.max {
					sw.mu.Lock()
					sw.max, sw.at = g, last
					sw.mu.Unlock()
				}
				last = now
			}
		}
	}()
	return sw
}

// Close stops the watch and reports the largest gap and when it began.
func (sw *stallWatch) Close() (time.Duration, time.Time) {
	close(sw.stop)
	<-sw.done
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.max, sw.at
}

// TestChaosFlows is the emulator chaos test of the trust model: six FEPs
// following a real controller, a flow loop on every ordered pair (each
// object SHA-256 checked), and in turn a key rotation, a FEP deleted, a
// rogue token holder joining as an existing id, a FEP reporting a forged
// RTT and a hop-port flood from one address. Every legitimate flow must
// complete; each rogue action must be refused and show in the
// controller's or the relay's refusal counters.
func TestChaosFlows(t *testing.T) {
	testenv.RequirePrivileged(t)
	spec, err := emu.ParseSpec([]byte(chaosYAML))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second) // generous: a loaded 2-core CI machine
	defer cancel()
	w := emutest.Start(t, spec)
	sw := watchStalls()
	stallsClosed := false
	stalls := func() string {
		if stallsClosed {
			return ""
		}
		stallsClosed = true
		g, at := sw.Close()
		return fmt.Sprintf("largest stall of the test process (the emulator's host): %v at %s", g.Round(time.Millisecond), at.UTC().Format("15:04:05.000"))
	}
	defer stalls()
	mosto, mostoEnv := clitest.Mosto(t)
	dir := t.TempDir()
	if keep := os.Getenv("MOSTO_SCENARIO_DIR"); keep != "" {
		if dir, err = os.MkdirTemp(keep, t.Name()+"-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("scenario files and logs in %s", dir)
	}
	feps := []string{"Dublin", "London", "Frankfurt", "NewYork", "Chicago", "SanFrancisco"}
	for _, f := range feps {
		ln, err := w.Listen(ctx, f, "tcp", fmt.Sprintf("%s:%d", w.Addr(f), chaosPairPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go serveObjects(ln)
	}
	start := time.Now()
	sc, err := scenario.Start(ctx, w, scenario.Config{
		Roles: scenario.Roles{FEPs: feps, InP: "Dublin", EgP: "SanFrancisco"},
		Sizes: []int64{chaosSize}, Mosto: mosto, Env: mostoEnv, Dir: dir, PairPort: chaosPairPort,
		Controller: &scenario.ControllerConfig{
			ProbeInterval: 2 * time.Second, Coordinates: true,
			// Rotations during the run; signing switches once every LoP
			// has the next key (or after the fallback).
			Args: []string{"--key-rotation", "5s", "--key-switch-after", "4s"},
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	t.Logf("world, controller and 6 proxies up, converged in %v", time.Since(start).Round(time.Millisecond))

	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		return w.Dial(ctx, "client", network, a)
	}
	plain := &http.Client{Transport: &http.Transport{DialContext: dial}, Timeout: 10 * time.Second}
	admin := sc.API()
	ctlMetric := func(reason string) float64 {
		return metric(t, ctx, admin.HTTP, sc.ControllerURL()+api.PathMetrics, "mosto_controller_refused_total", `reason="`+reason+`"`)
	}

	// Flow loops on every ordered pair.
	type pairStat struct{ ok, failed int }
	// The deletion drains the FEP first (the controller publishes tables
	// whose chains avoid it, waits until every proxy holds them, then
	// deletes it): no flow set up on an older table through it is cut, so
	// every failure fails the test.
	var delAt, drainedAt, cleanAt time.Time
	var mu sync.Mutex
	stats := map[[2]string]*pairStat{}
	var bytes int64
	stop := map[[2]string]chan struct{}{}
	done := map[[2]string]chan struct{}{}
	var wg sync.WaitGroup
	var seq uint64
	flow := func(x, y string, seed uint64) error {
		fctx, fcancel := context.WithTimeout(ctx, 40*time.Second)
		defer fcancel()
		c, err := w.Dial(fctx, "client", "tcp", sc.PairService(x, y))
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := fctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		var s [8]byte
		binary.LittleEndian.PutUint64(s[:], seed)
		if _, err := c.Write(s[:]); err != nil {
			return err
		}
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err != nil {
			return &flowError{n, err}
		}
		if want := sha256.Sum256(chaosObject(seed)); string(h.Sum(nil)) != string(want[:]) {
			return fmt.Errorf("%d B, SHA-256 differs from the object's (%d B)", n, chaosSize)
		}
		return nil
	}
	for _, x := range feps {
		for _, y := range feps {
			if x == y {
				continue
			}
			p := [2]string{x, y}
			stopc, donec := make(chan struct{}), make(chan struct{})
			stats[p], stop[p], done[p] = &pairStat{}, stopc, donec
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(donec)
				for {
					select {
					case <-stopc:
						return
					case <-ctx.Done():
						return
					default:
					}
					mu.Lock()
					seq++
					seed := seq
					mu.Unlock()
					err := flow(x, y, seed)
					mu.Lock()
					if err != nil {
						stats[p].failed++
						if stats[p].failed <= 2 {
							t.Errorf("flow %s -> %s (%v after the deletion began): %v", x, y, time.Since(delAt).Round(time.Millisecond), err)
						}
					} else {
						stats[p].ok++
						bytes += chaosSize
					}
					mu.Unlock()
				}
			}()
		}
	}
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			for _, c := range stop {
				close(c)
			}
			wg.Wait()
		}
	}
	defer stopAll()
	// progress waits until every live pair completed two more flows (so at
	// least one started after the step).
	progress := func(what string, live func(p [2]string) bool) {
		t.Helper()
		mu.Lock()
		base := map[[2]string]int{}
		for p, s := range stats {
			base[p] = s.ok
		}
		mu.Unlock()
		testenv.WaitFor(t, 60*time.Second, "every pair's flows after "+what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for p, s := range stats {
				if live(p) && s.ok < base[p]+2 {
					return false
				}
			}
			return true
		})
	}
	all := func([2]string) bool { return true }
	since := func() time.Duration { return time.Since(start).Round(100 * time.Millisecond) }
	progress("start", all)
	t.Logf("flows on every pair (%v)", since())

	// 1. Key rotation: every proxy's table moves to a new signing key.
	keyID := func(f string) uint8 {
		tab, err := sc.ProxyTable(f)
		if err != nil || tab == nil || tab.Keys.Current == nil {
			return 0
		}
		return tab.Keys.Current.ID
	}
	first := map[string]uint8{}
	for _, f := range feps {
		first[f] = keyID(f)
	}
	testenv.WaitFor(t, 60*time.Second, "every proxy signing with a rotated key", func() bool {
		for _, f := range feps {
			if k := keyID(f); k == 0 || k == first[f] {
				return false
			}
		}
		return true
	})
	progress("the rotation", all)
	t.Logf("step 1 (%v): keys rotated (ids %v -> %d)", since(), first, keyID(feps[0]))

	// 2. A FEP is deleted: its flows end first; the others go on, and its
	// agent's requests are refused (revoked certificate).
	victim := "Frankfurt"
	involved := func(p [2]string) bool { return p[0] == victim || p[1] == victim }
	for p, c := range stop {
		if involved(p) {
			close(c)
			delete(stop, p)
		}
	}
	for p, c := range done {
		if involved(p) {
			<-c
		}
	}
	revoked0 := ctlMetric("revoked_cert")
	mu.Lock()
	delAt = time.Now()
	mu.Unlock()
	if err := admin.DeleteFEP(ctx, victim); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	drainedAt = time.Now()
	mu.Unlock()
	liveOnly := func(p [2]string) bool { return !involved(p) }
	testenv.WaitFor(t, 60*time.Second, "every live proxy's table without "+victim, func() bool {
		for _, f := range feps {
			if f == victim {
				continue
			}
			tab, err := sc.ProxyTable(f)
			if err != nil || tab == nil || tab.Members[victim] != "" {
				return false
			}
		}
		return true
	})
	mu.Lock()
	cleanAt = time.Now()
	mu.Unlock()
	testenv.WaitFor(t, 60*time.Second, "the deleted FEP's agent refused", func() bool { return ctlMetric("revoked_cert") > revoked0 })
	progress("the deletion", liveOnly)
	revoked := ctlMetric("revoked_cert") - revoked0
	t.Logf("step 2 (%v): %s drained in %v and deleted, every live proxy without it %v later, its agent's requests refused %v times",
		since(), victim, drainedAt.Sub(delAt).Round(time.Millisecond), cleanAt.Sub(drainedAt).Round(time.Millisecond), revoked)

	// 3. A token holder joins as an existing id.
	caPEM, err := os.ReadFile(filepath.Join(sc.AgentDir("London"), "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	key, _, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	joinRefused := 0
	for _, id := range []string{"London", "NewYork"} {
		csr, err := pki.NewCSR(key, id)
		if err != nil {
			t.Fatal(err)
		}
		jc := &api.Client{BaseURL: sc.ControllerURL(), HTTP: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}}}
		rogue := api.FEP{ID: id, HopAddr: w.Addr("client").String() + ":7000", ProbeAddr: w.Addr("client").String() + ":7001"}
		if _, err := jc.Join(ctx, api.JoinRequest{Token: sc.JoinToken(), FEP: rogue, CSRPEM: string(csr)}); err == nil {
			t.Errorf("a holder of the reusable token joined as the registered %s", id)
		} else {
			joinRefused++
		}
	}
	got, err := admin.FEPs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range got {
		if strings.HasPrefix(f.HopAddr, w.Addr("client").String()+":") {
			t.Errorf("the rogue join took over %s (hop_addr %s)", f.ID, f.HopAddr)
		}
	}
	progress("the rogue joins", liveOnly)
	t.Logf("step 3 (%v): %d rogue joins as existing ids refused", since(), joinRefused)

	// 4. A FEP reports forged RTTs: Dublin (its own certificate) claims
	// 0.1 ms to SanFrancisco and to Chicago.
	var pem [3][]byte
	for i, f := range []string{"ca.crt", "fep.crt", "fep.key"} {
		if pem[i], err = os.ReadFile(filepath.Join(sc.AgentDir("Dublin"), f)); err != nil {
			t.Fatal(err)
		}
	}
	tcfg, err := pki.ClientTLSConfig(pem[0], pem[1], pem[2])
	if err != nil {
		t.Fatal(err)
	}
	dub := &api.Client{BaseURL: sc.ControllerURL(), HTTP: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: dial, TLSClientConfig: tcfg}}}
	ftl0 := ctlMetric("faster_than_light")
	now := time.Now().UTC()
	res, err := dub.Report(ctx, api.Report{FEP: "Dublin", Samples: []api.Sample{
		{Peer: "SanFrancisco", RTTMS: 0.1, At: now}, {Peer: "Chicago", RTTMS: 0.1, At: now}}})
	if err != nil || res.Accepted != 0 || res.Refused != 2 {
		t.Errorf("forged 0.1 ms reports Dublin -> SanFrancisco, Chicago: %+v, %v; want both refused", res, err)
	}
	ftl := ctlMetric("faster_than_light") - ftl0
	if ftl < 2 {
		t.Errorf("controller counted %v faster-than-light refusals; want 2", ftl)
	}
	m, err := admin.Matrix(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("step 4 (%v): forged reports refused (%v counted); matrix has %d FEPs", since(), ftl, len(m.Names))
	progress("the forged reports", liveOnly)

	// 5. A hop-port flood from one address: the stranger holds chaosFlood
	// connections to London's hop port; past the per-source cap they are
	// refused while the flows (London's included) go on.
	target := "London"
	refusals := func(reason string) float64 {
		return metric(t, ctx, plain, "http://"+sc.MetricsAddr(target)+"/metrics", "mosto_relay_refusals_total", `reason="`+reason+`"`)
	}
	limit0, timeout0 := refusals("limit_source"), refusals("header_timeout")
	hopAddr := fmt.Sprintf("%s:7000", w.Addr(target))
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	resets := 0
	for range chaosFlood {
		c, err := w.Dial(ctx, "client", "tcp", hopAddr)
		if err != nil {
			// A refused connection may be reset before connect returns.
			if errors.Is(err, syscall.ECONNRESET) {
				resets++
				continue
			}
			t.Fatalf("flood connection: %v", err)
		}
		flood = append(flood, c)
	}
	// A flood connection under the cap that sends nothing ends at the
	// header timeout and frees its slot: on a loaded machine the dials
	// took longer than that, and as many more were admitted (a run: 77
	// refused, 73 timed out).
	released := refusals("header_timeout") - timeout0
	var limit float64
	testenv.WaitFor(t, 60*time.Second, "the flood refused past the per-source cap", func() bool {
		limit = refusals("limit_source") - limit0
		return limit >= chaosFlood-64-released
	})
	progress("the flood", liveOnly)
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	t.Logf("step 5 (%v): %d hop connections from one address, %v refused (limit_source; %d reset during connect)", since(), chaosFlood, limit, resets)

	stopAll()
	mu.Lock()
	defer mu.Unlock()
	flows, failed := 0, 0
	for p, s := range stats {
		flows += s.ok
		failed += s.failed
		if s.ok == 0 {
			t.Errorf("pair %s -> %s completed no flow", p[0], p[1])
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d flows failed", failed, flows+failed)
	}
	t.Log(stalls())
	t.Logf("chaos: %d pairs, %d flows (%d MB) SHA-256 checked, %d failed (none may be cut by the deletion: drain %v, then propagation %v), in %v; refused: %v revoked-cert requests, %d rogue joins, %v forged RTTs, %v flood connections",
		len(stats), flows, bytes/1_000_000, failed, drainedAt.Sub(delAt).Round(time.Millisecond), cleanAt.Sub(drainedAt).Round(time.Millisecond), time.Since(start).Round(time.Second), revoked, joinRefused, ftl, limit)
}
