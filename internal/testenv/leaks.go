package testenv

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// NetnsDir is where named network namespaces live (`ip netns add`).
const NetnsDir = "/run/netns"

// CheckLeaks records the goroutines and open file descriptors now and, when
// t ends, fails t if they did not come back down within 10 s (a goroutine
// dump names the ones left). With netnsPrefixes it also fails if a named
// network namespace with one of those prefixes (the ones this test
// creates) appeared and was not deleted.
//
// Call it first in the test, so its cleanup runs after every other one.
// It measures the whole process, so it suits tests that do not run in
// parallel with other tests of their package (t.Parallel); packages of the
// same `go test ./...` run are separate processes and do not disturb it.
// A test that already failed is not checked (its cleanup may be partial).
func CheckLeaks(t testing.TB, netnsPrefixes ...string) {
	t.Helper()
	checkLeaks(t, 10*time.Second, netnsPrefixes)
}

func checkLeaks(t testing.TB, wait time.Duration, netnsPrefixes []string) {
	g0, f0 := runtime.NumGoroutine(), OpenFDs(t)
	ns0 := namespaces(netnsPrefixes)
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		var g, f int
		deadline := time.Now().Add(wait)
		for {
			runtime.GC()
			g, f = runtime.NumGoroutine(), OpenFDs(t)
			if g <= g0 && f <= f0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if g > g0 {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Errorf("leak: goroutines: %d before, %d after\n%s", g0, g, buf[:n])
		}
		if f > f0 {
			t.Errorf("leak: open fds: %d before, %d after%s", f0, f, fdList())
		}
		for _, ns := range namespaces(netnsPrefixes) {
			if !slices.Contains(ns0, ns) {
				t.Errorf("leak: network namespace %s/%s left behind", NetnsDir, ns)
			}
		}
	})
}

// OpenFDs returns the number of file descriptors this process has open.
func OpenFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("count fds: %v", err)
	}
	return len(ents)
}

// fdList names the open descriptors, to say what leaked.
func fdList() string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(":")
	for _, e := range ents {
		dst, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil {
			b.WriteString(" " + e.Name() + "->" + dst)
		}
	}
	return b.String()
}

// namespaces lists the named network namespaces with one of prefixes.
func namespaces(prefixes []string) []string {
	if len(prefixes) == 0 {
		return nil
	}
	ents, _ := os.ReadDir(NetnsDir)
	var out []string
	for _, e := range ents {
		for _, p := range prefixes {
			if strings.HasPrefix(e.Name(), p) {
				out = append(out, e.Name())
				break
			}
		}
	}
	return out
}
