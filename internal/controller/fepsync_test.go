package controller

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/store"
)

// TestReportAboutNewPeer: a sample about a FEP the store has but this
// controller's list does not yet (registered a moment ago through another
// controller, or its change notification not applied yet) is stored, not
// dropped. The reporting agent counts a sent sample as delivered, so a
// dropped one was not sent again until its RTT moved past the threshold:
// the pair stayed unmeasured (startup of the issue-5 world under load).
func TestReportAboutNewPeer(t *testing.T) {
	st := openBolt(t)
	ctx := testCtx(t)
	setup(t, st, line[:2], nil)
	c, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Report(ctx, api.Report{FEP: "a", Samples: []api.Sample{{Peer: "b", RTTMS: 5}}}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutFEP(ctx, line[2]); err != nil { // c, behind this controller's back
		t.Fatal(err)
	}
	res, err := c.Report(ctx, api.Report{FEP: "a", Samples: []api.Sample{{Peer: "c", RTTMS: 7}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Accepted != 1 {
		t.Errorf("Report about c accepted %d samples; want 1", res.Accepted)
	}
	m, err := c.Matrix(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i, j := slices.Index(m.Names, "a"), slices.Index(m.Names, "c")
	if i < 0 || j < 0 || m.RTTMS[i][j] == nil || *m.RTTMS[i][j] != 7 {
		t.Errorf("matrix a -> c = %v (names %v); want 7 ms", m.RTTMS, m.Names)
	}
	// A sample about a FEP nobody registered is still dropped.
	if res, err := c.Report(ctx, api.Report{FEP: "a", Samples: []api.Sample{{Peer: "zz", RTTMS: 7}}}); err != nil || res.Accepted != 0 {
		t.Errorf("Report about an unknown FEP = %+v, %v; want 0 accepted", res, err)
	}
}

// slowFEPs is a store whose FEPs read, once armed, returns what it read
// only after release is closed: a reload that read the store just before a
// registration and installs its list just after it.
type slowFEPs struct {
	store.Store
	armed   chan struct{} // closed by the test: the next FEPs read waits
	read    chan struct{} // closed when the waiting read has read
	release chan struct{}
}

func (s *slowFEPs) FEPs(ctx context.Context) ([]api.FEP, error) {
	feps, err := s.Store.FEPs(ctx)
	select {
	case <-s.armed:
		s.armed = nil // the test waits on read before registering: no race on armed
		close(s.read)
		<-s.release
	default:
	}
	return feps, err
}

// TestReloadKeepsConcurrentRegistration: a reload of the FEP list that read
// the store before a registration must not install its older list over the
// registered FEP (it lost the FEP until the next change notification; a
// target list or a report handled meanwhile missed it).
func TestReloadKeepsConcurrentRegistration(t *testing.T) {
	st := &slowFEPs{Store: openBolt(t), armed: make(chan struct{}), read: make(chan struct{}), release: make(chan struct{})}
	ctx := testCtx(t)
	setup(t, st.Store, line[:2], nil)
	c, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.reloadFEPs(ctx); err != nil {
		t.Fatal(err)
	}
	close(st.armed)
	done := make(chan error, 1)
	go func() { done <- c.reloadFEPs(ctx) }()
	select {
	case <-st.read:
	case <-time.After(10 * time.Second):
		t.Fatal("reload did not read the store")
	}
	if err := c.RegisterFEP(ctx, line[2]); err != nil {
		t.Fatal(err)
	}
	close(st.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	var ids []string
	for _, f := range c.feps {
		ids = append(ids, f.ID)
	}
	c.mu.Unlock()
	if !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Errorf("FEPs after a reload raced with registering c: %v; want [a b c]", ids)
	}
	ts, err := c.Targets(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ts, func(x api.Target) bool { return x.ID == "c" }) {
		t.Errorf("targets of a %v; want c among them", ts)
	}
}

var _ store.Store = (*slowFEPs)(nil)
