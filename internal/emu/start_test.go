package emu

import (
	"context"
	"testing"

	"github.com/mosto-net/mosto/internal/testenv"
)

// Start is emutest.Start for this package's own tests (which cannot import
// emutest: it imports emu): real-time priority, since the tests assert
// delays and loss.
func Start(t testing.TB, spec *Spec) *World {
	t.Helper()
	testenv.RequirePrivileged(t)
	w, err := UpWith(context.Background(), spec, nil, UpOptions{Realtime: true})
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
