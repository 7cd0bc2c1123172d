package testenv

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeT records what CheckLeaks reports instead of failing the real test.
type fakeT struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (f *fakeT) Helper()                   {}
func (f *fakeT) Failed() bool              { return false }
func (f *fakeT) Cleanup(fn func())         { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Errorf(s string, a ...any) { f.errs = append(f.errs, s) }
func (f *fakeT) Fatalf(s string, a ...any) { f.errs = append(f.errs, s) }
func (f *fakeT) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// TestCheckLeaks checks that CheckLeaks passes a clean test and catches a
// leaked goroutine and a leaked file descriptor.
func TestCheckLeaks(t *testing.T) {
	clean := &fakeT{TB: t}
	CheckLeaks(clean)
	clean.runCleanups()
	if len(clean.errs) != 0 {
		t.Errorf("clean test reported %v", clean.errs)
	}

	leaky := &fakeT{TB: t}
	checkLeaks(leaky, 200*time.Millisecond, nil)
	stop := make(chan struct{})
	go func() { <-stop }()
	f, err := os.Open(filepath.Join(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	leaky.runCleanups() // waits 200 ms for them to go away
	close(stop)
	f.Close()
	if len(leaky.errs) != 2 {
		t.Errorf("leaky test reported %d errors (%v); want goroutines and fds", len(leaky.errs), leaky.errs)
	}
}
