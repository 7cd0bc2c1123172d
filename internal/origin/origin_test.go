package origin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

func TestBodyDeterministicAndPrefix(t *testing.T) {
	full, err := io.ReadAll(Body(7, 100_003))
	if err != nil {
		t.Fatal(err)
	}
	if len(full) != 100_003 {
		t.Fatalf("len = %d; want 100003", len(full))
	}
	// Read again with awkward chunk sizes: same bytes.
	r := Body(7, 100_003)
	var got []byte
	buf := make([]byte, 13)
	for i := 1; ; i++ {
		n, err := r.Read(buf[:1+i%13])
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
	}
	if !bytes.Equal(got, full) {
		t.Fatalf("chunked read differs from full read")
	}
	small, _ := io.ReadAll(Body(7, 1001))
	if !bytes.Equal(small, full[:1001]) {
		t.Errorf("Body(7,1001) is not a prefix of Body(7,100003)")
	}
	other, _ := io.ReadAll(Body(8, 1001))
	if bytes.Equal(small, other) {
		t.Errorf("seeds 7 and 8 give the same bytes")
	}
	if Sum(7, 100_003) != sha256.Sum256(full) {
		t.Errorf("Sum differs from sha256 of Body")
	}
	if n, _ := io.ReadAll(Body(1, -5)); len(n) != 0 {
		t.Errorf("negative size gave %d bytes", len(n))
	}
}

func startServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, "http://" + ln.Addr().String()
}

func TestServer(t *testing.T) {
	testenv.CheckLeaks(t)
	s, base := startServer(t, Config{Seed: 42, MaxSize: 10 << 20})
	tests := []struct {
		name   string
		path   string
		status int
		sum    [32]byte
	}{
		{"default seed", "/obj?size=50000", 200, Sum(42, 50000)},
		{"explicit seed", "/obj?size=1234&seed=9", 200, Sum(9, 1234)},
		{"empty", "/obj?size=0", 200, Sum(42, 0)},
		{"no size", "/obj", 400, [32]byte{}},
		{"negative", "/obj?size=-1", 400, [32]byte{}},
		{"too big", "/obj?size=20000000", 400, [32]byte{}},
		{"bad seed", "/obj?size=1&seed=x", 400, [32]byte{}},
		{"bad think", "/obj?size=1&think=forever", 400, [32]byte{}},
		{"other path", "/", 404, [32]byte{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Get(base + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("GET %s: status %d; want %d (%s)", tc.path, resp.StatusCode, tc.status, body)
			}
			if tc.status != 200 {
				return
			}
			if sha256.Sum256(body) != tc.sum {
				t.Errorf("GET %s: body hash mismatch (%d bytes)", tc.path, len(body))
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q; want no-store", cc)
			}
		})
	}
	if req, _ := s.Stats(); req != 3 {
		t.Errorf("Stats requests = %d; want 3", req)
	}
}

func TestServerKeepAliveAndThink(t *testing.T) {
	testenv.CheckLeaks(t)
	_, base := startServer(t, Config{Think: 30 * time.Millisecond})
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var reused []bool
	for i := 0; i < 2; i++ {
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused = append(reused, info.Reused) }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", base+"/obj?size=100", nil)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if d := time.Since(start); d < 30*time.Millisecond {
			t.Errorf("response after %v; want >= think time 30ms", d)
		}
	}
	if len(reused) != 2 || reused[0] || !reused[1] {
		t.Errorf("connection reuse = %v; want [false true]", reused)
	}
}
