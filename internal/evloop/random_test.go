//go:build linux

package evloop

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// TestRandomFlows runs many flows at once with random behaviour on both
// ends: random sizes and chunking, a client that half-closes, resets, or
// goes quiet until the idle timeout, an upstream that echoes, resets part
// way or closes without reading. Whatever happens, every flow ends exactly
// once, a flow whose two ends behaved gets every byte back exact, nothing
// is left open, and the loops hold no flow afterwards.
func TestRandomFlows(t *testing.T) {
	const n = 400
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	type script struct {
		size     int
		chunk    int
		client   string // "ok", "reset", "quiet"
		upstream string // "echo", "reset", "close"
	}
	scripts := make([]script, n)
	for i := range scripts {
		s := script{size: rng.IntN(70000), chunk: 1 + rng.IntN(20000), client: "ok", upstream: "echo"}
		switch rng.IntN(10) {
		case 0:
			s.client = "reset"
		case 1:
			s.client = "quiet"
		}
		switch rng.IntN(10) {
		case 0:
			s.upstream = "reset"
		case 1:
			s.upstream = "close"
		}
		scripts[i] = s
	}
	// The upstream reads the flow's index (4 bytes) and acts on its script.
	srv := newUpServer(t, func(c *net.TCPConn) {
		c.SetDeadline(time.Now().Add(20 * time.Second))
		var idb [4]byte
		if _, err := io.ReadFull(c, idb[:]); err != nil {
			return
		}
		s := scripts[int(idb[0])<<8|int(idb[1])]
		switch s.upstream {
		case "reset":
			io.CopyN(io.Discard, c, int64(s.size/2))
			resetConn(c)
		case "close":
			c.Close()
		default:
			c.Write(idb[:])
			io.Copy(c, c)
			c.CloseWrite()
		}
	})
	h := newTestHandler(t, srv.addr)
	before := openFDs(t)
	// Idle 5 s: on a 2-core machine under -race with a load average of
	// 12, 500 ms and even 2 s ended flows that were only slow (up to 25
	// idle outcomes beyond the 10% silent clients, echoed 0 bytes).
	r := newRig(t, Config{Loops: 2, Idle: 5 * time.Second, Bulk: true}, h)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for i, s := range scripts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", r.addr, 10*time.Second)
			if err != nil {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("flow %d: dial: %v", i, err))
				mu.Unlock()
				return
			}
			tc := c.(*net.TCPConn)
			defer tc.Close()
			tc.SetDeadline(time.Now().Add(20 * time.Second))
			msg := make([]byte, 4+s.size)
			msg[0], msg[1] = byte(i>>8), byte(i)
			for j := 4; j < len(msg); j++ {
				msg[j] = byte(j * (i + 1))
			}
			if s.client == "quiet" {
				// Nothing at all: the idle timeout ends it.
				tc.Read(make([]byte, 1))
				return
			}
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(tc)
				got <- b
			}()
			for off := 0; off < len(msg); off += s.chunk {
				if s.client == "reset" && off > len(msg)/2 {
					resetConn(tc)
					<-got
					return
				}
				if _, err := tc.Write(msg[off:min(off+s.chunk, len(msg))]); err != nil {
					break
				}
			}
			tc.CloseWrite()
			echo := <-got
			if s.upstream == "echo" && sha256.Sum256(echo) != sha256.Sum256(msg) {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("flow %d (%+v): echoed %d bytes, want %d identical (first diff at %d)", i, s, len(echo), len(msg), firstDiff(echo, msg)))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, b := range bad {
		t.Error(b)
	}
	ends := h.waitEnded(t, n, 20*time.Second)
	for _, e := range ends {
		if k := e.rec.dones.Load(); k != 1 {
			t.Errorf("flow %d: Done/Handover called %d times", e.rec.id, k)
		}
	}
	h.noMoreEnded(t, 200*time.Millisecond)
	if f := r.ls.Flows(); f != 0 {
		t.Errorf("%d flows still in the loops", f)
	}
	h.copies.Wait()
	r.ls.Close()
	r.closeListener()
	srv.close()
	if added := openFDs(t).added(before); len(added) > 0 {
		t.Errorf("descriptors left open: %v", added)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if bytes.Equal(a, b) {
		return -1
	}
	return min(len(a), len(b))
}
