package relaytest

import (
	"context"
	"encoding/hex"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/hop"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/testenv"
)

// secret is the overlay key of every World (key id KeyID), 32 bytes.
const secret = "mosto-relaytest-overlay-key-32by"

// KeyID is the id of the overlay key of every World.
const KeyID = 1

// Keyring returns the overlay keyring every World's members share.
func Keyring(t testing.TB) *hop.Keyring {
	t.Helper()
	kr, err := hop.NewKeyring(hop.Key{ID: KeyID, Secret: []byte(secret)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// Config is a loopback-only daemon config for FEP id: a hop listener on an
// ephemeral port, the World's key, every loopback destination allowed,
// short timeouts and members (placeholders until the World knows their
// addresses).
func Config(id string, members ...string) *relay.Config {
	m := map[string]string{}
	for _, id := range members {
		m[id] = "127.0.0.1:9"
	}
	return &relay.Config{
		ID:           id,
		Hop:          relay.HopConfig{Listen: "127.0.0.1:0"},
		Members:      m,
		Keys:         relay.KeysConfig{Current: &relay.KeyConfig{ID: KeyID, SecretHex: hex.EncodeToString([]byte(secret))}},
		Destinations: relay.PolicyConfig{Allow: []string{"127.0.0.0/8"}},
		Timeouts: relay.TimeoutConfig{Header: relay.Duration(2 * time.Second), Connect: relay.Duration(2 * time.Second),
			Idle: relay.Duration(30 * time.Second), Drain: relay.Duration(2 * time.Second)},
		Limits: relay.LimitConfig{MaxConns: 50000, MaxConnsPerSource: 50000},
	}
}

// Start runs a daemon from cfg until t ends (then drains it and waits for
// Run to return). It logs Warn and above to t's log.
func Start(t testing.TB, cfg *relay.Config) *relay.Server {
	t.Helper()
	return start(t, cfg, nil).Server
}

// Daemon is a running relay.Server that a test can stop before it ends.
type Daemon struct {
	*relay.Server
	id     string
	cancel context.CancelFunc
	done   chan error
}

// Run is Start for a test that stops the daemon itself (Stop); t's end
// still stops it if the test did not.
func Run(t testing.TB, cfg *relay.Config) *Daemon {
	t.Helper()
	return start(t, cfg, nil)
}

// Stop cancels the daemon's Run (it drains) and returns Run's error; it
// fails t if Run has not returned 30 s later. It may be called again.
func (d *Daemon) Stop(t testing.TB) error {
	t.Helper()
	d.cancel()
	select {
	case err := <-d.done:
		d.done <- err
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("relay %s: Run did not return 30 s after cancel", d.id)
		return nil
	}
}

func start(t testing.TB, cfg *relay.Config, setup func(*relay.Server)) *Daemon {
	t.Helper()
	s, err := relay.New(cfg, testenv.Logger(t))
	if err != nil {
		t.Fatalf("relay.New(%s): %v", cfg.ID, err)
	}
	if setup != nil {
		setup(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Daemon{Server: s, id: cfg.ID, cancel: cancel, done: make(chan error, 1)}
	go run(ctx, s, d.done)
	t.Cleanup(func() { d.Stop(t) })
	return d
}

func run(ctx context.Context, s *relay.Server, done chan<- error) { done <- s.Run(ctx) }

// ChainTable is a relay.ChainSource answering one fixed path per (from,
// to) pair, for any size.
type ChainTable map[[2]string][]string

// Lookup implements relay.ChainSource.
func (c ChainTable) Lookup(from, to string, size int64) (pathcomp.ChainEntry, bool) {
	p, ok := c[[2]string{from, to}]
	if !ok {
		return pathcomp.ChainEntry{}, false
	}
	return pathcomp.ChainEntry{From: from, To: to, Path: p, Rounds: 1}, true
}

// Options changes a World before it starts.
type Options struct {
	// Tweak changes each member's config (after Config, before New).
	Tweak func(*relay.Config)
	// Origin handles each connection to the test origin; nil: Echo.
	Origin func(*net.TCPConn)
	// OriginAddr, if set, is the service's origin instead: no test origin
	// is started (World.Origin is nil).
	OriginAddr string
	// Setup, if set, runs on each member after relay.New, before Run.
	Setup func(*relay.Server)
}

// World is a running overlay.
type World struct {
	IDs     []string                 // in chain order
	Members map[string]*relay.Server // by id
	Chains  ChainTable               // the first id to the last through every id
	Origin  *Origin                  // nil with Options.OriginAddr
}

// Overlay starts a World of the members ids (at least two): the first is
// the InP, with a service (Service(0)) forwarding to the test origin
// through the chain ids[0] -> ... -> ids[len-1] (the EgP).
func Overlay(t testing.TB, ids ...string) *World {
	t.Helper()
	return OverlayWith(t, Options{}, ids...)
}

// OverlayWith is Overlay with options.
func OverlayWith(t testing.TB, o Options, ids ...string) *World {
	t.Helper()
	if len(ids) < 2 {
		t.Fatalf("relaytest.Overlay: %d members; want at least 2", len(ids))
	}
	w := &World{IDs: ids, Members: map[string]*relay.Server{}}
	origin := o.OriginAddr
	if origin == "" {
		handle := o.Origin
		if handle == nil {
			handle = Echo
		}
		w.Origin = NewOrigin(t, handle)
		origin = w.Origin.Addr()
	}
	first, last := ids[0], ids[len(ids)-1]
	w.Chains = ChainTable{{first, last}: ids}
	for _, id := range ids {
		var others []string
		for _, o := range ids {
			if o != id {
				others = append(others, o)
			}
		}
		cfg := Config(id, others...)
		if id == first {
			cfg.Egress.Default = last
			cfg.Services = []relay.ServiceConfig{{Name: "svc", Listen: "127.0.0.1:0", Origin: origin, Size: 1000}}
		}
		if o.Tweak != nil {
			o.Tweak(cfg)
		}
		w.Members[id] = start(t, cfg, o.Setup).Server
	}
	addrs := map[string]string{}
	for id, s := range w.Members {
		addrs[id] = s.HopAddr().String()
	}
	for _, s := range w.Members {
		s.SetMembers(addrs)
		s.SetChains(w.Chains)
	}
	return w
}

// Service returns the address of the InP's service: a flow to it crosses
// the whole chain to the origin.
func (w *World) Service() string { return w.Members[w.IDs[0]].ServiceAddr(0).String() }

// Origin is the World's test origin: a loopback TCP server (testenv.Server).
type Origin = testenv.Server

// NewOrigin serves handle for every connection until t ends.
func NewOrigin(t testing.TB, handle func(*net.TCPConn)) *Origin { return testenv.NewServer(t, handle) }

// Echo copies everything back and half-closes after EOF.
func Echo(c *net.TCPConn) { testenv.Echo(c) }
