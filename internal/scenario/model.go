package scenario

import (
	"os"
	"slices"
	"strings"

	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/report"
)

// DefaultCoreHour is seed 001's price of a CPU core-hour (report.DefaultCoreHour).
const DefaultCoreHour = report.DefaultCoreHour

// fetchModelDoc describes the fetch model for the report.
const fetchModelDoc = "pathcomp.Model.FetchTime over the mode's data path, one TCP segment per connection with the world's RTT and loss and its initial window " +
	"(the sender's initial congestion window, doubling per round, and the receiver's initial receive window, tripling per round (Linux's tcp_grow_window): " +
	"a host with the levers has the route's initcwnd/initrwnd, any other 10 segments; nginx's kept-alive upstream connection is warm: one round, " +
	"or with a BBR origin paced at 2/ln2 x the largest round of the same-size fetch it carried before): " +
	"the handshake of every connection the fetch opens (the client's; the hops' and the origin's unless pooled) + one RTT of the whole path (request out, first byte back) " +
	"+ the slowest segment's own time: (rounds - 1) x its RTT while its window is below its link's bandwidth-delay product, then the rest at the link's rate; size / pacing rate when paced " +
	"+ per segment, lost packets (size/MSS x loss) x RTT / 6 (an empirical delay per loss; BBR keeps its rate); " +
	"cdn-default's kept-alive connection restarts from the origin's initial window (slow start after idle; a BBR origin does not restart: then as cdn-warm) with nginx's grown receive window; " +
	"with a measured machine rate (the chain's data path through the emulator and the relays on this machine, by a calibration fetch) the chain's client segment gets it as its rate when the world states none or a larger one"

// leg is one connection of a mode's data path: data flows from server to
// client; open says it exists before the fetch (pooled, kept alive), warm
// that its window already holds the response.
type leg struct {
	server, client string
	open, warm     bool
	// restart: an open connection that idled longer than its RTO with
	// slow start after idle, so it starts again from the sender's
	// initial window (its receiver's window stays grown).
	restart bool
	// machineBps caps the leg's rate (bytes/s; 0: none): the machine's
	// measured rate along the mode's data path (Scenario.SetMachineRate).
	machineBps float64
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
		legs := []leg{{server: path[0], client: r.Client, machineBps: s.machine.Chain}}
		for k := 0; k+1 < len(path); k++ {
			legs = append(legs, leg{server: path[k+1], client: path[k], open: t.HopPool > 0})
		}
		return append(legs, leg{server: r.Origin, client: path[len(path)-1], open: t.OriginPool > 0}), true
	case CDNCold, CDNWarm, CDNDefault:
		h := s.cdnHost()
		return []leg{{server: h, client: r.Client},
			{server: r.Origin, client: h, open: m != CDNCold, warm: m == CDNWarm, restart: m == CDNDefault}}, true
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
// mode m (see fetchModelDoc), path being the planned chain and paced
// whether the origin's congestion control paces a warm connection (BBR).
func (s *Scenario) predict(m Mode, size int64, path []string, paced bool) (float64, bool) {
	legs, ok := s.modeLegs(m, path)
	if !ok {
		return 0, false
	}
	return fetchTime(legs, size, s.linkOf, paced), true
}

// linkProps are what the fetch model needs of one direction of a link.
type linkProps struct {
	rttMS, loss, rateBps float64
	// send and recv are the initial congestion window of the sender and
	// the initial receive window of the receiver, in segments.
	send, recv int
}

// linkOf returns the properties of the direction server -> client in the
// world, with the initial windows of a new connection between them.
func (s *Scenario) linkOf(server, client string) linkProps {
	p := linkProps{rttMS: float64(s.w.RTT(server, client)) / 1e6, send: s.hostWindow(server), recv: s.hostWindow(client)}
	if l, err := s.w.Link(server, client); err == nil {
		p.loss, p.rateBps = l.LossPct/100, l.RateMbit*1e6/8
	}
	return p
}

// originPaces reports whether the origin's congestion control is BBR,
// which paces a warm connection at its bandwidth estimate.
func (s *Scenario) originPaces() bool {
	var cc []byte
	err := s.w.Do(s.roles.Origin, func() error {
		var err error
		cc, err = os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
		return err
	})
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(cc)), "bbr")
}

// fetchTime is the fetch model over legs, with link giving each
// direction's properties. A warm leg sends the response in one round; with
// paced (a BBR sender) it paces at BBR's STARTUP gain times its bandwidth
// estimate, the largest round of the one transfer of the same size that
// the connection carried before (cdn-cold's fetch, or the untimed priming
// fetch: a slow start from the sender's window).
func fetchTime(legs []leg, size int64, link func(server, client string) linkProps, paced bool) float64 {
	segs := make([]pathcomp.Segment, 0, len(legs))
	var m pathcomp.Model
	for _, l := range legs {
		p := link(l.server, l.client)
		seg := pathcomp.Segment{RTT: p.rttMS, Window: p.send, RecvWindow: p.recv, Open: l.open, Loss: p.loss, RateBps: p.rateBps}
		if l.machineBps > 0 && (seg.RateBps == 0 || l.machineBps < seg.RateBps) {
			seg.RateBps = l.machineBps
		}
		if l.restart && paced {
			// BBR has its own cong_control: the kernel's slow start
			// after idle leaves it alone, and it paces as when warm.
			l.warm = true
		}
		if l.restart && !l.warm {
			seg.RecvWindow = 0
		}
		if l.warm {
			seg.Window, seg.RecvWindow = pathcomp.WarmWindow, 0
			if paced && p.rttMS > 0 {
				peak := m.SlowStartPeak(min(p.send, p.recv), size)
				seg.PaceBps = pathcomp.BBRStartupGain * float64(peak) / p.rttMS * 1e3
			}
		}
		segs = append(segs, seg)
	}
	return m.FetchTime(segs, size)
}
