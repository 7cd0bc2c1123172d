package mget

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/origin/origintest"
	"github.com/mosto-net/mosto/internal/socks5"
	"github.com/mosto-net/mosto/internal/testenv"
)

// serve runs h on a loopback listener until the test ends.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close(); <-done })
	return "http://" + ln.Addr().String()
}

// startOrigin runs an origin.Server with the given rate cap.
func startOrigin(t *testing.T, rate int64) (*origin.Server, string) {
	t.Helper()
	s, addr := origintest.Start(t, origin.Config{Seed: 77, Rate: rate})
	return s, "http://" + addr
}

func checkFile(t *testing.T, path string, size int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != size || sha256.Sum256(b) != origin.Sum(77, size) {
		t.Fatalf("%s: %d bytes, SHA-256 differs from the object's (size %d)", path, len(b), size)
	}
}

func sources(urls ...string) []Source {
	var s []Source
	for _, u := range urls {
		s = append(s, Source{URL: u})
	}
	return s
}

func TestGetMultiSource(t *testing.T) {
	const size = 3 << 20
	_, a := startOrigin(t, 4<<20)
	_, b := startOrigin(t, 2<<20)
	_, c := startOrigin(t, 1<<20)
	obj := fmt.Sprintf("/obj?size=%d", size)
	out := filepath.Join(t.TempDir(), "f")
	sum := origin.Sum(77, size)
	st, err := Get(context.Background(), Config{Sources: sources(a+obj, b+obj, c+obj), Out: out, Block: 64 << 10, SHA256: sum[:]})
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, size)
	if st.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("stats SHA-256 %s", st.SHA256)
	}
	for i, s := range st.Subflows {
		if s.Bytes == 0 {
			t.Errorf("sub-flow %d received nothing: %+v", i, s)
		}
	}
	// 4+2+1 MiB/s: the fastest source must carry the most, the slowest the
	// least. Together they allow 7 MiB/s: 3 MiB in ~0.43 s; one source
	// alone needs >= 0.75 s. The origins' rate limits run in this
	// process: on a loaded machine under -race the transfer took 3-6 s,
	// so the machine, not the sources' rates, set the split (seen: 0.9,
	// 1.3, 0.9 MiB). The split is checked when the run was rate-bound.
	b0, b1, b2 := st.Subflows[0].Bytes, st.Subflows[1].Bytes, st.Subflows[2].Bytes
	if st.Seconds > 0.7 {
		t.Logf("slow run (loaded machine): %.2f s for 3 MiB at 7 MiB/s in total; bytes per source %d, %d, %d not checked against the rates", st.Seconds, b0, b1, b2)
	} else if !(b0 > b1 && b1 > b2) {
		t.Errorf("bytes per source %d, %d, %d in %.2f s; want decreasing with the sources' rates", b0, b1, b2, st.Seconds)
	}
	if _, err := os.Stat(out + ".mget"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("resume file left after success: %v", err)
	}
}

func TestGetMirrorDisagrees(t *testing.T) {
	const size = 1 << 20
	_, a := startOrigin(t, 0)
	out := filepath.Join(t.TempDir(), "f")
	tests := []struct{ name, bad string }{
		{"length", a + fmt.Sprintf("/obj?size=%d", size+1)},
		{"etag", a + fmt.Sprintf("/obj?size=%d&seed=5", size)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := Get(context.Background(), Config{Sources: sources(a+fmt.Sprintf("/obj?size=%d", size), tc.bad), Out: out, Block: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, out, size)
			if st.Subflows[1].Disabled == "" || st.Subflows[1].Bytes != 0 {
				t.Errorf("disagreeing mirror not refused: %+v", st.Subflows[1])
			}
		})
	}
	// Only disagreeing mirrors after the reference: refused, still correct.
	// A disagreeing reference alone with --sha256: the hash refuses it.
	sum := origin.Sum(77, size)
	_, err := Get(context.Background(), Config{Sources: sources(a + fmt.Sprintf("/obj?size=%d&seed=5", size)), Out: out, SHA256: sum[:]})
	if err == nil {
		t.Fatalf("an object of another seed passed the --sha256 check")
	}
}

// bad returns a handler that answers range requests wrongly in one way,
// except requests from byte 0 (the identity request: the one-byte probe of
// a retry, or source 0's first range, which carries the identity since
// session 9; a bad first response is TestGetBadFirstResponse's).
func bad(kind string) http.Handler {
	return badHandler(kind, func(off, last int64) bool { return off == 0 })
}

// badHandler is bad with good(off, last) choosing the requests answered
// well.
func badHandler(kind string, good func(off, last int64) bool) http.Handler {
	const size = 1 << 20
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var off, last int64
		fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &off, &last)
		h := w.Header()
		h.Set("ETag", origin.ETag(77, size))
		h.Set("Last-Modified", origin.DefaultModified.Format(http.TimeFormat))
		body := func(o, n int64) { io.Copy(w, origin.BodyAt(77, o, n)) }
		probe := good(off, last)
		switch {
		case kind == "200":
			h.Set("Content-Length", strconv.Itoa(size))
			w.WriteHeader(200)
			body(0, size)
		case kind == "shifted" && !probe:
			// Claims the asked range but sends bytes from elsewhere: caught
			// only by --sha256; with a shifted Content-Range it is caught at
			// once.
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off+1, last, size))
			h.Set("Content-Length", strconv.FormatInt(last-off, 10))
			w.WriteHeader(206)
			body(off+1, last-off)
		case kind == "truncated" && !probe:
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, last, size))
			h.Set("Content-Length", strconv.FormatInt(last-off+1, 10))
			w.WriteHeader(206)
			body(off, (last-off+1)/2)
			// The handler returns early: net/http closes the connection.
		case kind == "close":
			h.Set("Connection", "close")
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, last, size))
			h.Set("Content-Length", strconv.FormatInt(last-off+1, 10))
			w.WriteHeader(206)
			body(off, last-off+1)
		case kind == "reset" && !probe:
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
		case kind == "garbage" && !probe:
			h.Set("Content-Range", "bytes oops")
			w.WriteHeader(206)
		case kind == "total" && !probe:
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, last, size*2))
			h.Set("Content-Length", strconv.FormatInt(last-off+1, 10))
			w.WriteHeader(206)
			body(off, last-off+1)
		default:
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, last, size))
			h.Set("Content-Length", strconv.FormatInt(last-off+1, 10))
			w.WriteHeader(206)
			body(off, last-off+1)
		}
	})
}

func TestGetBadSources(t *testing.T) {
	const size = 1 << 20
	obj := fmt.Sprintf("/obj?size=%d", size)
	for _, kind := range []string{"200", "shifted", "truncated", "garbage", "total", "close", "reset"} {
		t.Run(kind, func(t *testing.T) {
			_, good := startOrigin(t, 4<<20)
			badURL := serve(t, bad(kind)) + "/obj"
			out := filepath.Join(t.TempDir(), "f")
			// Bad source first, so it is the one asked for the first ranges.
			st, err := Get(context.Background(), Config{Sources: sources(badURL, good+obj), Out: out, Block: 32 << 10, Stall: time.Second})
			if err != nil {
				if kind == "200" {
					// The reference itself has no range support: a clear error
					// is fine only if it says so.
					t.Logf("error: %v", err)
				}
				t.Fatal(err)
			}
			checkFile(t, out, size)
			if kind == "close" {
				// Connection: close after every response is allowed: it
				// must carry bytes, not be dropped.
				if st.Subflows[0].Disabled != "" || st.Subflows[0].Bytes == 0 {
					t.Errorf("a source closing after each response: %+v", st.Subflows[0])
				}
				return
			}
			retried := kind == "truncated" || kind == "reset" // errors of a session, not of the source
			if !retried && st.Subflows[0].Disabled == "" {
				t.Errorf("bad source (%s) not dropped: %+v", kind, st.Subflows[0])
			}
			if retried && st.Subflows[0].Errors == 0 {
				t.Errorf("%s responses not seen as errors: %+v", kind, st.Subflows[0])
			}
			// Alone, a bad source gives an error, not a wrong file.
			out2 := filepath.Join(t.TempDir(), "g")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err = Get(ctx, Config{Sources: sources(badURL), Out: out2, Block: 32 << 10, Stall: time.Second, GiveUp: 3})
			if err == nil {
				t.Fatalf("a lone %s source gave no error", kind)
			}
			if kind == "reset" && !errors.Is(err, ErrGaveUp) {
				t.Errorf("a lone source resetting every range request: %v; want ErrGaveUp", err)
			}
		})
	}
}

func TestGetSilentSource(t *testing.T) {
	const size = 4 << 20
	fast, a := startOrigin(t, 8<<20)
	_, b := startOrigin(t, 2<<20)
	obj := fmt.Sprintf("/obj?size=%d", size)
	out := filepath.Join(t.TempDir(), "f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	silenced := false
	cfg := Config{Sources: sources(a+obj, b+obj), Out: out, Block: 64 << 10, Stall: 300 * time.Millisecond}
	cfg.Progress = func(s Snapshot) {
		if !silenced && s.Received > size/5 {
			silenced = true
			fast.Silence(1500 * time.Millisecond)
		}
	}
	st, err := Get(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, size)
	if !silenced || st.Subflows[0].Stalls == 0 {
		t.Errorf("silenced %v, stalls of the silent source %d; want a stall detected", silenced, st.Subflows[0].Stalls)
	}
}

func TestGetResumeAfterKill(t *testing.T) {
	if os.Getenv("MGET_HELPER_URL") != "" {
		return
	}
	const size = 6 << 20
	_, a := startOrigin(t, 2<<20)
	url := a + fmt.Sprintf("/obj?size=%d", size)
	out := filepath.Join(t.TempDir(), "f")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperGet$")
	cmd.Env = append(os.Environ(), "MGET_HELPER_URL="+url, "MGET_HELPER_OUT="+out)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once it has saved a state with some bytes.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := loadState(statePath(out))
		if err == nil {
			var n int64
			for _, g := range st.Got {
				n += g
			}
			if n > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("helper saved no progress in 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	st, err := Get(context.Background(), Config{Sources: sources(url), Out: out, Continue: true, Block: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, size)
	if st.Resumed == 0 || st.Bytes >= size {
		t.Errorf("resumed %d, received %d of %d: want a resume", st.Resumed, st.Bytes, size)
	}
	// A resume file of another version is refused, not mixed in.
	os.WriteFile(statePath(out), []byte(`{"identity":{"size":5,"etag":"\"x\""},"block":65536,"got":[5]}`), 0o644)
	if _, err := Get(context.Background(), Config{Sources: sources(url), Out: out, Continue: true}); err == nil {
		t.Errorf("resume of another version accepted")
	}
}

// TestHelperGet is the download killed by TestGetResumeAfterKill.
func TestHelperGet(t *testing.T) {
	url := os.Getenv("MGET_HELPER_URL")
	if url == "" {
		t.Skip("helper process of TestGetResumeAfterKill")
	}
	Get(context.Background(), Config{Sources: sources(url), Out: os.Getenv("MGET_HELPER_OUT"), Block: 64 << 10})
}

// TestGetViaSOCKS5 downloads through a SOCKS5 entry (the server side of
// internal/socks5, as the relay's entry runs it) and directly at once: two
// paths to one source.
func TestGetViaSOCKS5(t *testing.T) {
	testenv.CheckLeaks(t)
	const size = 2 << 20
	_, a := startOrigin(t, 4<<20) // 0.5 s: both paths get to run
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var flows atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				req, err := socks5.Handshake(ctx, c, socks5.Config{})
				if err != nil {
					return
				}
				up, err := net.Dial("tcp", req.Target)
				if err != nil {
					socks5.Reply(c, socks5.ReplyCode(err), netip.AddrPort{})
					return
				}
				defer up.Close()
				flows.Add(1)
				socks5.Reply(c, socks5.Succeeded, netip.AddrPort{})
				stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
				defer stop()
				go func() { io.Copy(up, c); up.Close() }()
				io.Copy(c, up)
			}()
		}
	}()
	url := a + fmt.Sprintf("/obj?size=%d", size)
	out := filepath.Join(t.TempDir(), "f")
	st, err := Get(context.Background(), Config{Sources: []Source{{URL: url}, {URL: url, Path: "via", Dial: ViaSOCKS5(ln.Addr().String(), nil)}}, Out: out, Block: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, size)
	if flows.Load() == 0 || st.Subflows[1].Bytes+st.Subflows[1].DupBytes == 0 {
		t.Errorf("no bytes through the SOCKS5 entry: %d flows, %+v", flows.Load(), st.Subflows[1])
	}
}
