package scenario

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Hops counts, for every FEP, the connections it opened per peer (a FEP id
// or "origin"), from the proxies' mosto_relay_upstream_total metric (dialed
// and pooled connections alike).
type Hops map[string]map[string]float64

// Hops reads every proxy's metrics (all at once: each read crosses the
// emulated network from the client).
func (s *Scenario) Hops(ctx context.Context) (Hops, error) {
	return s.scrapeAll(ctx, parseConnectCounts)
}

// scrapeAll reads every proxy's /metrics at once and parses each with
// parse: FEP -> parse's map.
func (s *Scenario) scrapeAll(ctx context.Context, parse func(io.Reader) (map[string]float64, error)) (map[string]map[string]float64, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: s.clients[Direct].Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	type res struct {
		fep string
		m   map[string]float64
		err error
	}
	ch := make(chan res, len(s.proxies))
	for _, p := range s.proxies {
		go func() {
			// A read is idempotent: try again when one fails (on a
			// loaded machine a lost SYN alone costs 1 s + 2 s of
			// retransmission, and a CI run lost a scrape to its 5 s
			// timeout).
			var m map[string]float64
			var err error
			for range 3 {
				if m, err = s.scrape(ctx, hc, p.fep, parse); err == nil || ctx.Err() != nil {
					break
				}
			}
			ch <- res{p.fep, m, err}
		}()
	}
	out := make(map[string]map[string]float64)
	var errs []error
	for range s.proxies {
		r := <-ch
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		out[r.fep] = r.m
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// scrape reads one proxy's /metrics and parses it with parse.
func (s *Scenario) scrape(ctx context.Context, hc *http.Client, fep string, parse func(io.Reader) (map[string]float64, error)) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr(fep, metricsPort)+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scenario: metrics of %s: %w", fep, err)
	}
	defer resp.Body.Close()
	m, err := parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scenario: metrics of %s: %w", fep, err)
	}
	return m, nil
}

const connectMetric = "mosto_relay_upstream_total{"

// parseConnectCounts extracts peer -> count from Prometheus text format.
func parseConnectCounts(r io.Reader) (map[string]float64, error) {
	out := make(map[string]float64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, connectMetric) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("malformed metric line %q", line)
		}
		peer := ""
		for _, lbl := range strings.Split(line[len(connectMetric):end], ",") {
			if v, ok := strings.CutPrefix(lbl, `peer="`); ok {
				peer = strings.TrimSuffix(v, `"`)
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil || peer == "" {
			return nil, fmt.Errorf("malformed metric line %q", line)
		}
		out[peer] += v
	}
	return out, sc.Err()
}

// UsedChain follows, from entry, the connections opened between two
// snapshots: entry's new peer, that peer's new peer, ... until "origin". It
// returns the FEPs visited (entry first) and whether the walk reached the
// origin unambiguously (exactly one new connection at every step).
func UsedChain(before, after Hops, entry string) ([]string, bool) {
	path := []string{entry}
	cur := entry
	for range 64 {
		next, n := "", 0
		for peer, v := range after[cur] {
			if v > before[cur][peer] {
				next, n = peer, n+1
			}
		}
		if n != 1 {
			return path, false
		}
		if next == "origin" {
			return path, true
		}
		path = append(path, next)
		cur = next
	}
	return path, false
}
