package routerbench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/stats"
)

// portPlain is a plain server on rr (accept and close): the handshake
// baseline on the router's own host.
const portPlain = 8081

// handshakes measures Handshakes connects (the client's connect() until
// the SYN-ACK, then a close) to the handoff router, a plain server on the
// same host (rr) and the surrogate s1 (direct), interleaved round by round
// in a rotating order, and reports the medians and the paired
// differences: the "within 0.1 ms of a plain server".
func (b *bench) handshakes(ctx context.Context, out io.Writer) error {
	w := b.w
	ln, err := w.Listen(ctx, "rr", "tcp", hostPort(w, "rr", portPlain))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	h := b.cfg.Hops[0]
	b.cur = h
	targets := []struct{ name, addr string }{
		{"handoff router (rr)", hostPort(w, "rr", portHandoff)},
		{"plain server (rr)", hostPort(w, "rr", portPlain)},
		{"direct (s1, nginx)", hostPort(w, "s1", portCache)},
	}
	res := make([][]float64, len(targets))
	err = w.Do(clientName(h), func() error {
		d := &net.Dialer{}
		for r := range b.cfg.Handshakes {
			for k := range targets {
				i := (k + r) % len(targets)
				dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				t := time.Now()
				c, err := d.DialContext(dctx, "tcp", targets[i].addr)
				el := time.Since(t)
				cancel()
				if err != nil {
					return fmt.Errorf("handshake %s run %d: %w", targets[i].name, r, err)
				}
				c.Close()
				res[i] = append(res[i], ms(el))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "## Handshake: %d connects per target, %s, interleaved\n\n", b.cfg.Handshakes, b.label(h))
	fmt.Fprintf(out, "| target | median ms (p10-p90) | paired difference router - target: median ms [95%% CI] | A12 router vs target | Mann-Whitney p |\n|---|---|---|---|---|\n")
	for i, t := range targets {
		diff, a12, p := "", "", ""
		if i > 0 {
			d := make([]float64, len(res[0]))
			for k := range d {
				d[k] = res[0][k] - res[i][k]
			}
			lo, hi := medianCI(d)
			diff = fmt.Sprintf("%+.3f [%+.3f, %+.3f]", stats.Median(d), lo, hi)
			a12 = fmt.Sprintf("%.2f", stats.A12(res[0], res[i]))
			if mw, err := stats.MannWhitneyU(res[0], res[i]); err == nil {
				p = fmt.Sprintf("%.2g", mw.P)
			}
		}
		fmt.Fprintf(out, "| %s | %.3f (%.3f-%.3f) | %s | %s | %s |\n", t.name, stats.Median(res[i]), stats.Percentile(res[i], 10), stats.Percentile(res[i], 90), diff, a12, p)
	}
	fmt.Fprintln(out)
	return nil
}

// medianCI is a percentile bootstrap 95% interval of xs's median (2000
// resamples, fixed seed: the report is reproducible from the samples).
func medianCI(xs []float64) (lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	meds := make([]float64, 2000)
	s := make([]float64, len(xs))
	for i := range meds {
		for k := range s {
			s[k] = xs[rng.IntN(len(xs))]
		}
		meds[i] = stats.Median(s)
	}
	slices.Sort(meds)
	return stats.Percentile(meds, 2.5), stats.Percentile(meds, 97.5)
}
