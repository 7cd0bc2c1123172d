package api

import (
	"fmt"
	"math"
	"time"
)

// Limits of the proxy counters a report carries.
const (
	MaxStatKeys   = 64   // entries in each map of ProxyStats
	MaxStatKeyLen = 64   // bytes of a map key
	MaxStatValue  = 1e18 // larger counters are a bug
)

// ProxyStats are the relay counters of a proxy, pushed with its reports so
// that the controller (and its dashboard) sees every FEP without scraping
// FEPs it may not reach. Counters count since Started: a smaller value with
// a newer Started is a restart, not a negative rate.
type ProxyStats struct {
	Started time.Time `json:"started"` // when the proxy process started
	At      time.Time `json:"at"`      // when the counters were read
	// TableVersion is the version of the chain table the proxy uses.
	TableVersion uint64 `json:"table_version"`
	// Flows are the flows ended, by outcome (ok, reset, idle, ...), all roles.
	Flows map[string]float64 `json:"flows,omitempty"`
	// FlowsByRole are the flows ended, by role (inp, trp, egp).
	FlowsByRole map[string]float64 `json:"flows_by_role,omitempty"`
	// Bytes relayed, all roles, both directions.
	Bytes float64 `json:"bytes"`
	// Active are the flows in progress, by role.
	Active map[string]float64 `json:"active,omitempty"`
	// Refusals are the connections refused, by reason.
	Refusals map[string]float64 `json:"refusals,omitempty"`
	// Direct are the flows the InP sent straight to the origin, by reason.
	Direct map[string]float64 `json:"direct,omitempty"`
	// Pool are the pooled connections asked for, by "pool/result" (hop/hit...).
	Pool map[string]float64 `json:"pool,omitempty"`
}

// Validate reports the first problem of s, or nil.
func (s *ProxyStats) Validate(now time.Time) error {
	if s.At.After(now.Add(MaxClockSkew)) {
		return fmt.Errorf("at %s is in the future", s.At.Format(time.RFC3339))
	}
	if err := validStat("bytes", s.Bytes); err != nil {
		return err
	}
	for name, m := range map[string]map[string]float64{"flows": s.Flows, "flows_by_role": s.FlowsByRole,
		"active": s.Active, "refusals": s.Refusals, "direct": s.Direct, "pool": s.Pool} {
		if len(m) > MaxStatKeys {
			return fmt.Errorf("%s: %d entries > %d", name, len(m), MaxStatKeys)
		}
		for k, v := range m {
			if k == "" || len(k) > MaxStatKeyLen {
				return fmt.Errorf("%s: key %q: want 1..%d bytes", name, k, MaxStatKeyLen)
			}
			if err := validStat(name+"["+k+"]", v); err != nil {
				return err
			}
		}
	}
	return nil
}

func validStat(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > MaxStatValue {
		return fmt.Errorf("%s %v: want 0..%g", name, v, MaxStatValue)
	}
	return nil
}

// Sum is the sum of the values of m.
func Sum(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

// FEPState is what a controller knows of a FEP from its reports.
type FEPState struct {
	LastReport time.Time   `json:"last_report"` // zero: no report to this controller yet
	Stats      *ProxyStats `json:"stats,omitempty"`
}
