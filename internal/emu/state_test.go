package emu

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestGC leaves a world behind as a killed owner would (a state file with a
// dead pid and its namespace) and checks that GC removes both, but not a
// live world.
func TestGC(t *testing.T) {
	testenv.RequirePrivileged(t)
	live := Start(t, mustSpec(t, "hosts: [{name: a}, {name: b}]\nlinks: [{a: a, b: b, delay_ms: 1}]"))

	var b [3]byte
	rand.Read(b[:])
	rid := hex.EncodeToString(b[:])
	ns := "mosto-" + rid + "-0"
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(DefaultStateDir, rid)
	t.Cleanup(func() {
		deleteNetns(ns)
		os.RemoveAll(dir)
	})
	if err := writeState(dir, State{RunID: rid, PID: dead.Process.Pid, StartTime: 1, Hosts: []StateHost{{Name: "x", NetNS: ns}}}); err != nil {
		t.Fatal(err)
	}
	if err := ensureNetnsDir(); err != nil {
		t.Fatal(err)
	}
	if err := createNetns(ns, nil); err != nil {
		t.Fatal(err)
	}
	removed, err := GC(DefaultStateDir, nil)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if !slices.Contains(removed, ns) {
		t.Errorf("GC removed %v; want it to include %s", removed, ns)
	}
	if _, err := os.Stat(nsPath(ns)); err == nil {
		t.Errorf("namespace %s survived GC", ns)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("state dir %s survived GC", dir)
	}
	for _, h := range live.Hosts() {
		if slices.Contains(removed, live.NetNS(h)) {
			t.Errorf("GC removed %s of a live world", live.NetNS(h))
		}
		if _, err := os.Stat(nsPath(live.NetNS(h))); err != nil {
			t.Errorf("live world's namespace %s is gone after GC", live.NetNS(h))
		}
	}
}

func TestRunIDInUse(t *testing.T) {
	testenv.RequirePrivileged(t)
	spec := mustSpec(t, "hosts: [{name: a}]")
	w := Start(t, spec)
	_, err := UpWith(t.Context(), spec, nil, UpOptions{RunID: w.RunID()})
	if err == nil {
		t.Fatal("a second world with the same run id came up")
	}
	// The failed attempt must not have removed the first world's state.
	if _, err := os.Stat(filepath.Join(DefaultStateDir, w.RunID(), "state.json")); err != nil {
		t.Errorf("state of the running world is gone: %v", err)
	}
	if _, err := os.Stat(nsPath(w.NetNS("a"))); err != nil {
		t.Errorf("namespace of the running world is gone: %v", err)
	}
}
