package testenv

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
)

// WaitFor polls cond every 10 ms until it holds, and fails t with what if it
// still does not after d. It waits for an event a test cannot be told about
// (a counter reaching a value, a socket closing); d is a bound, not a pace.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Logger returns a logger writing Warn and above to t's log; with
// MOSTO_TEST_LOG=debug (or info) in the environment, from that level.
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if v := os.Getenv("MOSTO_TEST_LOG"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			t.Fatalf("MOSTO_TEST_LOG=%q: %v", v, err)
		}
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
