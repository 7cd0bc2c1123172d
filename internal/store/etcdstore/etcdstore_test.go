package etcdstore_test

import (
	"context"
	"fmt"
	"testing"

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
