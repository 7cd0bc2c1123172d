package relay

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"golang.org/x/sys/unix"
)

// countBytes is a byteCounter for tests.
type countBytes struct{ n float64 }

func (c *countBytes) Add(v float64) { c.n += v }

// TestSpliceBulk: a bulk direction moves every byte in order through
// pooled pipes, counts them, ends at the source's EOF, and leaves its
// empty pipe in the pool; a second direction reuses it.
func TestSpliceBulk(t *testing.T) {
	pool := newPipePool(2)
	defer pool.drain()
	for round := range 2 {
		client, down := testenv.TCPPair(t)
		up, origin := testenv.TCPPair(t)
		p := &pipe{down: down, up: up, pipes: pool}
		data := make([]byte, 24<<20+12345) // not a multiple of any buffer
		for i := range data {
			data[i] = byte(rand.Uint32())
		}
		go func() {
			client.Write(data)
			client.CloseWrite()
		}()
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(origin)
			got <- b
		}()
		var n countBytes
		if err := p.spliceBulk(up, down, &n); err != nil {
			t.Fatalf("round %d: spliceBulk: %v", round, err)
		}
		up.CloseWrite()
		b := <-got
		if len(b) != len(data) || sha256.Sum256(b) != sha256.Sum256(data) {
			t.Fatalf("round %d: origin got %d bytes (sum equal: %v), want the client's %d", round, len(b), bytes.Equal(b, data), len(data))
		}
		if int(n.n) != len(data) {
			t.Errorf("round %d: counted %v bytes, want %d", round, n.n, len(data))
		}
		if len(pool.free) != 1 {
			t.Errorf("round %d: %d pipes pooled after the flow, want its 1 (given back, and reused)", round, len(pool.free))
		}
	}
}

// TestSpliceBulkPauseKeepsBytes: a read deadline (the offload watcher's
// pause) ends a bulk direction with os.ErrDeadlineExceeded, and every byte
// taken from the source reached the destination: what the client sent is
// what the origin got plus what is still queued at the relay, nothing is
// left in a pipe.
func TestSpliceBulkPauseKeepsBytes(t *testing.T) {
	client, down := testenv.TCPPair(t)
	up, origin := testenv.TCPPair(t)
	pool := newPipePool(2)
	defer pool.drain()
	p := &pipe{down: down, up: up, pipes: pool}
	done := make(chan error, 1)
	var n countBytes
	go func() { done <- p.spliceBulk(up, down, &n) }()

	chunk := make([]byte, 256<<10)
	sent := 0
	var got atomic.Int64
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		b := make([]byte, 1<<20)
		for {
			m, err := origin.Read(b)
			got.Add(int64(m))
			if err != nil {
				return
			}
		}
	}()
	for range 16 {
		m, err := client.Write(chunk)
		sent += m
		if err != nil {
			t.Fatal(err)
		}
	}
	down.SetReadDeadline(time.Now())
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("spliceBulk did not return after its read deadline passed")
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("spliceBulk after the pause: %v, want os.ErrDeadlineExceeded", err)
	}
	// Every byte sent is at the origin, queued at the relay, or still in
	// the client's send queue (a byte received but not yet acknowledged
	// counts twice until its ACK: wait for that); a byte left in a pipe
	// is in none of them.
	ioctl := func(c *net.TCPConn, req uint) int {
		raw, _ := c.SyscallConn()
		q := 0
		raw.Control(func(fd uintptr) { q, _ = unix.IoctlGetInt(int(fd), req) })
		return q
	}
	var where string
	testenv.WaitFor(t, 10*time.Second, "every byte sent at the origin, the relay or the client", func() bool {
		g, q, o := int(got.Load()), ioctl(down, unix.SIOCINQ), ioctl(client, unix.SIOCOUTQ)
		where = fmt.Sprintf("origin %d + relay %d + client %d = %d, sent %d", g, q, o, g+q+o, sent)
		return g+q+o == sent
	})
	t.Log(where)
	up.CloseWrite()
	<-readDone
	gotN := int(got.Load())
	if int(n.n) != gotN {
		t.Errorf("counted %v bytes, origin got %d", n.n, gotN)
	}
	if len(pool.free) != 1 {
		t.Errorf("%d pipes pooled after the pause, want 1", len(pool.free))
	}
}

// TestPipePoolBounded: the pool keeps at most its size of empty pipes and
// closes the rest, and never keeps a pipe that holds bytes.
func TestPipePoolBounded(t *testing.T) {
	pool := newPipePool(1)
	a, err := pool.get()
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.get()
	if err != nil {
		t.Fatal(err)
	}
	pool.put(a)
	pool.put(b) // full: closed
	if _, err := unix.FcntlInt(uintptr(b.w), unix.F_GETFD, 0); err == nil {
		t.Error("a pipe put into a full pool is still open")
	}
	c, _ := pool.get()
	if c != a {
		t.Error("get did not reuse the pooled pipe")
	}
	c.n = 1
	pool.put(c) // holds bytes: closed, not pooled
	if len(pool.free) != 0 {
		t.Error("a pipe holding bytes was pooled")
	}
	pool.drain()
}
