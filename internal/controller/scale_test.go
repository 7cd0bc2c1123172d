package controller

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

// TestScale simulates MOSTO_SCALE_FEPS FEPs (default 1000) in one process
// against a controller on loopback HTTP: they register, fetch their targets
// and report RTTs; then every FEP long-polls its table while one more FEP
// joins (which changes every table). It logs the recomputation time, the
// time for new tables to reach every LoP and the process RSS. Run it with
//
//	MOSTO_SCALE=1 go test -run TestScale -v ./internal/controller/
func TestScale(t *testing.T) {
	if os.Getenv("MOSTO_SCALE") == "" {
		t.Skip("set MOSTO_SCALE=1 to run the scale figures")
	}
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("MOSTO_SCALE_FEPS")); err == nil && v > 1 {
		n = v
	}
	st := openBolt(t)
	c, err := New(Config{Store: st, Debounce: 200 * time.Millisecond, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.computed = make(chan uint64, 16)
	run(t, c)
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: c}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConns: 2 * n, MaxIdleConnsPerHost: 2 * n, MaxConnsPerHost: 0}
	t.Cleanup(tr.CloseIdleConnections)
	cl := &api.Client{BaseURL: srv.URL, HTTP: &http.Client{Transport: tr}}
	ctx := testCtx(t)
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

	// Wait for the computation over every report to settle.
	var v uint64
	for settled := false; !settled; {
		select {
		case v = <-c.computed:
		case <-time.After(3 * time.Second):
			settled = v != 0
		case <-ctx.Done():
			t.Fatal("no computation")
		}
	}
	tCompute := c.LastCompute()

	// Every FEP long-polls from the current version; one more FEP joins.
	got := make([]time.Time, n)
	var wg sync.WaitGroup
	ready := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ready <- struct{}{}
			since := v
			for {
				tab, err := cl.Table(ctx, feps[i].ID, since, 60*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if tab != nil && slices.Contains(tab.Table.Locations, feps[n].ID) {
					got[i] = time.Now()
					return
				}
				if tab != nil {
					since = tab.Version
				}
			}
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
	var published time.Time
	select {
	case <-c.computed:
		published = time.Now()
	case <-ctx.Done():
		t.Fatal("no computation after the join")
	}
	tJoinCompute := c.LastCompute()
	wg.Wait()
	last := t0
	for _, g := range got {
		if g.After(last) {
			last = g
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var sizes []int
	for i := 0; i < n; i++ {
		et, err := c.WaitTable(ctx, feps[i].ID, 0)
		if err == nil {
			sizes = append(sizes, len(et.Gzip()))
		}
	}
	slices.Sort(sizes)
	plain := len(mustTable(t, c, feps[0].ID).JSON())
	t.Logf("scale: %d FEPs, %d RTT samples (%d per FEP)", n, samples, samples/n)
	t.Logf("register %d FEPs: %s; targets + reports: %s", n, tReg.Round(time.Millisecond), tRep.Round(time.Millisecond))
	t.Logf("recomputation (matrix, chains, %d tables, store): %s", n, tCompute.Round(time.Millisecond))
	t.Logf("join of FEP %d: recomputation %s; join -> last LoP has its table %s; publish -> last LoP %s",
		n+1, tJoinCompute.Round(time.Millisecond), last.Sub(t0).Round(time.Millisecond), last.Sub(published).Round(time.Millisecond))
	t.Logf("table size gzip median %d B max %d B; fep0000 plain JSON %d B", sizes[len(sizes)/2], sizes[len(sizes)-1], plain)
	t.Logf("process RSS %s (controller and %d simulated FEP clients); Go heap in use %d MB", rss(), n, ms.HeapInuse>>20)
}

func mustTable(t *testing.T, c *Controller, lop string) *api.EncodedTable {
	et, err := c.WaitTable(testCtx(t), lop, 0)
	if err != nil {
		t.Fatal(err)
	}
	return et
}

func rss() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.Atoi(f[1])
				return fmt.Sprintf("%d MB", int(math.Round(float64(kb)/1024)))
			}
		}
	}
	return "unknown"
}
