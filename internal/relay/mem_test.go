package relay

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// BenchmarkIdleFlowMemory opens idle flows through one proxy (service
// entry -> origin) and reports the proxy's goroutine stack and heap bytes
// per flow: go test -run '^$' -bench IdleFlowMemory ./internal/relay/
func BenchmarkIdleFlowMemory(b *testing.B) {
	const n = 2000
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cfg := baseConfig("a")
	cfg.Hop.Listen = ""
	cfg.Services = []ServiceConfig{{Listen: "127.0.0.1:0", Origin: ln.Addr().String()}}
	a := start(b, cfg)
	for range b.N {
		// The origin holds accepted connections without goroutines of its own.
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
			c, err := net.Dial("tcp", a.ServiceAddr(0).String())
			if err != nil {
				b.Fatal(err)
			}
			cs = append(cs, c)
		}
		origin := <-held
		testenv.WaitFor(b, 10*time.Second, "flows active", func() bool { return a.accept.limits.total() == n })
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(m1.StackInuse-m0.StackInuse)/n, "stack-B/flow")
		b.ReportMetric(float64(int64(m1.HeapInuse)-int64(m0.HeapInuse))/n, "heap-B/flow")
		for _, c := range append(cs, origin...) {
			c.Close()
		}
		testenv.WaitFor(b, 10*time.Second, "flows closed", func() bool { return a.accept.limits.total() == 0 })
	}
}
