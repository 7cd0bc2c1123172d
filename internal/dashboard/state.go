package dashboard

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/mosto-net/mosto/internal/api"
)

// State is what the dashboard shows, as one JSON document.
type State struct {
	At           time.Time               `json:"at"`
	Controller   ControllerState         `json:"controller"`
	FEPs         []FEPView               `json:"feps"`
	Matrix       api.Matrix              `json:"matrix"`
	History      map[string][]Point      `json:"history,omitempty"` // "from>to" -> RTT changes, oldest first
	Changes      []Change                `json:"changes,omitempty"` // the newest RTT changes, newest first
	Tables       map[string]uint64       `json:"tables"`            // LoP -> table version
	Destinations []api.DestinationStatus `json:"destinations,omitempty"`
}

// ControllerState is the controller's side of a State.
type ControllerState struct {
	Leader       bool      `json:"leader"`
	Store        string    `json:"store,omitempty"` // the controller's store kind: bbolt or etcd
	Version      uint64    `json:"version"`         // highest table version
	FEPs         int       `json:"feps"`
	KeysRotated  time.Time `json:"keys_rotated"`
	KeyAgeS      float64   `json:"key_age_s"`
	ProbeEveryS  float64   `json:"probe_every_s,omitempty"`
	StoreError   string    `json:"store_error,omitempty"`
	DownAfterS   float64   `json:"down_after_s"`
	Computations uint64    `json:"-"`
}

// FEPView is one FEP with what its reports said.
type FEPView struct {
	api.FEP
	// Status: "up" (reported within DownAfter), "down" (reported before,
	// not since), "unknown" (never reported to this controller).
	Status     string          `json:"status"`
	LastReport time.Time       `json:"last_report,omitzero"`
	Stats      *api.ProxyStats `json:"stats,omitempty"`
	FlowsPerS  float64         `json:"flows_per_s"`
	BytesPerS  float64         `json:"bytes_per_s"`
	Active     float64         `json:"active"`
	Direct     float64         `json:"direct"`   // direct fallbacks since start, every reason
	Refusals   float64         `json:"refusals"` // since start, every reason
}

// Point is an RTT of a pair at a time (MS < 0: unmeasured or unreachable).
type Point struct {
	At time.Time `json:"at"`
	MS float64   `json:"ms"`
}

// Change is an RTT that changed between two polls.
type Change struct {
	At    time.Time `json:"at"`
	From  string    `json:"from"`
	To    string    `json:"to"`
	OldMS float64   `json:"old_ms"` // < 0: unmeasured
	NewMS float64   `json:"new_ms"` // < 0: unmeasured or unreachable
}

// pairKey names a directed pair in State.History.
func pairKey(from, to string) string { return from + ">" + to }

// tracker keeps what State needs across polls: previous RTTs, counters and
// the histories. Only the Dashboard's Run goroutine uses it.
type tracker struct {
	prevRTT   map[string]float64
	prevStats map[string]*api.ProxyStats
	rates     map[string][2]float64 // fep -> flows/s, bytes/s
	history   map[string][]Point
	changes   []Change
	maxHist   int
	maxChange int
}

func newTracker() *tracker {
	return &tracker{prevRTT: map[string]float64{}, prevStats: map[string]*api.ProxyStats{},
		rates: map[string][2]float64{}, history: map[string][]Point{}, maxHist: 32, maxChange: 50}
}

// build reads src and returns the new State.
func (tr *tracker) build(ctx context.Context, src Source, now time.Time, downAfter time.Duration) (*State, error) {
	feps, err := src.FEPs(ctx)
	if err != nil {
		return nil, fmt.Errorf("feps: %w", err)
	}
	m, err := src.Matrix(ctx)
	if err != nil {
		return nil, fmt.Errorf("matrix: %w", err)
	}
	h := src.Health(ctx)
	st := &State{At: now.UTC(), Matrix: m, Tables: map[string]uint64{}}
	st.Controller = ControllerState{Leader: h.Leader, Version: h.Version, FEPs: h.FEPs, DownAfterS: downAfter.Seconds()}
	if kr, err := src.KeysRotated(ctx); err != nil {
		st.Controller.StoreError = err.Error()
	} else if !kr.IsZero() {
		st.Controller.KeysRotated = kr.UTC()
		st.Controller.KeyAgeS = now.Sub(kr).Seconds()
	}
	if ds, err := src.Destinations(ctx); err == nil {
		st.Destinations = ds
	}
	for lop, t := range src.Tables() {
		st.Tables[lop] = t.Version
	}
	states := src.FEPStates()
	slices.SortFunc(feps, func(a, b api.FEP) int { return cmp.Compare(a.ID, b.ID) })
	for _, f := range feps {
		v := FEPView{FEP: f, Status: "unknown"}
		if s, ok := states[f.ID]; ok {
			v.LastReport = s.LastReport.UTC()
			v.Status = "up"
			if now.Sub(s.LastReport) > downAfter {
				v.Status = "down"
			}
			if s.Stats != nil {
				v.Stats = s.Stats
				v.Active = api.Sum(s.Stats.Active)
				v.Direct = api.Sum(s.Stats.Direct)
				v.Refusals = api.Sum(s.Stats.Refusals)
				tr.rate(f.ID, s.Stats)
				r := tr.rates[f.ID]
				v.FlowsPerS, v.BytesPerS = r[0], r[1]
			}
		}
		st.FEPs = append(st.FEPs, v)
	}
	tr.diffMatrix(m, now)
	st.History = make(map[string][]Point, len(tr.history))
	for k, h := range tr.history {
		st.History[k] = slices.Clone(h)
	}
	st.Changes = slices.Clone(tr.changes)
	return st, nil
}

// rate updates the flows/s and bytes/s of fep from two successive pushes.
func (tr *tracker) rate(fep string, s *api.ProxyStats) {
	p := tr.prevStats[fep]
	if p != nil && p.At.Equal(s.At) {
		return // the same push as last poll: keep the rate
	}
	tr.prevStats[fep] = s
	if p == nil || !p.Started.Equal(s.Started) || !s.At.After(p.At) {
		tr.rates[fep] = [2]float64{}
		return
	}
	dt := s.At.Sub(p.At).Seconds()
	df := api.Sum(s.Flows) - api.Sum(p.Flows)
	db := s.Bytes - p.Bytes
	tr.rates[fep] = [2]float64{max(df, 0) / dt, max(db, 0) / dt}
}

// diffMatrix records the pairs whose RTT changed since the last poll.
func (tr *tracker) diffMatrix(m api.Matrix, now time.Time) {
	seen := make(map[string]bool, len(tr.prevRTT))
	first := len(tr.prevRTT) == 0
	for i, a := range m.Names {
		for j, b := range m.Names {
			if i == j || i >= len(m.RTTMS) || j >= len(m.RTTMS[i]) {
				continue
			}
			k := pairKey(a, b)
			v := -1.0
			if p := m.RTTMS[i][j]; p != nil {
				v = *p
			}
			old, had := tr.prevRTT[k]
			seen[k] = true
			if had && old == v || !had && v < 0 {
				continue
			}
			tr.prevRTT[k] = v
			h := append(tr.history[k], Point{At: now.UTC(), MS: v})
			if len(h) > tr.maxHist {
				h = h[len(h)-tr.maxHist:]
			}
			tr.history[k] = h
			if first && !had {
				continue // the state at start is no change
			}
			if !had {
				old = -1
			}
			tr.changes = append([]Change{{At: now.UTC(), From: a, To: b, OldMS: old, NewMS: v}}, tr.changes...)
			if len(tr.changes) > tr.maxChange {
				tr.changes = tr.changes[:tr.maxChange]
			}
		}
	}
	for k := range tr.prevRTT {
		if !seen[k] { // a FEP left
			delete(tr.prevRTT, k)
			delete(tr.history, k)
		}
	}
}

// sameContent reports whether a and b differ only in their time stamps
// that move on every poll (At, key age).
func sameContent(a, b *State) bool {
	if a == nil || b == nil {
		return false
	}
	x, y := *a, *b
	x.At, y.At = time.Time{}, time.Time{}
	x.Controller.KeyAgeS, y.Controller.KeyAgeS = 0, 0
	bx, err1 := json.Marshal(x)
	by, err2 := json.Marshal(y)
	return err1 == nil && err2 == nil && string(bx) == string(by)
}
