//go:build linux

package evloop

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The test head: a 2-byte big-endian length, then that many bytes of name.
// A name "take" makes Dial give the flow up (ErrTaken), "hello" is a first
// stage answered with a Reply and followed by a second head.
func testHead(name string) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(name)))
	return append(b, name...)
}

// headDialer is a Handler.Dial that reads a test head.
type headDialer struct {
	t     testing.TB
	srv   *upServer
	wait  time.Duration
	calls atomic.Int32
	mu    sync.Mutex
	seen  []int // len(first) of every call
}

func (d *headDialer) dial(rec *flowRec, first []byte) (Upstream, error) {
	d.calls.Add(1)
	d.mu.Lock()
	d.seen = append(d.seen, len(first))
	d.mu.Unlock()
	if len(first) < 2 {
		return Upstream{}, ErrMore
	}
	n := 2 + int(binary.BigEndian.Uint16(first))
	if len(first) < n {
		return Upstream{}, ErrMore
	}
	switch name := string(first[2:n]); name {
	case "take":
		return Upstream{}, ErrTaken
	case "hello":
		return Upstream{Wait: d.wait, Head: true, Consume: n, Reply: []byte("OK")}, nil
	default:
		fd, err := Dial(d.srv.addr, nil)
		return Upstream{FD: fd, Prefix: []byte("P" + name + ":"), Consume: n}, err
	}
}

func (d *headDialer) sizes() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int(nil), d.seen...)
}

// headRig runs loops whose flows start with a test head (Wait + Head).
func headRig(t *testing.T, cfg Config, wait time.Duration, taken ...func(h *testHandler, rec *flowRec, ho Handover)) (*rig, *headDialer, *upServer) {
	t.Helper()
	srv := newUpServer(t, echoServe)
	h := newTestHandler(t, srv.addr)
	d := &headDialer{t: t, srv: srv, wait: wait}
	h.open = func(rec *flowRec) (Upstream, error) { return Upstream{Wait: wait, Head: true}, nil }
	h.dial = d.dial
	for _, fn := range taken {
		h.taken = func(rec *flowRec, ho Handover) { fn(h, rec, ho) }
	}
	return newRig(t, cfg, h), d, srv
}

// TestHead checks Upstream.Head, ErrMore and Consume: a head split over
// several reads is collected until Dial has it whole, a head and the
// flow's first bytes in one read are split at Consume, and the consumed
// bytes never reach the upstream nor Stats.Up.
func TestHead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pieces [][]byte // written one by one, 50 ms apart
		rest   []byte   // then the flow's bytes, with the last piece
		calls  int32    // Dial calls (at least)
	}{
		{"split head", [][]byte{{0}, {5, 'a'}, []byte("lph"), []byte("a")}, []byte("data"), 4},
		{"head and bytes in one read", nil, []byte("data after the head"), 1},
		{"head alone", nil, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, d, _ := headRig(t, Config{Loops: 1}, 5*time.Second)
			c := r.dial(t)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			head := testHead("alpha")
			if tc.pieces == nil {
				tc.pieces = [][]byte{head}
			}
			for _, p := range tc.pieces[:len(tc.pieces)-1] {
				writeAll(t, c, string(p))
				time.Sleep(50 * time.Millisecond)
			}
			last := append(append([]byte(nil), tc.pieces[len(tc.pieces)-1]...), tc.rest...)
			got, err := exchange(c, last, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := "Palpha:" + string(tc.rest); string(got) != want {
				t.Errorf("echo %q; want %q (prefix, then the bytes after the head)", got, want)
			}
			if n := d.calls.Load(); n < tc.calls {
				t.Errorf("Dial called %d times (saw %v); want >= %d", n, d.sizes(), tc.calls)
			}
			if sz := d.sizes(); len(tc.pieces) > 1 {
				for i := 1; i < len(sz); i++ {
					if sz[i] <= sz[i-1] {
						t.Errorf("Dial saw %v bytes: called again without new bytes", sz)
					}
				}
			}
			e := r.h.waitEnded(t, 1, 5*time.Second)[0]
			if e.o != OK || e.st.Up != int64(len(tc.rest)) {
				t.Errorf("Done = %v, Up %d, err %v; want ok, Up %d (consumed head not counted)", e.o, e.st.Up, e.err, len(tc.rest))
			}
		})
	}
}

// TestHeadIncomplete checks how a head that never comes whole ends: the
// wait runs out, the client closes mid-head or before any byte, or the
// head outgrows a buffer. Dial is not called again without new bytes.
func TestHeadIncomplete(t *testing.T) {
	big := testHead(string(bytes.Repeat([]byte("x"), 1000)))
	for _, tc := range []struct {
		name    string
		send    []byte
		close   bool // half-close after send
		wantErr error
		reset   bool // the client sees a reset (else EOF)
		maxWait time.Duration
	}{
		{"timeout", []byte{0, 9, 'a'}, false, os.ErrDeadlineExceeded, true, 2 * time.Second},
		{"eof mid-head", []byte{0, 9, 'a'}, true, io.ErrUnexpectedEOF, true, time.Second},
		{"eof before any byte", nil, true, io.EOF, false, time.Second},
		{"too large", big, false, ErrHeadTooLarge, true, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, d, _ := headRig(t, Config{Loops: 1, BufSize: 512}, 300*time.Millisecond)
			c := r.dial(t)
			start := time.Now()
			if len(tc.send) > 0 {
				writeAll(t, c, string(tc.send))
			}
			if tc.close {
				c.CloseWrite()
			}
			e := r.h.waitEnded(t, 1, 5*time.Second)[0]
			took := time.Since(start)
			if e.o != Incomplete || !errors.Is(e.err, tc.wantErr) {
				t.Errorf("Done = %v, %v; want incomplete, %v", e.o, e.err, tc.wantErr)
			}
			if tc.wantErr == os.ErrDeadlineExceeded && took < 250*time.Millisecond {
				t.Errorf("timed out after %v; want >= the 300 ms wait", took)
			}
			if took > tc.maxWait {
				t.Errorf("ended after %v; want <= %v", took, tc.maxWait)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(make([]byte, 16))
			if tc.reset && !errors.Is(err, syscall.ECONNRESET) || !tc.reset && err != io.EOF {
				t.Errorf("client read %d, %v; want reset %v", n, err, tc.reset)
			}
			if len(tc.send) == 0 && d.calls.Load() != 0 {
				t.Errorf("Dial called %d times for a client that sent nothing", d.calls.Load())
			}
			if sz := d.sizes(); len(sz) > 0 && tc.wantErr != ErrHeadTooLarge && len(sz) != 1 {
				t.Errorf("Dial saw %v bytes; want one call (no new bytes after it)", sz)
			}
			if r.ls.Flows() != 0 {
				t.Errorf("flows in loops = %d; want 0", r.ls.Flows())
			}
		})
	}
}

// TestHeadStages checks a two-stage head: Dial answers the first with a
// Reply and a new Wait (Consume drops it), then reads the second; the
// stages may come in one read. And ErrTaken from Dial: the handler gets
// the client's socket with every byte read, head included.
func TestHeadStages(t *testing.T) {
	for _, together := range []bool{false, true} {
		name := map[bool]string{false: "apart", true: "together"}[together]
		t.Run(name, func(t *testing.T) {
			r, _, _ := headRig(t, Config{Loops: 1}, 5*time.Second)
			c := r.dial(t)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			second := append(testHead("beta"), "payload"...)
			if together {
				writeAll(t, c, string(testHead("hello"))+string(second))
			} else {
				writeAll(t, c, string(testHead("hello")))
			}
			readN(t, c, "OK")
			if together {
				c.CloseWrite()
				got, _ := io.ReadAll(c)
				if string(got) != "Pbeta:payload" {
					t.Errorf("after the two stages: %q; want %q", got, "Pbeta:payload")
				}
			} else {
				got, err := exchange(c, second, 0)
				if err != nil || string(got) != "Pbeta:payload" {
					t.Errorf("after the two stages: %q, %v; want %q", got, err, "Pbeta:payload")
				}
			}
			e := r.h.waitEnded(t, 1, 5*time.Second)[0]
			if e.o != OK || e.st.Up != int64(len("payload")) || e.st.Down != int64(len("Pbeta:payload")) {
				t.Errorf("Done = %v %+v; want ok, Up 7, Down 13 (head and reply not counted)", e.o, e.st)
			}
		})
	}
	t.Run("taken", func(t *testing.T) {
		got := make(chan []byte, 1)
		r, _, _ := headRig(t, Config{Loops: 1}, 5*time.Second, func(h *testHandler, rec *flowRec, ho Handover) {
			got <- ho.ToUp
			c, err := FileConn(ho.Down)
			if err != nil {
				t.Error(err)
				return
			}
			h.copies.Add(1)
			go func() {
				defer h.copies.Done()
				defer c.Close()
				c.Write([]byte("served by the taker"))
			}()
		})
		c := r.dial(t)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		sent := append(testHead("take"), "early"...)
		writeAll(t, c, string(sent))
		select {
		case b := <-got:
			if !bytes.Equal(b, sent) {
				t.Errorf("taken with %q; want every byte read %q", b, sent)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("flow not taken")
		}
		readN(t, c, "served by the taker")
		waitUntil(t, 2*time.Second, func() bool { return r.ls.Flows() == 0 })
		r.h.noMoreEnded(t, 100*time.Millisecond)
	})
}

// TestMixedWaits: flows waiting for different durations in one loop each
// end at their own deadline (a short wait behind a long one is not held up).
func TestMixedWaits(t *testing.T) {
	srv := newUpServer(t, echoServe)
	h := newTestHandler(t, srv.addr)
	var n atomic.Int32
	h.open = func(rec *flowRec) (Upstream, error) {
		if n.Add(1) == 1 {
			return Upstream{Wait: 5 * time.Second, Head: true}, nil
		}
		return Upstream{Wait: 200 * time.Millisecond, Head: true}, nil
	}
	h.dial = func(rec *flowRec, first []byte) (Upstream, error) { return Upstream{}, ErrMore }
	r := newRig(t, Config{Loops: 1}, h)
	long := r.dial(t)
	waitUntil(t, 2*time.Second, func() bool { return h.openedCount() == 1 })
	start := time.Now()
	r.dial(t)
	e := h.waitEnded(t, 1, 3*time.Second)[0]
	if took := time.Since(start); e.rec.id != 2 || e.o != Incomplete || took > time.Second {
		t.Errorf("first end: flow %d %v after %v; want flow 2 incomplete after ~200 ms", e.rec.id, e.o, took)
	}
	long.Close()
}

func waitUntil(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met in time")
		}
	}
}
