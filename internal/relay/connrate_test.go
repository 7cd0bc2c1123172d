package relay_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// BenchmarkConnRate measures short flows (64-byte request, 8-byte reply)
// through one proxy: go test -run '^$' -bench ConnRate ./internal/relay/
func BenchmarkConnRate(b *testing.B) {
	o := testenv.NewServer(b, func(c *net.TCPConn) {
		n, _ := io.Copy(io.Discard, c)
		c.Write([]byte{byte(n), 0, 0, 0, 0, 0, 0, 0})
	})
	cfg := relaytest.Config("a")
	cfg.Hop.Listen = ""
	cfg.Services = []relay.ServiceConfig{{Listen: "127.0.0.1:0", Origin: o.Addr()}}
	a := relaytest.Run(b, cfg)
	addr := a.ServiceAddr(0).String()
	msg := make([]byte, 64)
	b.ResetTimer()
	var wg sync.WaitGroup
	jobs := make(chan struct{})
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply := make([]byte, 8)
			for range jobs {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Error(err)
					return
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				c.Write(msg)
				c.(*net.TCPConn).CloseWrite()
				if _, err := io.ReadFull(c, reply); err != nil {
					b.Error(err)
				}
				c.Close()
			}
		}()
	}
	for range b.N {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
}
