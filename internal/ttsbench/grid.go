package ttsbench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/pathcomp"
)

// GridConfig configures the loss x RTT grid.
type GridConfig struct {
	RTTs   []float64 // end-to-end RTTs (ms); default 2, 20, 100, 400
	Losses []float64 // end-to-end loss (%); default 0, 0.5, 2, 5
	Size   int64     // default 2 MB
	CC     string    // default cubic
}

// gridHops is the number of hops of the grid path (client r1 r2 r3 server).
const gridHops = 4

// GridCell is the result of one (RTT, loss) cell: the samples (s) per
// number of segmentation points (0 = end to end) and the model's
// predictions.
type GridCell struct {
	RTT, Loss float64
	Sample    [gridHops][]float64
	Failed    [gridHops]int
	Predicted [gridHops]float64 // seconds
}

// GridResult is the grid run.
type GridResult struct {
	Cfg    GridConfig
	Active [gridHops][]bool // relays active per number of points
	Cells  []GridCell
}

func (g *GridConfig) defaults() {
	if len(g.RTTs) == 0 {
		g.RTTs = []float64{2, 20, 100, 400}
	}
	if len(g.Losses) == 0 {
		g.Losses = []float64{0, 0.5, 2, 5}
	}
	if g.Size == 0 {
		g.Size = 2_000_000
	}
	if g.CC == "" {
		g.CC = "cubic"
	}
}

// hops of a grid cell: four equal hops whose losses compound to the
// end-to-end loss.
func gridPath(rtt, lossPct float64) []pathcomp.LossHop {
	per := 1 - math.Pow(1-lossPct/100, 1.0/gridHops)
	hops := make([]pathcomp.LossHop, gridHops)
	for i := range hops {
		hops[i] = pathcomp.LossHop{RTT: rtt / gridHops, Loss: per}
	}
	return hops
}

// bestExactly returns the relays (of the len(hops)-1) to activate for
// exactly p points that the loss model predicts fastest.
func bestExactly(m pathcomp.LossModel, hops []pathcomp.LossHop, size int64, p int) []bool {
	n := len(hops) - 1
	var best []bool
	bestT := math.Inf(1)
	for mask := 0; mask < 1<<n; mask++ {
		active := make([]bool, n)
		ones := 0
		for i := range n {
			active[i] = mask&(1<<i) != 0
			if active[i] {
				ones++
			}
		}
		if ones != p {
			continue
		}
		t, err := m.Time(pathcomp.Merge(hops, active), size)
		if err == nil && t < bestT*0.999 {
			best, bestT = active, t
		}
	}
	return best
}

func predict(m pathcomp.LossModel, hops []pathcomp.LossHop, active []bool, size int64) float64 {
	t, err := m.Time(pathcomp.Merge(hops, active), size)
	if err != nil {
		return math.NaN()
	}
	sum := 0.0
	for _, h := range hops {
		sum += h.RTT
	}
	// Plus one end-to-end round trip of setup (handshake and request).
	return (t + sum) / 1000
}

// RunGrid runs the grid: one world c - r1 - r2 - r3 - s, a transparent
// proxy on every relay host; the relays active for p points (chosen by the
// loss model) intercept server port portGrid+p, so every configuration
// runs side by side in one world, interleaved per trial.
func RunGrid(ctx context.Context, cfg Config, g GridConfig) (*GridResult, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	g.defaults()
	model := pathcomp.LossModel{RateMbit: cfg.RateMbit}
	res := &GridResult{Cfg: g}
	// Equal hops: the choice is the same in every cell (checked below).
	ref := gridPath(100, 1)
	res.Active[0] = make([]bool, gridHops-1)
	for p := 1; p < gridHops; p++ {
		res.Active[p] = bestExactly(model, ref, g.Size, p)
	}
	names := []string{"c", "r1", "r2", "r3", "s"}
	spec := &emu.Spec{Name: "ttsgrid", TCP: emu.TCP{Congestion: g.CC}}
	for _, n := range names {
		spec.Hosts = append(spec.Hosts, emu.HostSpec{Name: n})
	}
	for i := range gridHops {
		spec.Links = append(spec.Links, linkSpec(names[i], names[i+1], 1, 0, 0, cfg.RateMbit, cfg.JitterGSO))
	}
	// Every non-adjacent pair goes along the line.
	for i := range names {
		for j := i + 2; j < len(names); j++ {
			spec.Routes = append(spec.Routes, emu.RouteSpec{From: names[i], To: names[j], Via: names[i+1 : j]})
		}
	}
	w, err := emu.UpWith(ctx, spec, cfg.Log, emu.UpOptions{Realtime: cfg.Realtime})
	if err != nil {
		return nil, err
	}
	l := &lab{cfg: &cfg, w: w, size: g.Size}
	defer l.close()
	if err := l.sysctls(ctx); err != nil {
		return nil, err
	}
	for p := range gridHops {
		if err := l.serve(ctx, uint16(portGrid+p)); err != nil {
			return nil, err
		}
	}
	for i := 1; i < gridHops; i++ {
		var ports []int
		for p := 1; p < gridHops; p++ {
			if res.Active[p][i-1] {
				ports = append(ports, portGrid+p)
			}
		}
		if len(ports) == 0 {
			continue
		}
		h := names[i]
		if err := l.proxy(ctx, h, proxyConf(h, ports, nil, g.CC, &cfg), netip.AddrPortFrom(w.Addr(h), portTP)); err != nil {
			return nil, err
		}
	}
	s := w.Addr("s")
	for _, rtt := range g.RTTs {
		for _, loss := range g.Losses {
			hops := gridPath(rtt, loss)
			for i, h := range hops {
				lk := emu.Link{DelayMS: h.RTT / 2, LossPct: h.Loss * 100, RateMbit: cfg.RateMbit, QueuePkts: 1000}
				if err := w.SetLink(names[i], names[i+1], lk); err != nil {
					return nil, err
				}
			}
			cell := GridCell{RTT: rtt, Loss: loss}
			for p := range gridHops {
				cell.Predicted[p] = predict(model, hops, res.Active[p], g.Size)
			}
			start := time.Now()
			order := []int{0, 1, 2, 3}
			for range cfg.Trials {
				for _, p := range shuffled(order) {
					if err := ctx.Err(); err != nil {
						return res, err
					}
					d, err := l.fetch(ctx, netip.AddrPortFrom(s, uint16(portGrid+p)))
					if err != nil {
						cell.Failed[p]++
						cfg.Log.Warn("grid transfer failed", "rtt", rtt, "loss", loss, "points", p, "err", err)
						continue
					}
					cell.Sample[p] = append(cell.Sample[p], secs(d))
				}
			}
			res.Cells = append(res.Cells, cell)
			fmt.Fprintf(cfg.Progress, "grid: RTT %g ms loss %g%%: %d trials in %v\n", rtt, loss, cfg.Trials, time.Since(start).Round(time.Second))
		}
	}
	return res, nil
}
