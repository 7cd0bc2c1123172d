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

// offloadMetric prefixes the relay's handover counters
// (mosto_relay_offload_{handovers,joined,refused,retries}_total).
const offloadMetric = "mosto_relay_offload_"

// OffloadCounts reads every proxy's handover counters: FEP -> counter
// (handovers, joined, refused, retries) -> value. Proxies without offload
// report zeros.
func (s *Scenario) OffloadCounts(ctx context.Context) (map[string]map[string]float64, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: s.clients[Direct].Dial, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	out := make(map[string]map[string]float64)
	for _, p := range s.proxies {
		var m map[string]float64
		var err error
		for range 3 { // idempotent read: retried like Hops
			if m, err = s.offloadCounts(ctx, hc, p.fep); err == nil || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		out[p.fep] = m
	}
	return out, nil
}

func (s *Scenario) offloadCounts(ctx context.Context, hc *http.Client, fep string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr(fep, metricsPort)+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scenario: metrics of %s: %w", fep, err)
	}
	defer resp.Body.Close()
	m, err := parseOffloadCounts(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scenario: metrics of %s: %w", fep, err)
	}
	return m, nil
}

// parseOffloadCounts extracts the offload counters (name without prefix
// and _total -> value) from Prometheus text format.
func parseOffloadCounts(r io.Reader) (map[string]float64, error) {
	out := make(map[string]float64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), offloadMetric)
		if !ok {
			continue
		}
		name, val, ok := strings.Cut(rest, " ")
		if !ok || strings.ContainsAny(name, "{}") {
			return nil, fmt.Errorf("malformed metric line %q", sc.Text())
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("malformed metric line %q", sc.Text())
		}
		out[strings.TrimSuffix(name, "_total")] = v
	}
	return out, sc.Err()
}
