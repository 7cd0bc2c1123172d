package emutest

import (
	"context"
	"testing"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/testenv"
)

// Start brings spec's world up for a test and removes it with t.Cleanup,
// also when the test fails or panics. It skips the test without privileges
// (see testenv.RequirePrivileged).
func Start(t testing.TB, spec *emu.Spec) *emu.World {
	t.Helper()
	testenv.RequirePrivileged(t)
	w, err := emu.Up(context.Background(), spec, nil)
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
