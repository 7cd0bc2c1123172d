package emutest

import (
	"context"
	"runtime/debug"
	"testing"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/testenv"
)

// gcPercent is the GOGC a test with a world runs at (at least).
const gcPercent = 400

// Start brings spec's world up for a test, its threads at real-time
// priority and the garbage collector at GOGC 400 or more (gcPercent),
// and removes it with t.Cleanup, also when the test fails or panics. It
// skips the test without privileges (see testenv.RequirePrivileged).
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
	// The emulated network runs in this process: every stop-the-world of
	// its garbage collector holds every packet. Up raises GOMAXPROCS (18
	// on 2 cores) and -race makes the heap churn, so at load 19 a chaos
	// run had 254 collections whose longest pause was 954 ms (largest
	// stall 1 s); GOGC 400: 48, 94 ms (200 ms). At load 28-40 such a
	// stall (~9 s) had receivers refuse hop headers held in the emulator.
	if old := debug.SetGCPercent(gcPercent); old < 0 || old >= gcPercent {
		debug.SetGCPercent(old) // GOGC off or already higher: keep it
	} else {
		t.Cleanup(func() { debug.SetGCPercent(old) })
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("emu: close world %s: %v", w.RunID(), err)
		}
	})
	return w
}
