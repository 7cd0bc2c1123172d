package getbench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/origin"
)

// Shared is one run of the shared-bottleneck experiment: one or two
// sub-flows of mosto get cross one bottleneck beside one competing TCP
// flow, another sub-flow has a path of its own.
type Shared struct {
	Mode       SharedMode
	Seconds    float64     // the download
	Ours       float64     // MB/s of the two sub-flows through the bottleneck
	Competitor float64     // MB/s of the competing TCP flow over the same time
	Solo       float64     // MB/s of the disjoint sub-flow, middle 60% of the download
	Stats      *mget.Stats `json:"-"` // in Result
}

// SharedMode is how many sub-flows cross the bottleneck, and whether they
// are coupled.
type SharedMode int

const (
	OnePath    SharedMode = iota // one sub-flow through the bottleneck
	TwoPaths                     // two independent sub-flows
	TwoCoupled                   // two sub-flows of one group
)

func (m SharedMode) String() string {
	return [...]string{"1 sub-flow", "2 sub-flows, independent", "2 sub-flows, coupled"}[m]
}

// SharedBottleneck downloads size bytes of seed-3 objects with mosto get
// from sharedURL over the sub-flows of mode and from soloURL over one,
// while one TCP flow
// downloads from competeURL (an object larger than it can finish) through
// the same bottleneck as sharedURL. The competitor starts with the
// download (all flows in slow start together: a CUBIC flow that has run
// alone for a while takes tens of seconds to give up its share) and runs
// until it ends; its rate is counted over the download's time.
// dial reaches the sources from the client; out is the file written.
func SharedBottleneck(ctx context.Context, dial mget.DialFunc, sharedURL, soloURL, competeURL string, size int64, mode SharedMode, out string) (Shared, error) {
	res := Shared{Mode: mode}
	u, err := url.Parse(competeURL)
	if err != nil {
		return res, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := dial(cctx, "tcp", u.Host)
	if err != nil {
		return res, fmt.Errorf("competitor: %w", err)
	}
	stop := context.AfterFunc(cctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.RequestURI(), u.Host); err != nil {
		return res, fmt.Errorf("competitor: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return res, fmt.Errorf("competitor: %w", err)
	}
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer resp.Body.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	group := ""
	if mode == TwoCoupled {
		group = "shared"
	}
	srcs := []mget.Source{{URL: soloURL, Path: "solo", Dial: dial}, {URL: sharedURL, Path: "shared 1", Group: group, Dial: dial}}
	if mode != OnePath {
		srcs = append(srcs, mget.Source{URL: sharedURL, Path: "shared 2", Group: group, Dial: dial})
	}
	sum := origin.Sum(3, size)
	defer os.Remove(out)
	before := got.Load()
	start := time.Now()
	st, err := mget.Get(ctx, mget.Config{Sources: srcs, Out: out, SHA256: sum[:]})
	res.Seconds = time.Since(start).Seconds()
	res.Stats = st
	res.Competitor = float64(got.Load()-before) / res.Seconds / 1e6
	if err != nil {
		return res, err
	}
	if resp.ContentLength >= 0 && got.Load() >= resp.ContentLength {
		return res, fmt.Errorf("competitor ended before the download (%d bytes): give it a larger object", got.Load())
	}
	for _, sf := range st.Subflows[1:] {
		res.Ours += float64(sf.Bytes+sf.DupBytes) / res.Seconds / 1e6
	}
	var n int
	for _, s := range st.Samples {
		if s.T >= 0.2*res.Seconds && s.T <= 0.8*res.Seconds && len(s.MBps) > 0 {
			res.Solo += s.MBps[0]
			n++
		}
	}
	if n > 0 {
		res.Solo /= float64(n)
	}
	return res, nil
}

// cubicListener sets CUBIC on every accepted connection (the emulator's
// default is the machine's, BBR).
type cubicListener struct{ net.Listener }

func (l cubicListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, "cubic") })
		}
	}
	return c, nil
}
