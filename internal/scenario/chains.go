package scenario

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Hops counts, for every FEP, the connections it opened per peer (a FEP id
// or "origin"), from the proxies' mosto_relay_connect_seconds metric.
type Hops map[string]map[string]float64

// Hops reads every proxy's metrics.
func (s *Scenario) Hops(ctx context.Context) (Hops, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: s.clients[Direct].Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	out := make(Hops)
	for _, p := range s.proxies {
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr(p.fep, metricsPort)+"/metrics", nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("scenario: metrics of %s: %w", p.fep, err)
		}
		m, err := parseConnectCounts(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("scenario: metrics of %s: %w", p.fep, err)
		}
		out[p.fep] = m
	}
	return out, nil
}

const connectMetric = "mosto_relay_connect_seconds_count{"

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
