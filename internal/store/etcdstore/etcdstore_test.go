package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/etcdhttp"
	"github.com/mosto-net/mosto/internal/store"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
	"github.com/mosto-net/mosto/internal/store/storetest"
)

var _ store.Store = (*etcdstore.Store)(nil)

func TestConformance(t *testing.T) {
	eps := etcdtest.Start(t)
	n := 0
	storetest.Run(t, func(t *testing.T) store.Store {
		n++
		s, err := etcdstore.Open(context.Background(), etcdstore.Config{Endpoints: eps, Prefix: fmt.Sprintf("/t%d/", n), ID: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestDestinationsShared: a destination one controller's store writes is
// seen, and notified, through another store on the same etcd prefix.
func TestDestinationsShared(t *testing.T) {
	eps := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(id string) *etcdstore.Store {
		s, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: eps, Prefix: "/shared/", ID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open("a"), open("b")
	ch := b.Watch(ctx) // returns once etcd confirmed the watches: no put can slip before them
	d := api.Destination{ID: "shop", Prefix: "198.51.100.0/24", Lat: 37.3, Lon: -121.9, ProbeAddr: "198.51.100.10:443"}
	if err := a.PutDestination(ctx, d); err != nil {
		t.Fatal(err)
	}
	storetest.WaitChange(t, ch, store.ChangeDests, 10*time.Second, "destination put through a, watched on b")
	got, err := b.Destinations(ctx)
	if err != nil || len(got) != 1 || got[0] != d {
		t.Fatalf("b.Destinations = %+v, %v; want [%+v]", got, err, d)
	}
	if err := b.DeleteDestination(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteDestination(ctx, "shop"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a.DeleteDestination after b deleted it = %v; want ErrNotFound", err)
	}
}

// TestLeadExclusive: while one store leads, another's Lead blocks; when the
// leader resigns (its context ends) the other leads.
func TestLeadExclusive(t *testing.T) {
	eps := etcdtest.Start(t)
	open := func(id string) *etcdstore.Store {
		s, err := etcdstore.Open(context.Background(), etcdstore.Config{Endpoints: eps, Prefix: "/lead/", ID: id, SessionTTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open("a"), open("b")
	actx, acancel := context.WithCancel(context.Background())
	defer acancel()
	la, err := a.Lead(actx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	var lb context.Context
	go func() {
		var err error
		lb, err = b.Lead(bctx)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second Lead returned (%v) while the first leads", err)
	case <-time.After(500 * time.Millisecond):
	}
	acancel()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second Lead did not return within 10s of the first resigning")
	}
	if la.Err() == nil {
		t.Error("first leader's context still live after resigning")
	}
	if lb.Err() != nil {
		t.Error("new leader's context is done")
	}
}

// TestEndpoints: a dead endpoint before a live one is skipped; only dead
// endpoints fail Open promptly with a clear error; mutual TLS works.
func TestEndpoints(t *testing.T) {
	ctx := context.Background()
	live := etcdtest.Start(t)
	s, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{etcdtest.DeadEndpoint(t), live[0]}, DialTimeout: time.Second})
	if err != nil {
		t.Fatalf("Open with a dead first endpoint: %v", err)
	}
	defer s.Close()
	if err := s.PutFEP(ctx, api.FEP{ID: "fra", HopAddr: "192.0.2.1:7000"}); err != nil {
		t.Fatal(err)
	}
	if feps, err := s.FEPs(ctx); err != nil || len(feps) != 1 {
		t.Fatalf("FEPs = %v, %v; want the one FEP", feps, err)
	}

	start := time.Now()
	_, err = etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{etcdtest.DeadEndpoint(t), etcdtest.DeadEndpoint(t)}, DialTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "every endpoint failed") {
		t.Errorf("Open with only dead endpoints = %v; want every endpoint failed", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open with dead endpoints took %v", d)
	}

	eps, files := etcdtest.StartTLS(t)
	tlsCfg, err := etcdhttp.TLSConfig(files.CA, files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: eps, TLS: tlsCfg})
	if err != nil {
		t.Fatalf("Open over mutual TLS: %v", err)
	}
	defer ts.Close()
	if _, err := ts.NextVersion(ctx); err != nil {
		t.Errorf("NextVersion over mutual TLS: %v", err)
	}
}
