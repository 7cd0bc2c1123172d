package scenario

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// offloadMetric prefixes the relay's handover counters
// (mosto_relay_offload_{handovers,joined,refused,retries}_total).
const offloadMetric = "mosto_relay_offload_"

// OffloadCounts reads every proxy's handover counters: FEP -> counter
// (handovers, joined, refused, retries) -> value. Proxies without offload
// report zeros.
func (s *Scenario) OffloadCounts(ctx context.Context) (map[string]map[string]float64, error) {
	return s.scrapeAll(ctx, parseOffloadCounts)
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
