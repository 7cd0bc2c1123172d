package proxybench

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// latencies runs n short connections to addr one after another (dial,
// send payload, half-close, read the 8-byte count, close) and returns the
// time of each one that succeeded, from dial to the count, sorted.
func latencies(ctx context.Context, addr string, n, payload int) (d []time.Duration, failed int, sample error) {
	msg := make([]byte, payload)
	d = make([]time.Duration, 0, n)
	for range n {
		if ctx.Err() != nil {
			break
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		err := shortConn(cctx, addr, msg)
		took := time.Since(start)
		cancel()
		if err != nil {
			failed++
			if sample == nil {
				sample = err
			}
			continue
		}
		d = append(d, took)
	}
	slices.Sort(d)
	return d, failed, sample
}

// quantile of sorted durations, in microseconds (0 for none).
func quantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return float64(sorted[i]) / 1e3
}

// latencyPhase measures the time per connection of one client running
// connections back to back (no load: what a relay adds to each connection),
// modes interleaved and rotated per run.
func latencyPhase(ctx context.Context, cfg Config, rep *Report, relays map[string]*relay) error {
	for run := 0; run < cfg.Runs; run++ {
		for _, res := range rotate(rep.Results, run) {
			r := relays[res.Mode]
			if r == nil || res.Err != "" {
				continue
			}
			d, failed, sample := latencies(ctx, r.entry, cfg.LatConns, cfg.ConnPayload)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res.LatFail += failed
			if len(d) == 0 {
				res.Err = fmt.Sprintf("latency: every connection failed: %v", sample)
				continue
			}
			res.LatP50 = append(res.LatP50, quantile(d, 0.50))
			res.LatP99 = append(res.LatP99, quantile(d, 0.99))
			cfg.Log.Info("latency", "mode", res.Mode, "run", run+1, "p50_us", int(quantile(d, 0.5)),
				"p99_us", int(quantile(d, 0.99)), "failed", failed, "first_error", sample)
		}
	}
	return nil
}
