package boltstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/store"
	"github.com/mosto-net/mosto/internal/store/boltstore"
	"github.com/mosto-net/mosto/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "mosto.db"), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestSecondOpenFails(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mosto.db")
	s, err := boltstore.Open(p, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s2, err := boltstore.Open(p, 100*time.Millisecond); err == nil {
		s2.Close()
		t.Fatal("second Open of a held store file succeeded; want a lock timeout")
	}
}

var _ store.Store = (*boltstore.Store)(nil)
