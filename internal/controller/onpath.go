package controller

// On-path relays (transparent transmission segmentation, docs/tts.md):
// the relays report what they see on the legs of the flows they
// intercept; internal/onpath decides which relays intercept which path;
// the decisions travel in every LoP's table (api.Table.Intercept).

import (
	"errors"
	"slices"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/onpath"
)

// newOnPath returns the planner of cfg's paths, or nil without any.
func newOnPath(cfg Config) (*onpath.Planner, error) {
	if len(cfg.OnPath.Paths) == 0 {
		return nil, nil
	}
	return onpath.New(cfg.OnPath, cfg.Now())
}

// noteSegments folds a relay's leg figures into the planner; a changed
// decision asks for a computation at once.
func (c *Controller) noteSegments(fep string, segs []api.SegmentSample) {
	if len(segs) == 0 {
		return
	}
	if c.onpath == nil {
		c.m.refused.WithLabelValues("no_onpath_paths").Add(float64(len(segs)))
		return
	}
	changed, err := c.onpath.Observe(c.cfg.Now(), fep, segs)
	if err != nil {
		c.m.refused.WithLabelValues("onpath_sample").Inc()
		if errors.Is(err, onpath.ErrUnknown) {
			c.log.Debug("on-path samples refused", "fep", fep, "err", err)
		} else {
			c.log.Warn("on-path samples refused", "fep", fep, "err", err)
		}
	}
	if changed {
		for _, st := range c.onpath.Status() {
			c.log.Info("on-path decision", "path", st.Path, "active", st.Active, "hops", st.Hops,
				"predicted_ms", st.PredMS)
		}
		c.Trigger()
	}
}

// intercepts returns the current decisions (nil without paths).
func (c *Controller) intercepts() []api.Intercept {
	if c.onpath == nil {
		return nil
	}
	return c.onpath.Intercepts()
}

// OnPathStatus returns the planner's estimates and decisions (nil without
// paths).
func (c *Controller) OnPathStatus() []onpath.Status {
	if c.onpath == nil {
		return nil
	}
	return c.onpath.Status()
}

func sameIntercepts(a, b []api.Intercept) bool {
	return slices.EqualFunc(a, b, func(x, y api.Intercept) bool {
		return x.FEP == y.FEP && x.Path == y.Path && x.Active == y.Active && x.Measured == y.Measured && x.Prev == y.Prev &&
			x.Next == y.Next && x.Ports == y.Ports && slices.Equal(x.Sources, y.Sources) && slices.Equal(x.Dests, y.Dests)
	})
}
