package cli

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/mosto-net/mosto/internal/agent"
	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/onpath"
	"github.com/mosto-net/mosto/internal/relay"
)

// wireOnPath connects a proxy's transparent entry to the controller
// (docs/tts.md): the agent pushes the legs' figures the relay gathered and
// applies the table's interception decisions for this FEP.
func wireOnPath(acfg *agent.Config, srv *relay.Server, log *slog.Logger) {
	id := acfg.FEP.ID
	acfg.Segments = func() []api.SegmentSample { return legSamples(srv.TakeLegStats()) }
	prev := acfg.OnUpdate
	acfg.OnUpdate = func(s *agent.Snapshot) {
		if prev != nil {
			prev(s)
		}
		if s == nil || s.Table == nil {
			return
		}
		if err := srv.SetOnPath(onPathScopes(s.Table.Intercept, id)); err != nil {
			log.Error("cannot apply the on-path decision; keeping the current interception", "version", s.Version, "err", err)
		}
	}
}

// onPathScopes are the table's decisions for FEP id.
func onPathScopes(in []api.Intercept, id string) []relay.OnPathScope {
	var out []relay.OnPathScope
	for _, x := range in {
		if x.FEP == id {
			out = append(out, relay.OnPathScope{Path: x.Path, Active: x.Active, Sources: x.Sources,
				Dests: x.Dests, Ports: x.Ports, Prev: x.Prev, Next: x.Next})
		}
	}
	return out
}

// legSamples turns the relay's leg figures into report samples.
func legSamples(ls []relay.LegStats) []api.SegmentSample {
	out := make([]api.SegmentSample, 0, len(ls))
	for _, l := range ls {
		if l.Flows < 1 || l.SumMinRTT <= 0 {
			continue
		}
		out = append(out, api.SegmentSample{Path: l.Path, From: l.From, To: l.To, Flows: l.Flows,
			MinRTTMS: float64(l.SumMinRTT) / float64(l.Flows) / float64(time.Millisecond),
			SegsOut:  float64(l.SegsOut), Retrans: float64(l.Retrans)})
	}
	return out
}

// loadOnPath reads the controller's --onpath file ("" = no paths).
func loadOnPath(path string) (onpath.Config, error) {
	if path == "" {
		return onpath.Config{}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return onpath.Config{}, fmt.Errorf("onpath: %w", err)
	}
	defer f.Close()
	c, err := onpath.ParseConfig(f)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
