package origintest

import (
	"context"
	"net"
	"testing"

	"github.com/mosto-net/mosto/internal/origin"
)

// Start serves an origin with cfg on 127.0.0.1 (an ephemeral port) until
// t ends and returns it with its address (host:port).
func Start(t testing.TB, cfg origin.Config) (*origin.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return Serve(t, cfg, ln), ln.Addr().String()
}

// Serve serves an origin with cfg on ln until t ends (then waits for Serve
// to return; an error from it fails t).
func Serve(t testing.TB, cfg origin.Config, ln net.Listener) *origin.Server {
	t.Helper()
	s := origin.New(cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("origin: %v", err)
		}
	})
	return s
}
