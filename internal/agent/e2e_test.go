package agent

import (
	"context"
	"net"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	ctlpkg "github.com/mosto-net/mosto/internal/controller"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/probe"
	"github.com/mosto-net/mosto/internal/store/boltstore"
)

// probeConn binds a loopback UDP socket for an agent's measurement
// endpoint (Config.ProbeConn). Binding first and advertising the port
// obtained leaves no moment in which another process could take the port
// (picking a free port, closing it and letting the agent bind it later
// did: under parallel load the agent's bind failed, its Run ended, and the
// test waited for probes that never came).
func probeConn(t *testing.T) (net.PacketConn, string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc, pc.LocalAddr().String()
}

// TestAgentsWithRealController runs three agents against the real
// controller (bbolt store) behind the real API handler with mutual TLS:
// they join with tokens from the CLI's store, probe each other, report, and
// receive tables; one restarts with the controller gone and still routes.
func TestAgentsWithRealController(t *testing.T) {
	ctlDir := t.TempDir()
	if _, err := pki.Init(ctlDir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(ctlDir)
	if err != nil {
		t.Fatal(err)
	}
	ctl, st, stopCtl := runController(t, ctlDir)

	tokens := pki.DirTokenStore{Dir: pki.TokenDir(ctlDir)}
	tcfg, err := ca.ServerTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(api.NewHandler(api.ServerConfig{
		Backend:           ctl,
		Joiner:            &pki.Joiner{CA: ca, Tokens: tokens, Store: st},
		RequireClientCert: true,
	}))
	srv.TLS = tcfg
	srv.StartTLS()
	t.Cleanup(srv.Close)

	feps := []api.FEP{
		{ID: "fra", HopAddr: "127.0.0.1:7001", Lat: 50.1, Lon: 8.7},
		{ID: "par", HopAddr: "127.0.0.1:7002", Lat: 48.9, Lon: 2.4},
		{ID: "ams", HopAddr: "127.0.0.1:7003", Lat: 52.4, Lon: 4.9},
	}
	agents := map[string]*Agent{}
	stops := map[string]func() error{}
	dirs := map[string]string{}
	for i, f := range feps {
		pc, addr := probeConn(t)
		f.ProbeAddr = addr
		feps[i] = f
		var tok string
		if i == 0 {
			tk, _, err := ca.CreateStoreToken(context.Background(), st, pki.TokenOptions{FEP: f.ID})
			if err != nil {
				t.Fatal(err)
			}
			tok = tk.String()
		} else {
			tk, _, err := ca.CreateToken(context.Background(), tokens, pki.TokenOptions{FEP: f.ID})
			if err != nil {
				t.Fatal(err)
			}
			tok = tk.String()
		}
		dirs[f.ID] = t.TempDir()
		a, stop := startAgent(t, Config{
			Controller: srv.URL,
			Token:      tok,
			DataDir:    dirs[f.ID],
			FEP:        f,
			ProbeConn:  pc,
			Probe: probe.Config{Interval: 100 * time.Millisecond, Jitter: -1, Probes: 1,
				Measurer: &probe.UDPEcho{Timeout: 300 * time.Millisecond}},
			TargetsEvery: 200 * time.Millisecond,
			Wait:         2 * time.Second,
		})
		agents[f.ID], stops[f.ID] = a, stop
	}
	for id, a := range agents {
		eventually(t, id+" measuring both peers", func() bool { return len(a.Estimates()) == 2 })
	}
	fra := agents["fra"]
	eventually(t, "fra's table with every member", func() bool { return len(fra.Members()) == 3 })
	for _, f := range feps {
		if got := fra.Members()[f.ID]; got != f.HopAddr {
			t.Errorf("member %s = %q; want %q", f.ID, got, f.HopAddr)
		}
	}
	e, ok := fra.Lookup("fra", "ams", 1<<20)
	if !ok || e.Path[0] != "fra" || e.Path[len(e.Path)-1] != "ams" {
		t.Fatalf("Lookup(fra, ams) = %v, %v", e.Path, ok)
	}
	if fra.Keys() == nil {
		t.Error("no overlay keyring from the controller")
	}
	eventually(t, "every pair measured in the controller's matrix", func() bool {
		m, err := ctl.Matrix(context.Background())
		if err != nil || len(m.Names) != 3 {
			return false
		}
		for i, row := range m.RTTMS {
			for j, v := range row {
				if i != j && v == nil {
					return false
				}
			}
		}
		return true
	})
	// With a table, the measurement endpoints answer only probes tagged
	// with the overlay key.
	keys := fra.Snapshot().ProbeKeys
	if len(keys) == 0 {
		t.Fatal("no probe keys in fra's snapshot")
	}
	par := feps[1].ProbeAddr
	// par's endpoint requires tags once par itself holds a table with the
	// keys, which may come a moment after fra's.
	eventually(t, "par holds the probe keys", func() bool {
		s := agents["par"].Snapshot()
		return s != nil && len(s.ProbeKeys) > 0
	})
	if _, err := (&probe.UDPEcho{Timeout: 300 * time.Millisecond}).Measure(context.Background(), par); err == nil {
		t.Error("an untagged probe was answered by a FEP holding the overlay key")
	}
	eventually(t, "a probe tagged with fra's key answered by par", func() bool {
		_, err := (&probe.UDPEcho{Timeout: 300 * time.Millisecond, Keys: func() []probe.Key { return keys }}).Measure(context.Background(), par)
		return err == nil
	})
	if st := agents["par"].ProbeStats(); st.Unauth == 0 || st.Replied == 0 {
		t.Errorf("par's endpoint stats %+v; want tagged probes answered and the untagged one dropped", st)
	}

	// ams dies (its probe responder with it): fra and par report it
	// unreachable after 3 failed rounds, and the controller drops its pairs.
	if err := stops["ams"](); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	eventually(t, "ams's pairs gone from the controller's matrix", func() bool {
		m, err := ctl.Matrix(context.Background())
		if err != nil || len(m.Names) != 3 || m.Names[0] != "ams" {
			return false
		}
		return m.RTTMS[1][0] == nil && m.RTTMS[2][0] == nil // fra -> ams, par -> ams
	})
	t.Logf("ams unreachable in the controller's matrix %v after it stopped (probe interval 100ms, 3 rounds; its closed port answers ICMP, so probes fail at once)",
		time.Since(stopped).Round(time.Millisecond))
	eventually(t, "fra's chains to par not through ams", func() bool {
		for _, size := range []int64{14_000, 15_000_000} {
			e, ok := fra.Lookup("fra", "par", size)
			if !ok || slices.Contains(e.Path[1:len(e.Path)-1], "ams") {
				return false
			}
		}
		return true
	})
	eventually(t, "fra's estimates without ams", func() bool {
		_, ok := fra.Estimates()["ams"]
		return !ok
	})

	if err := stops["fra"](); err != nil {
		t.Fatal(err)
	}
	// Read after the stop: a table may arrive until then.
	v := fra.Version()
	e, _ = fra.Lookup("fra", "ams", 1<<20)

	// Controller gone; a restarted fra routes on its persisted table.
	srv.Close()
	stopCtl()
	a2, err := New(Config{Controller: srv.URL, DataDir: dirs["fra"], FEP: feps[0], ProbeListen: "off"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a2.Version() != v {
		t.Errorf("restarted fra at version %d; want %d", a2.Version(), v)
	}
	if e2, ok := a2.Lookup("fra", "ams", 1<<20); !ok || !slices.Equal(e2.Path, e.Path) {
		t.Errorf("restarted Lookup = %v, %v; want %v", e2.Path, ok, e.Path)
	}
}

// runController runs a real controller on a bolt store in dir until stop
// or the end of t.
func runController(t *testing.T, dir string) (ctl *ctlpkg.Controller, st *boltstore.Store, stop func()) {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(dir, "controller.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctl, err = ctlpkg.New(ctlpkg.Config{Store: st, Debounce: 50 * time.Millisecond, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	cdone := make(chan error, 1)
	go func() { cdone <- ctl.Run(cctx) }()
	stop = sync.OnceFunc(func() { ccancel(); <-cdone })
	t.Cleanup(stop)
	return ctl, st, stop
}

// TestAgentsMeasureDestinations runs two agents against the real controller
// on loopback; a destination whose probe address is a TCP listener (an
// origin) is registered through the API once they run: the agents are told
// to measure it (they fetch their targets again on the new table),
// time TCP handshakes to it, report, and the controller's EgP for it is
// chosen by the measured RTTs and reaches the tables.
func TestAgentsMeasureDestinations(t *testing.T) {
	ctl, _, _ := runController(t, t.TempDir())
	srv := httptest.NewServer(api.NewHandler(api.ServerConfig{Backend: ctl}))
	t.Cleanup(srv.Close)

	origin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer origin.Close()
	accepted := make(chan struct{}, 1024)
	go func() {
		for {
			c, err := origin.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	cl := &api.Client{BaseURL: srv.URL}
	ctx := t.Context()
	feps := []api.FEP{
		{ID: "fra", HopAddr: "127.0.0.1:7001", Lat: 50.1, Lon: 8.7},
		{ID: "ams", HopAddr: "127.0.0.1:7003", Lat: 52.4, Lon: 4.9},
	}
	agents := map[string]*Agent{}
	for _, f := range feps {
		pc, addr := probeConn(t)
		f.ProbeAddr = addr
		a, _ := startAgent(t, Config{
			Controller:   srv.URL,
			DataDir:      t.TempDir(),
			FEP:          f,
			ProbeConn:    pc,
			Probe:        probe.Config{Interval: 100 * time.Millisecond, Jitter: -1, Probes: 2},
			TargetsEvery: time.Hour, // targets are fetched again on a new table
			Wait:         2 * time.Second,
		})
		agents[f.ID] = a
	}
	for id, a := range agents {
		eventually(t, id+" holding a table", func() bool { return a.Version() > 0 })
	}
	// Registered after the agents fetched their targets: the new table
	// (its egress changed) makes them fetch them again.
	dest := api.Destination{ID: "origin", Prefix: "198.51.100.0/24", Lat: 51, Lon: 4, ProbeAddr: origin.Addr().String()}
	if err := cl.RegisterDestination(ctx, dest); err != nil {
		t.Fatal(err)
	}
	for id, a := range agents {
		eventually(t, id+" measuring the destination", func() bool { return a.DestEstimates()["origin"] > 0 })
	}
	if len(accepted) == 0 {
		t.Error("the origin accepted no connection")
	}
	var status api.DestinationStatus
	eventually(t, "both RTTs at the controller and the EgP chosen by them", func() bool {
		ds, err := cl.Destinations(ctx)
		if err != nil || len(ds) != 1 {
			return false
		}
		status = ds[0]
		return status.By == "rtt" && len(status.RTTMS) == 2
	})
	best := "fra"
	if status.RTTMS["ams"] < status.RTTMS["fra"] {
		best = "ams"
	}
	if status.EgP != best {
		t.Errorf("EgP %s; want %s (RTTs %v)", status.EgP, best, status.RTTMS)
	}
	eventually(t, "the tables' egress for the destination", func() bool {
		s := agents["fra"].Snapshot()
		if s == nil {
			return false
		}
		for _, e := range s.Table.Egress {
			if e.Prefix == dest.Prefix {
				// The EgP can move between two loopback measurements.
				ds, err := cl.Destinations(ctx)
				return err == nil && len(ds) == 1 && e.FEP == ds[0].EgP
			}
		}
		return false
	})
}
