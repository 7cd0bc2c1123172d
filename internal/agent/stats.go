package agent

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/metrics"
)

// StatsFrom returns a Config.Stats function that reads the relay counters
// (mosto_relay_*) of reg, the proxy daemon's registry. started is when the
// process started; version, if not nil, gives the table version in use.
func StatsFrom(reg *metrics.Registry, started time.Time, version func() uint64) func() *api.ProxyStats {
	return func() *api.ProxyStats {
		s := &api.ProxyStats{Started: started.UTC(), At: time.Now().UTC()}
		if version != nil {
			s.TableVersion = version()
		}
		add := func(m *map[string]float64, k string, v float64) {
			if k == "" {
				return
			}
			if *m == nil {
				*m = make(map[string]float64)
			}
			if _, ok := (*m)[k]; ok || len(*m) < api.MaxStatKeys {
				(*m)[k] += v
			}
		}
		for _, mf := range reg.Gather() {
			if mf.Type != metrics.TypeCounter && mf.Type != metrics.TypeGauge {
				continue
			}
			for _, m := range mf.Series {
				l := map[string]string{}
				for _, lp := range m.Labels {
					l[lp.Name] = lp.Value
				}
				v := m.Value
				switch mf.Name {
				case "mosto_relay_flows_total":
					add(&s.Flows, l["outcome"], v)
					add(&s.FlowsByRole, l["role"], v)
				case "mosto_relay_bytes_total":
					s.Bytes += v
				case "mosto_relay_active_flows":
					add(&s.Active, l["role"], v)
				case "mosto_relay_refusals_total":
					add(&s.Refusals, l["reason"], v)
				case "mosto_relay_direct_total":
					add(&s.Direct, l["reason"], v)
				case "mosto_relay_pool_total":
					add(&s.Pool, l["pool"]+"/"+l["result"], v)
				}
			}
		}
		return s
	}
}

// pushStats sends the proxy's counters (and its on-path relay's leg
// figures) to the controller every StatsEvery, as reports that carry only
// them. A controller that refuses them (400: older than counters in
// reports) is not asked again.
func (a *Agent) pushStats(ctx context.Context, c *api.Client) {
	t := time.NewTicker(a.cfg.StatsEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var st *api.ProxyStats
		if a.cfg.Stats != nil {
			st = a.cfg.Stats()
		}
		if st != nil {
			if err := st.Validate(time.Now()); err != nil {
				a.log.Warn("not pushing invalid counters", "err", err)
				st = nil
			}
		}
		var segs []api.SegmentSample
		if a.cfg.Segments != nil {
			for _, s := range a.cfg.Segments() {
				if err := s.Validate(a.cfg.FEP.ID); err != nil {
					a.log.Warn("not pushing an invalid segment sample", "err", err)
					continue
				}
				if len(segs) < api.MaxSegments {
					segs = append(segs, s)
				}
			}
		}
		if st == nil && len(segs) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := c.Report(rctx, api.Report{FEP: a.cfg.FEP.ID, Stats: st, Segments: segs})
		cancel()
		var se *api.StatusError
		switch {
		case err == nil, ctx.Err() != nil:
		case errors.As(err, &se) && se.Code == http.StatusBadRequest:
			a.log.Warn("controller refuses counters in reports (older version?); not pushing them", "err", err)
			return
		case errors.As(err, &se) && se.Code == http.StatusForbidden:
			a.wantRegister()
		default:
			a.log.Debug("counters push failed", "err", err)
		}
	}
}
