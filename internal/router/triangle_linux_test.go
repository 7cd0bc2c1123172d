//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package router

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// rxBytes is the bytes received by host's non-loopback devices (from
// /proc/thread-self/net/dev in its network namespace: the emulator's
// count of what reached the host, independent of xlate's counters).
func (hw *handoffWorld) rxBytes(t *testing.T, host string) int64 {
	t.Helper()
	var total int64
	err := hw.w.Do(host, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/dev")
		if err != nil {
			return err
		}
		for _, line := range bytes.Split(b, []byte("\n"))[2:] {
			name, rest, ok := strings.Cut(string(line), ":")
			if !ok || strings.TrimSpace(name) == "lo" {
				continue
			}
			f := strings.Fields(rest)
			if len(f) < 1 {
				return fmt.Errorf("net/dev line %q", line)
			}
			v, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return err
			}
			total += v
		}
		return nil
	})
	if err != nil {
		t.Fatalf("rx bytes of %s: %v", host, err)
	}
	return total
}

// Surrogate-side placement (triangular): 300 handed-off sessions of random
// sizes, SHA-256 checked, every tenth with a second keep-alive request.
// The response direction is translated at the surrogate's egress and goes
// surrogate -> client: the router's host receives far fewer bytes than
// the bodies (the client's requests and ACKs, and a first flight whenever
// the agent's install lost the race to the answer, which the router
// drops), and its program translates none of the response bytes.
func TestHandoffSurrogateSide(t *testing.T) {
	hw := startTriangleWorld(t)
	const sessions = 300
	r := rand.New(rand.NewPCG(9, 10))
	sizes := make([]int, sessions)
	var body int64
	for i := range sizes {
		sizes[i] = 1000 + r.IntN(512<<10)
		body += int64(sizes[i])
		if i%10 == 0 {
			body += int64(sizes[i]/2 + 1)
		}
	}
	rrBefore := hw.rxBytes(t, "rr")
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var reqBytes atomic.Int64
	for i, size := range sizes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c := hw.client(t)
			br := bufio.NewReader(c)
			n, _ := io.WriteString(c, get(size))
			readObject(t, br, size)
			if i%10 == 0 {
				m, _ := io.WriteString(c, get(size/2+1))
				n += m
				readObject(t, br, size/2+1)
			}
			reqBytes.Add(int64(n))
		})
	}
	wg.Wait()
	rrRx := hw.rxBytes(t, "rr") - rrBefore
	st := hw.r.Stats()
	placed, released := hw.joiner.Placement()
	rs, ss := hw.splicer.Stats(), hw.surSplicer.Stats()
	t.Logf("router %+v; placed %d released %d; placer %+v agent %+v", st, placed, released, hw.placer.Stats(), hw.agent.Stats())
	t.Logf("answers dropped at rr (lost races): %d packets with data; rr xlate %+v; sur xlate %+v; rr received %d bytes for %d body bytes (%.1f%%)", rs.RemoteData, rs, ss, rrRx, body, 100*float64(rrRx)/float64(body))
	if st.HandedOff+st.HandoffFallbacks != sessions || st.Failed != 0 || st.HandedOff < sessions*9/10 {
		t.Fatalf("stats %+v; want %d sessions, at least 90%% handed off, none failed", st, sessions)
	}
	if placed != st.HandedOff || released != 0 {
		t.Errorf("placed %d, released %d of %d handoffs; want every one placed on the surrogate, none released", placed, released, st.HandedOff)
	}
	// The surrogate's egress translated the answers (bodies plus headers).
	if ss.Egress == 0 || ss.Bytes < uint64(body)*9/10*uint64(st.HandedOff)/sessions {
		t.Errorf("surrogate egress translated %d packets, %d bytes; want the bodies (%d bytes)", ss.Egress, ss.Bytes, body)
	}
	// The router's program translated the clients' bytes only (their
	// keep-alive requests): no response byte.
	if rs.Bytes > uint64(reqBytes.Load()) || rs.Errors != 0 || ss.Errors != 0 {
		t.Errorf("router translated %d payload bytes (requests sent: %d), errors %d/%d; want no response byte", rs.Bytes, reqBytes.Load(), rs.Errors, ss.Errors)
	}
	// What reached the router's host: requests, ACKs, and the first
	// flights of lost races; with the router-side placement it is more
	// than the bodies.
	if rrRx > body/4 {
		t.Errorf("router's host received %d bytes for %d body bytes; want under a quarter (the answers must not cross it)", rrRx, body)
	}
}
