package etcdstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/controller"
	"github.com/mosto-net/mosto/internal/store/etcdstore"
	"github.com/mosto-net/mosto/internal/store/etcdstore/etcdtest"
	"github.com/mosto-net/mosto/internal/store/storetest"
)

var _ controller.Store = (*etcdstore.Store)(nil)

func TestConformance(t *testing.T) {
	eps := etcdtest.Start(t)
	n := 0
	storetest.Run(t, func(t *testing.T) controller.Store {
		n++
		s, err := etcdstore.Open(context.Background(), etcdstore.Config{Endpoints: eps, Prefix: fmt.Sprintf("/t%d/", n), ID: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
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
