package controller

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// countingStore counts the full FEP reads.
type countingStore struct {
	store.Store
	fepReads atomic.Int64
}

func (s *countingStore) FEPs(ctx context.Context) ([]api.FEP, error) {
	s.fepReads.Add(1)
	return s.Store.FEPs(ctx)
}

// TestReportLoadLimits (issue 13 item 10): reports naming bogus peers do
// not each force a reload of every FEP from the store, and a FEP sending
// reports faster than the limit gets ErrTooMany (429) beyond the burst.
func TestReportLoadLimits(t *testing.T) {
	st := &countingStore{Store: openBolt(t)}
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	c, err := New(Config{Store: st, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	setup(t, st, line, nil)
	ctx := testCtx(t)
	if err := c.reloadFEPs(ctx); err != nil {
		t.Fatal(err)
	}
	before := st.fepReads.Load()
	for i := range 10 {
		var ss []api.Sample
		for j := range 50 {
			ss = append(ss, api.Sample{Peer: fmt.Sprintf("bogus-%d-%d", i, j), RTTMS: 5, At: now})
		}
		res, err := c.Report(ctx, api.Report{FEP: "a", Samples: ss})
		if err != nil {
			t.Fatal(err)
		}
		if res.Accepted != 0 || res.Refused != 50 {
			t.Errorf("report about bogus peers: %+v; want 0 accepted, 50 refused", res)
		}
	}
	if n := st.fepReads.Load() - before; n > 1 {
		t.Errorf("10 reports naming bogus peers within a second read every FEP %d times; want at most 1", n)
	}

	ok, limited := 0, 0
	for range 3 * c.cfg.ReportBurst {
		_, err := c.Report(ctx, api.Report{FEP: "b", Samples: []api.Sample{{Peer: "a", RTTMS: 5, At: now}}})
		switch {
		case err == nil:
			ok++
		case errors.Is(err, api.ErrTooMany):
			limited++
		default:
			t.Fatal(err)
		}
	}
	if ok != c.cfg.ReportBurst || limited != 2*c.cfg.ReportBurst {
		t.Errorf("%d reports at one instant: %d accepted, %d limited; want the burst %d accepted", 3*c.cfg.ReportBurst, ok, limited, c.cfg.ReportBurst)
	}
	now = now.Add(time.Second)
	if _, err := c.Report(ctx, api.Report{FEP: "b", Samples: []api.Sample{{Peer: "a", RTTMS: 5, At: now}}}); err != nil {
		t.Errorf("a report one second later: %v", err)
	}
	if _, err := c.Report(ctx, api.Report{FEP: "c", Samples: []api.Sample{{Peer: "a", RTTMS: 5, At: now}}}); err != nil {
		t.Errorf("another FEP's report: %v", err)
	}
}

// FuzzBackendDecoders feeds arbitrary JSON bodies through the API's strict
// decoder into the real controller's registration, report and join paths
// (issue 13): never a panic, and what the controller accepts is valid.
func FuzzBackendDecoders(f *testing.F) {
	f.Add([]byte(`{"id":"e","hop_addr":"127.0.0.1:7000","probe_addr":"127.0.0.1:7001","lat":50,"lon":8}`))
	f.Add([]byte(`{"id":"a","hop_addr":"127.0.0.1:7000","probe_addr":"127.0.0.1:7001","lat":50,"lon":8,"cert_serial":"1f"}`))
	f.Add([]byte(`{"fep":"a","samples":[{"peer":"b","rtt_ms":9.5},{"peer":"zz","rtt_ms":1}]}`))
	f.Add([]byte(`{"fep":"a","samples":[{"peer":"b","unreachable":true}],"destinations":[{"dest":"x","rtt_ms":3}]}`))
	f.Add([]byte(`{"token":"mosto1.000000000000.00000000000000000000000000000000.00","fep":{"id":"a"},"csr_pem":"x"}`))
	f.Add([]byte(`{"fep":"a","samples":[{"peer":"b","rtt_ms":1e-300}]}`))
	f.Add([]byte(`null`))
	st := openBolt(f)
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	c, err := New(Config{Store: st, LightBound: true, ReportBurst: 1 << 30, Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	setup(f, st, line, nil)
	ctx := context.Background()
	if err := c.reloadFEPs(ctx); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if fep, err := api.DecodeJSON[api.FEP](bytes.NewReader(body)); err == nil {
			if err := c.RegisterFEP(ctx, fep); err == nil {
				if fep.Validate() != nil {
					t.Fatalf("registered an invalid FEP %+v", fep)
				}
				c.DeleteFEP(ctx, fep.ID)
				setup(t, st, line, nil)
				c.reloadFEPs(ctx)
			}
		}
		if rep, err := api.DecodeJSON[api.Report](bytes.NewReader(body)); err == nil {
			res, err := c.Report(ctx, rep)
			if err == nil {
				if rep.Validate(now) != nil {
					t.Fatalf("accepted an invalid report %+v", rep)
				}
				if res.Accepted+res.Refused > len(rep.Samples)+len(rep.Destinations) {
					t.Fatalf("report of %d samples: %+v", len(rep.Samples)+len(rep.Destinations), res)
				}
			}
		}
		if jr, err := api.DecodeJSON[api.JoinRequest](bytes.NewReader(body)); err == nil {
			_ = jr.Validate()
		}
	})
}
