package agent

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/probe"
)

// TestStatsPushed: the agent pushes the relay counters of its registry to
// the controller in reports that carry only them.
func TestStatsPushed(t *testing.T) {
	c := newController(t)
	reg := metrics.NewRegistry()
	flows := reg.CounterVec(metrics.Opts{Name: "mosto_relay_flows_total"}, "role", "outcome")
	direct := reg.CounterVec(metrics.Opts{Name: "mosto_relay_direct_total"}, "reason")
	bytes := reg.CounterVec(metrics.Opts{Name: "mosto_relay_bytes_total"}, "role", "direction")
	pool := reg.CounterVec(metrics.Opts{Name: "mosto_relay_pool_total"}, "pool", "result")
	flows.WithLabelValues("inp", "ok").Add(5)
	flows.WithLabelValues("trp", "ok").Add(2)
	flows.WithLabelValues("inp", "reset").Add(1)
	direct.WithLabelValues("no_chain").Add(3)
	bytes.WithLabelValues("inp", "up").Add(100)
	bytes.WithLabelValues("trp", "down").Add(900)
	pool.WithLabelValues("hop", "hit").Add(4)
	started := time.Now().Add(-time.Minute)
	cfg := fepConfig(c, t.TempDir(), c.token(t, pki.TokenOptions{}))
	cfg.Stats = StatsFrom(reg, started, func() uint64 { return 9 })
	cfg.StatsEvery = 20 * time.Millisecond
	startAgent(t, cfg)
	var got *api.ProxyStats
	eventually(t, "a report with counters", func() bool {
		c.fb.mu.Lock()
		defer c.fb.mu.Unlock()
		for _, r := range c.fb.reports {
			if r.Stats != nil && len(r.Samples) == 0 {
				got = r.Stats
				return true
			}
		}
		return false
	})
	if got.Flows["ok"] != 7 || got.Flows["reset"] != 1 || got.FlowsByRole["inp"] != 6 || got.FlowsByRole["trp"] != 2 {
		t.Errorf("flows %v by role %v; want ok 7 reset 1, inp 6 trp 2", got.Flows, got.FlowsByRole)
	}
	if got.Bytes != 1000 || got.Direct["no_chain"] != 3 || got.Pool["hop/hit"] != 4 || got.TableVersion != 9 {
		t.Errorf("bytes %v direct %v pool %v version %d; want 1000, no_chain 3, hop/hit 4, 9", got.Bytes, got.Direct, got.Pool, got.TableVersion)
	}
	if !got.Started.Equal(started.UTC()) {
		t.Errorf("started %v; want %v", got.Started, started)
	}
}

// TestProbeConnUsed: a measurement socket handed over (socket activation)
// is the endpoint the agent serves, and ProbeListen is not bound.
func TestProbeConnUsed(t *testing.T) {
	c := newController(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fepConfig(c, t.TempDir(), c.token(t, pki.TokenOptions{}))
	cfg.ProbeConn = pc
	busy, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg.ProbeListen = busy.LocalAddr().String() // in use: binding it would fail
	startAgent(t, cfg)
	var m probe.UDPEcho
	eventually(t, "an echo from the handed-over socket", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := m.Measure(ctx, pc.LocalAddr().String())
		return err == nil
	})
}
