package router

import (
	"testing"

	"github.com/mosto-net/mosto/internal/origin"
)

// A pooled connection is taken at most PoolMaxIdle after it was made, and
// a handoff's request reaches the surrogate later still (the join, slower
// on a loaded host): the surrogate must keep a connection that waits for
// its first request well beyond that. With mosto's origin at a 10 s header
// timeout and the pool at 20 s, a pooled leg was taken as the origin closed
// it and the handed-off session got the origin's reset (TestHandoffSessions
// at load 29: "connection reset by peer", one of 500).
func TestPoolRetiresBeforeOriginTimeout(t *testing.T) {
	p, err := NewPicker(PickConfig{Surrogates: []Surrogate{{"s", "127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Mode: ModeProxy, Picker: p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if idle := r.cfg.PoolMaxIdle; 2*idle > origin.DefaultHeaderTimeout {
		t.Errorf("pooled connections are used up to %v after they were made; the origin closes a connection without a request after %v: want at least twice that", idle, origin.DefaultHeaderTimeout)
	}
}
