package scenario

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Cold modes: each fetch is the first flow after every proxy (re)started,
// with the FEPs' TCP metrics (Fast Open cookies, cached ssthresh and RTT)
// flushed, so no pool, cookie or cached window helps it.
const (
	// ChainCold is the chain with the run's levers (Config.Tune), cold: pools
	// empty or filling, no Fast Open cookie.
	ChainCold Mode = "mosto-cold"
	// ChainPlain is the plain chain, cold: the proxies restarted without any
	// lever (no pools, no Fast Open, kernel default initcwnd, rmem and
	// congestion control), as in the paper.
	ChainPlain Mode = "mosto-plain"
)

// coldState is what the scenario needs to switch the FEPs between the
// levers and the plain setup.
type coldState struct {
	plain bool              // the proxies run the plain configuration
	route map[string]string // FEP -> its route line before tuning
	sysct map[string]map[string]string
	// settle: a non-cold fetch waits until then, so that pools refilled
	// after a cold restart.
	settle time.Time
	// pooled counts hops served from a pool, per cold mode (a cold flow
	// may find a pool the proxies filled while starting).
	pooled map[Mode]int
	flows  map[Mode]int
}

// isCold reports whether m restarts the proxies before its fetch.
func isCold(m Mode) bool { return m == ChainCold || m == ChainPlain }

// configPath returns the proxy configuration file of fep (plain: without
// levers).
func (s *Scenario) configPath(fep string, plain bool) string {
	if plain {
		return filepath.Join(s.dir, "proxy-"+fep+"-plain.yaml")
	}
	return filepath.Join(s.dir, "proxy-"+fep+".yaml")
}

// restartCold stops every proxy, sets the FEPs' tuning for plain or the
// levers, flushes the FEPs' TCP metrics, starts every proxy again and waits
// until each accepts connections. The table (static file, or the agent's
// persisted one) is loaded at start, so the first flow takes the chain.
func (s *Scenario) restartCold(ctx context.Context, plain bool) error {
	var wg sync.WaitGroup
	for _, p := range s.proxies {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(false) }()
	}
	wg.Wait()
	if plain != s.cold.plain {
		if err := s.applyTune(ctx, plain); err != nil {
			return err
		}
		s.cold.plain = plain
	}
	for _, f := range s.roles.FEPs {
		if out, err := s.w.Command(ctx, f, "ip", "tcp_metrics", "flush", "all").CombinedOutput(); err != nil {
			return fmt.Errorf("scenario: flush tcp metrics on %s: %v: %s", f, err, out)
		}
	}
	for i, p := range s.proxies {
		np, err := s.spawn(p.fep, p.logf, p.fep, "proxy", "--config", s.configPath(p.fep, plain))
		if err != nil {
			return err
		}
		s.proxies[i] = np
	}
	for _, p := range s.proxies {
		if err := s.waitAccept(ctx, s.roles.Client, s.addr(p.fep, metricsPort)); err != nil {
			return err
		}
	}
	return nil
}

// prepare brings the proxies into the state mode measures: a fresh restart
// for the cold modes; for the others the levers configuration, restarted if
// the last cold fetch left the plain one, and pools given time to refill.
func (s *Scenario) prepare(ctx context.Context, mode Mode) error {
	if isCold(mode) {
		return s.restartCold(ctx, mode == ChainPlain)
	}
	if mode != Chain && mode != Single {
		return nil
	}
	if s.cold.plain {
		if err := s.restartCold(ctx, false); err != nil {
			return err
		}
		s.cold.settle = time.Now().Add(time.Second)
	}
	if d := time.Until(s.cold.settle); d > 0 {
		return sleepCtx(ctx, d)
	}
	return nil
}

// afterCold records how many hops of a cold flow were served from pools
// (the proxies' counters started at zero with the restart).
func (s *Scenario) afterCold(ctx context.Context, mode Mode) {
	if s.cold.pooled == nil {
		s.cold.pooled, s.cold.flows = make(map[Mode]int), make(map[Mode]int)
	}
	s.cold.flows[mode]++
	n, err := s.pooledHops(ctx)
	if err == nil {
		s.cold.pooled[mode] += n
	}
	// The next warm fetch finds the pools refilled.
	s.cold.settle = time.Now().Add(time.Second)
}

// ColdPooled returns, for a cold mode, the number of its flows and the
// number of hops (of all its flows together) served from a pool.
func (s *Scenario) ColdPooled(m Mode) (flows, pooledHops int) {
	return s.cold.flows[m], s.cold.pooled[m]
}

// pooledHops sums mosto_relay_upstream_total{via="pool"} over the proxies.
func (s *Scenario) pooledHops(ctx context.Context) (int, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: s.clients[Direct].Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	total := 0
	for _, p := range s.proxies {
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr(p.fep, metricsPort)+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, fmt.Errorf("scenario: metrics of %s: %w", p.fep, err)
		}
		n, err := parsePooled(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("scenario: metrics of %s: %w", p.fep, err)
		}
		total += n
	}
	return total, nil
}

// parsePooled sums the mosto_relay_upstream_total samples with via="pool".
func parsePooled(r io.Reader) (int, error) {
	total := 0.0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, connectMetric) || !strings.Contains(line, `via="pool"`) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return 0, fmt.Errorf("malformed metric line %q", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			return 0, fmt.Errorf("malformed metric line %q", line)
		}
		total += v
	}
	return int(total), sc.Err()
}
