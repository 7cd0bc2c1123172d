package scenario

import (
	"slices"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// DefaultCoreHour is seed 001's price of a CPU core-hour: an EC2 m4.large
// (2 cores) at $0.108 an hour.
const DefaultCoreHour = 0.108 / 2

// DollarsPerTB is the CPU cost of delivering a terabyte when cpuSeconds
// of processor time delivered size bytes, at price dollars per core-hour.
func DollarsPerTB(cpuSeconds float64, size int64, price float64) float64 {
	if size <= 0 {
		return 0
	}
	return cpuSeconds / float64(size) * 1e12 / 3600 * price
}

// fetchModelDoc describes the fetch model for the report.
const fetchModelDoc = "pathcomp.Model.FetchTime over the mode's data path, one TCP segment per connection with the world's RTT and loss and its initial window " +
	"(the smaller of the sender's initial congestion window and the receiver's initial receive window: a host with the levers has the route's initcwnd/initrwnd, " +
	"any other 10 segments; nginx's kept-alive upstream connection is warm: one round): " +
	"the handshake of every connection the fetch opens (the client's; the hops' and the origin's unless pooled) + one RTT of the whole path (request out, first byte back) " +
	"+ the slowest segment's ramp, max of (rounds at its window - 1) x its RTT + size / the path's bottleneck rate " +
	"+ per segment, lost packets (size/MSS x loss) x RTT / 4 (RACK's reordering window; BBR keeps its rate)"

// leg is one connection of a mode's data path: data flows from server to
// client; open says it exists before the fetch (pooled, kept alive), warm
// that its window already holds the response.
type leg struct {
	server, client string
	open, warm     bool
}

// modeLegs returns the connections of a fetch in mode m, the client's
// first, with path the chain the table planned (InP .. EgP); ok is false
// for the modes the model does not describe (the cold restarts) and for a
// chain without a planned path.
func (s *Scenario) modeLegs(m Mode, path []string) ([]leg, bool) {
	t, r := s.cfg.Tune, s.roles
	switch m {
	case Direct:
		return []leg{{server: r.Origin, client: r.Client}}, true
	case Single:
		return []leg{{server: r.Single, client: r.Client}, {server: r.Origin, client: r.Single, open: t.OriginPool > 0}}, true
	case Chain:
		if len(path) == 0 {
			return nil, false
		}
		legs := []leg{{server: path[0], client: r.Client}}
		for k := 0; k+1 < len(path); k++ {
			legs = append(legs, leg{server: path[k+1], client: path[k], open: t.HopPool > 0})
		}
		return append(legs, leg{server: r.Origin, client: path[len(path)-1], open: t.OriginPool > 0}), true
	case CDNCold, CDNWarm:
		h := s.cdnHost()
		return []leg{{server: h, client: r.Client}, {server: r.Origin, client: h, open: m == CDNWarm, warm: m == CDNWarm}}, true
	}
	return nil, false
}

// tuned reports whether host h has the levers' route windows (a FEP, or
// the CDN front-end's host with Config.TuneCDN).
func (s *Scenario) tuned(h string) bool {
	if s.cfg.Tune.InitCwnd <= 0 {
		return false
	}
	return slices.Contains(s.roles.FEPs, h) || s.cfg.TuneCDN && s.cfg.CDN && h == s.cdnHost()
}

// hostWindow is the initial window (congestion window when sending,
// receive window when receiving) of a new connection of host h: the
// route's initcwnd/initrwnd on a tuned host, else Linux's 10 segments
// (TCP_INIT_CWND, TCP_DEFAULT_INIT_RCVWND).
func (s *Scenario) hostWindow(h string) int {
	if s.tuned(h) {
		return s.cfg.Tune.InitCwnd
	}
	return linuxWindow
}

// linuxWindow is Linux's initial congestion and receive window in segments.
const linuxWindow = 10

// predict returns the fetch model's time in milliseconds of size bytes in
// mode m (see fetchModelDoc), path being the planned chain.
func (s *Scenario) predict(m Mode, size int64, path []string) (float64, bool) {
	legs, ok := s.modeLegs(m, path)
	if !ok {
		return 0, false
	}
	return fetchTime(legs, size, s.linkOf), true
}

// linkProps are what the fetch model needs of one direction of a link.
type linkProps struct {
	rttMS, loss, rateBps float64
	window               int
}

// linkOf returns the properties of the direction server -> client in the
// world, with the initial window of a new connection between them.
func (s *Scenario) linkOf(server, client string) linkProps {
	p := linkProps{rttMS: float64(s.w.RTT(server, client)) / 1e6,
		window: min(s.hostWindow(server), s.hostWindow(client))}
	if l, err := s.w.Link(server, client); err == nil {
		p.loss, p.rateBps = l.LossPct/100, l.RateMbit*1e6/8
	}
	return p
}

// fetchTime is the fetch model over legs, with link giving each
// direction's properties.
func fetchTime(legs []leg, size int64, link func(server, client string) linkProps) float64 {
	segs := make([]pathcomp.Segment, 0, len(legs))
	rate := 0.0
	for _, l := range legs {
		p := link(l.server, l.client)
		w := p.window
		if l.warm {
			w = pathcomp.WarmWindow
		}
		segs = append(segs, pathcomp.Segment{RTT: p.rttMS, Window: w, Open: l.open, Loss: p.loss})
		if p.rateBps > 0 && (rate == 0 || p.rateBps < rate) {
			rate = p.rateBps
		}
	}
	return pathcomp.Model{}.FetchTime(segs, size, rate)
}
