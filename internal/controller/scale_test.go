package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store/boltstore"
)

// TestScale simulates MOSTO_SCALE_FEPS FEPs (default 1000; 40 without
// MOSTO_SCALE) in one process against a controller on loopback HTTP: they
// register, fetch their targets and report RTTs; then every FEP long-polls
// its table while one more FEP
// joins (which changes every table). It logs the recomputation time, the
// time for new tables to reach every LoP and the process RSS. With
// MOSTO_SCALE_PROC=1, MOSTO_SCALE_MAXPROXIES sets the controller's
// Config.MaxProxies (-1: unlimited). Run it with
//
//	MOSTO_SCALE=1 go test -run TestScale -v ./internal/controller/
func TestScale(t *testing.T) {
	n := 1000
	if os.Getenv("MOSTO_SCALE") == "" {
		// Without MOSTO_SCALE the same rounds run with 40 FEPs (about
		// 5 s under -race): their behaviour is checked in every run,
		// the figures need MOSTO_SCALE=1.
		if testing.Short() {
			t.Skip("set MOSTO_SCALE=1 to run the scale figures")
		}
		n = 40
	}
	if v, err := strconv.Atoi(os.Getenv("MOSTO_SCALE_FEPS")); err == nil && v > 1 {
		n = v
	}
	// Computations run only when the test triggers them, so that each
	// figure is one complete computation. With MOSTO_SCALE_PROC=1 the
	// controller runs in a child process, so its RSS is its own.
	var (
		baseURL string
		trigger func() (uint64, time.Duration)
		ctlRSS  func() string
	)
	if os.Getenv("MOSTO_SCALE_PROC") != "" {
		baseURL, trigger, ctlRSS = startChild(t)
	} else {
		st := openBolt(t)
		c, err := New(Config{Store: st, Debounce: time.Hour, Period: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		c.computed = make(chan uint64, 16)
		run(t, c)
		srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: c}))
		t.Cleanup(srv.Close)
		baseURL = srv.URL
		trigger = func() (uint64, time.Duration) {
			c.Trigger()
			v := <-c.computed
			return v, c.LastCompute()
		}
		ctlRSS = func() string { return rss("self") + " (controller and the simulated FEPs)" }
	}
	tr := &http.Transport{MaxIdleConns: 2 * n, MaxIdleConnsPerHost: 2 * n, MaxConnsPerHost: 0}
	t.Cleanup(tr.CloseIdleConnections)
	cl := &api.Client{BaseURL: baseURL, HTTP: &http.Client{Transport: tr}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	rng := rand.New(rand.NewPCG(1, 2))
	feps := make([]api.FEP, n+1)
	for i := range feps {
		id := fmt.Sprintf("fep%04d", i)
		feps[i] = api.FEP{ID: id, HopAddr: fmt.Sprintf("10.%d.%d.1:7000", i/250, i%250), ProbeAddr: fmt.Sprintf("10.%d.%d.1:7001", i/250, i%250),
			Lat: rng.Float64()*140 - 60, Lon: rng.Float64()*360 - 180}
	}
	parallel := func(k int, fn func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, k)
		sem := make(chan struct{}, 64)
		for i := 0; i < k; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				if err := fn(i); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}

	start := time.Now()
	parallel(n, func(i int) error { return cl.RegisterFEP(ctx, feps[i]) })
	tReg := time.Since(start)

	// Each FEP measures its targets: a synthetic RTT from the distance
	// (1.3x the light-in-fibre round trip, plus 2 ms and up to 10% noise).
	start = time.Now()
	samples := 0
	var mu sync.Mutex
	parallel(n, func(i int) error {
		ts, err := cl.Targets(ctx, feps[i].ID)
		if err != nil {
			return err
		}
		r := rand.New(rand.NewPCG(uint64(i), 7))
		rep := api.Report{FEP: feps[i].ID}
		for _, tg := range ts {
			var j int
			fmt.Sscanf(tg.ID, "fep%d", &j)
			d := DistanceKm(feps[i].Lat, feps[i].Lon, feps[j].Lat, feps[j].Lon)
			rep.Samples = append(rep.Samples, api.Sample{Peer: tg.ID, RTTMS: (2 + 1.3*d/100) * (1 + 0.1*r.Float64())})
		}
		mu.Lock()
		samples += len(rep.Samples)
		mu.Unlock()
		_, err = cl.Report(ctx, rep)
		return err
	})
	tRep := time.Since(start)

	// One computation over every report.
	v, tCompute := trigger()

	// Every FEP long-polls from the current version; one more FEP joins.
	// The simulated LoPs read the gzip body without decoding it: decoding
	// is each real LoP's own work, not the controller's.
	rawTr := &http.Transport{MaxIdleConns: 2 * n, MaxIdleConnsPerHost: 2 * n, DisableCompression: true}
	t.Cleanup(rawTr.CloseIdleConnections)
	raw := &http.Client{Transport: rawTr}
	got := make([]time.Time, n)
	var bytesIn atomic.Int64
	var wg sync.WaitGroup
	ready := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ready <- struct{}{}
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/tables/%s?since=%d&wait=120s", baseURL, feps[i].ID, v), nil)
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := raw.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			nb, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			bytesIn.Add(nb)
			ver, _ := strconv.ParseUint(resp.Header.Get(api.VersionHeader), 10, 64)
			if resp.StatusCode != 200 || ver <= v {
				t.Errorf("lop %s: status %d version %d; want 200 and > %d", feps[i].ID, resp.StatusCode, ver, v)
				return
			}
			got[i] = time.Now()
		}()
	}
	for i := 0; i < n; i++ {
		<-ready
	}
	time.Sleep(500 * time.Millisecond) // let the polls reach the server
	t0 := time.Now()
	if err := cl.RegisterFEP(ctx, feps[n]); err != nil {
		t.Fatal(err)
	}
	_, tJoinCompute := trigger()
	wg.Wait()
	last := t0
	for _, g := range got {
		if g.After(last) {
			last = g
		}
	}
	tab, err := cl.Table(ctx, feps[0].ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(tab.Table.Locations, feps[n].ID) {
		t.Errorf("table of %s does not name the FEP that joined", feps[0].ID)
	}
	t.Logf("scale: %d FEPs, %d RTT samples (%d per FEP)", n, samples, samples/n)
	t.Logf("register %d FEPs: %s; targets + reports: %s", n, tReg.Round(time.Millisecond), tRep.Round(time.Millisecond))
	t.Logf("recomputation (matrix, chains, %d tables, store): %s", n, tCompute.Round(time.Millisecond))
	t.Logf("join of FEP %d: recomputation %s; join -> last of %d LoPs has its new table %s (distribution after the computation: %s)",
		n+1, tJoinCompute.Round(time.Millisecond), n, last.Sub(t0).Round(time.Millisecond), max(0, last.Sub(t0)-tJoinCompute).Round(time.Millisecond))
	t.Logf("%d MB of gzip tables sent in the join round (%d kB per LoP)", bytesIn.Load()>>20, bytesIn.Load()>>10/int64(n))
	t.Logf("RSS %s", ctlRSS())
}

// startChild runs TestScaleChild in a child process (the test binary) and
// returns its URL, a trigger and its RSS.
func startChild(t *testing.T) (string, func() (uint64, time.Duration), func() string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestScaleChild$", "-test.timeout=0")
	cmd.Env = append(os.Environ(), "MOSTO_SCALE_CHILD="+addr, "MOSTO_SCALE_CHILD_DIR="+t.TempDir())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base := "http://" + addr
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("child controller not serving within 30s")
		}
	}
	trigger := func() (uint64, time.Duration) {
		resp, err := http.Get(base + "/test/trigger")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Version uint64
			Nanos   int64
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r.Version, time.Duration(r.Nanos)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	return base, trigger, func() string { return rss(pid) + " (controller process alone)" }
}

// TestScaleChild is the controller process of TestScale with
// MOSTO_SCALE_PROC=1; it serves until killed.
func TestScaleChild(t *testing.T) {
	addr := os.Getenv("MOSTO_SCALE_CHILD")
	if addr == "" {
		t.Skip("only run as TestScale's child process")
	}
	st, err := boltstore.Open(filepath.Join(os.Getenv("MOSTO_SCALE_CHILD_DIR"), "mosto.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mp, _ := strconv.Atoi(os.Getenv("MOSTO_SCALE_MAXPROXIES"))
	c, err := New(Config{Store: st, Debounce: time.Hour, Period: time.Hour, MaxProxies: mp})
	if err != nil {
		t.Fatal(err)
	}
	c.computed = make(chan uint64, 16)
	go c.Run(context.Background())
	mux := http.NewServeMux()
	mux.Handle("/", api.NewHandler(api.ServerConfig{Backend: c}))
	mux.HandleFunc("/test/trigger", func(w http.ResponseWriter, r *http.Request) {
		c.Trigger()
		v := <-c.computed
		json.NewEncoder(w).Encode(struct {
			Version uint64
			Nanos   int64
		}{v, int64(c.LastCompute())})
	})
	t.Fatal(http.ListenAndServe(addr, mux))
}

func mustTable(t *testing.T, c *Controller, lop string) *api.EncodedTable {
	et, err := c.WaitTable(testCtx(t), lop, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	return et
}

// rss returns VmRSS and VmHWM (peak) of /proc/<pid>/status.
func rss(pid string) string {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return "unknown"
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "VmRSS:" || f[0] == "VmHWM:" || f[0] == "RssAnon:" || f[0] == "RssFile:") {
			kb, _ := strconv.Atoi(f[1])
			out = append(out, fmt.Sprintf("%s %d MB", strings.TrimSuffix(f[0], ":"), int(math.Round(float64(kb)/1024))))
		}
	}
	return strings.Join(out, ", ")
}

// cpuTime returns the user+system CPU time of the process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
