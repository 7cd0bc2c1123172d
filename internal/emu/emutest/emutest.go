package emutest

import (
	"context"
	"testing"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/testenv"
)

// Start brings spec's world up for a test, its threads at real-time
// priority, and removes it with t.Cleanup,
// also when the test fails or panics. It skips the test without privileges
// (see testenv.RequirePrivileged).
func Start(t testing.TB, spec *emu.Spec) *emu.World {
	t.Helper()
	testenv.RequirePrivileged(t)
	// Tests assert delays, loss and rates: the emulator's threads run at
	// real-time priority so other work on a busy machine (parallel test
	// packages) does not shift them (emu.UpOptions.Realtime).
	w, err := emu.UpWith(context.Background(), spec, nil, emu.UpOptions{Realtime: true})
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
