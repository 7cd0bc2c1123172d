package relay_test

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// BenchmarkIdleFlowMemory opens idle flows through one proxy (service
// entry -> origin) and reports the proxy's goroutine stack and heap bytes
// per flow: go test -run '^$' -bench IdleFlowMemory ./internal/relay/
func BenchmarkIdleFlowMemory(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cfg := relaytest.Config("a")
	cfg.Hop.Listen = ""
	cfg.Services = []relay.ServiceConfig{{Listen: "127.0.0.1:0", Origin: ln.Addr().String()}}
	a := relaytest.Start(b, cfg)
	idleFlowMemory(b, ln, a.ServiceAddr(0).String(), 2000, a.ActiveConns, a.ActiveConns)
}

// idleFlowMemory opens n idle flows to addr b.N times, their origin ln
// holding the accepted connections without goroutines of its own. Once
// last() counts them all (the proxy next to the origin), it reports the
// stack and heap bytes per flow and the goroutines, then closes them and
// waits until all() (every proxy's connections) is 0.
func idleFlowMemory(b *testing.B, ln net.Listener, addr string, n int, last, all func() int) {
	b.Helper()
	for range b.N {
		held := make(chan []net.Conn, 1)
		go func() {
			var cs []net.Conn
			for len(cs) < n {
				c, err := ln.Accept()
				if err != nil {
					break
				}
				cs = append(cs, c)
			}
			held <- cs
		}()
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		var cs []net.Conn
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			cs = append(cs, c)
		}
		origin := <-held
		testenv.WaitFor(b, 10*time.Second, "flows active", func() bool { return last() == n })
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(int64(m1.StackInuse)-int64(m0.StackInuse))/float64(n), "stack-B/flow") // less after a GC: negative, not wrapped
		b.ReportMetric(float64(int64(m1.HeapInuse)-int64(m0.HeapInuse))/float64(n), "heap-B/flow")
		b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
		for _, c := range append(cs, origin...) {
			c.Close()
		}
		testenv.WaitFor(b, 10*time.Second, "flows closed", func() bool { return all() == 0 })
	}
}
