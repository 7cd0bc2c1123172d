package transfer

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/origin/origintest"
	"github.com/mosto-net/mosto/internal/testenv"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"500", 500, false},
		{"10KB", 10_000, false},
		{"10kb", 10_000, false},
		{"1.5MB", 1_500_000, false},
		{"15M", 15_000_000, false},
		{"2GB", 2_000_000_000, false},
		{" 7 B ", 7, false},
		{"0", 0, false},
		{"", 0, true},
		{"KB", 0, true},
		{"-1KB", 0, true},
		{"1.0001B", 0, true},
		{"abc", 0, true},
		{"1e3", 0, true},
		{"NaN", 0, true},
		{"Inf", 0, true},
		{"0x10", 0, true},
		{"2000TB", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	sizes, err := ParseSizes("10KB, 50KB,1MB")
	if err != nil || len(sizes) != 3 || sizes[2] != 1_000_000 {
		t.Errorf("ParseSizes = %v, %v", sizes, err)
	}
	if _, err := ParseSizes(" , "); err == nil {
		t.Errorf("ParseSizes(empty) succeeded")
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{10_000: "10KB", 1_500_000: "1.5MB", 15_000_000: "15MB", 999: "999B", 1001: "1001B", 2e9: "2GB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q; want %q", n, got, want)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"10KB", "1.5MB", "7", "abc", "-3", "1e9", "0.0005KB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d < 0", s, n)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Fatalf("round trip of %d via %q: %d, %v", n, FormatSize(n), back, err)
		}
	})
}

func startOrigin(t *testing.T) string {
	t.Helper()
	_, addr := origintest.Start(t, origin.Config{})
	return addr
}

func TestClientColdAndWarm(t *testing.T) {
	testenv.CheckLeaks(t)
	addr := startOrigin(t)
	ctx := context.Background()
	for _, reuse := range []bool{false, true} {
		c := &Client{Addr: addr, Reuse: reuse}
		for i, size := range []int64{0, 10_000, 1_000_000, 123_457} {
			res, err := c.Object(ctx, size, uint64(i))
			if err != nil {
				t.Fatalf("reuse=%v Object(%d): %v", reuse, size, err)
			}
			wantReused := reuse && i > 0
			if res.Size != size || res.Reused != wantReused || (res.Connect == 0) == !wantReused {
				t.Errorf("reuse=%v Object(%d) = %+v; want size %d reused %v", reuse, size, res, size, wantReused)
			}
			if res.FirstByte <= 0 || res.Total < res.FirstByte || res.Total < res.Connect {
				t.Errorf("times out of order: %+v", res)
			}
		}
		if (c.conn != nil) != reuse {
			t.Errorf("reuse=%v: kept connection = %v", reuse, c.conn != nil)
		}
		c.Close()
	}
}

func TestClientMark(t *testing.T) {
	testenv.CheckLeaks(t)
	addr := startOrigin(t)
	ctx := context.Background()
	tests := []struct {
		name       string
		markAt     int64
		size       int64
		wantMarked bool
	}{
		{"not asked", 0, 1_000_000, false},
		{"inside the body", 400_000, 1_000_000, true},
		{"last byte", 1_000_000, 1_000_000, true},
		{"beyond the body", 2_000_000, 1_000_000, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{Addr: addr, MarkAt: tc.markAt}
			res, err := c.Object(ctx, tc.size, 1)
			if err != nil {
				t.Fatalf("Object(%d): %v", tc.size, err)
			}
			if (res.Mark > 0) != tc.wantMarked {
				t.Fatalf("MarkAt %d of %d bytes: Mark = %v; want marked %v", tc.markAt, tc.size, res.Mark, tc.wantMarked)
			}
			if tc.wantMarked && (res.Mark < res.FirstByte || res.Mark > res.Total) {
				t.Errorf("Mark %v outside first byte %v .. total %v", res.Mark, res.FirstByte, res.Total)
			}
		})
	}
}

// fakeServer answers every request with reply and then closes (or hangs).
func fakeServer(t *testing.T, reply string, hang bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				c.Write([]byte(reply))
			}
			if hang {
				// Hold the connection until the listener closes.
				go func() { c.Read(make([]byte, 1)); c.Close() }()
				continue
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func TestClientErrors(t *testing.T) {
	testenv.CheckLeaks(t)
	good := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name  string
		reply string
		hang  bool
		want  string
	}{
		{"corrupted", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + good(100), false, "sha256 mismatch"},
		{"short", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + good(10), false, "read body"},
		{"wrong length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" + good(5), false, "got 5 bytes"},
		{"status", "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n", false, "502"},
		{"garbage", "SSH-2.0-nope\r\n", false, "read response header"},
		{"hang", "", true, "deadline exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeServer(t, tc.reply, tc.hang)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			c := &Client{Addr: addr}
			_, err := c.Object(ctx, 100, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Object = %v; want error containing %q", err, tc.want)
			}
			if c.conn != nil {
				t.Errorf("connection kept after an error")
			}
		})
	}
	c := &Client{Addr: "127.0.0.1:1"}
	if _, err := c.Object(context.Background(), 1, 1); err == nil || !strings.Contains(err.Error(), "dial") {
		t.Errorf("Object to closed port = %v; want dial error", err)
	}
}
