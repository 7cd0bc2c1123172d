package emu

import (
	"context"
	"testing"

	"github.com/mosto-net/mosto/internal/testenv"
)

// Start is emutest.Start for this package's own tests (which cannot import
// emutest: it imports emu).
func Start(t testing.TB, spec *Spec) *World {
	t.Helper()
	testenv.RequirePrivileged(t)
	w, err := Up(context.Background(), spec, nil)
	if err != nil {
		t.Fatalf("emu.Up: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("emu: close world %s: %v", w.RunID(), err)
		}
	})
	return w
}
