package socks5

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"sync"
	"testing"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestCurlInterop runs curl's SOCKS5 client (a reference implementation)
// against Handshake in a minimal proxy: addresses, host names and RFC 1929
// authentication.
func TestCurlInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("runs curl")
	}
	curl := testenv.RequireCommand(t, "curl")
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello via socks5")
	}))
	t.Cleanup(origin.Close)
	_, port, _ := net.SplitHostPort(origin.Listener.Addr().String())

	tests := []struct {
		name       string
		cfg        Config
		args       []string
		wantTarget string
		wantOK     bool
	}{
		{"ipv4 no auth", Config{}, []string{"--socks5", "PROXY", "http://127.0.0.1:" + port + "/"}, "127.0.0.1:" + port, true},
		{"host name", Config{}, []string{"--socks5-hostname", "PROXY", "http://localhost:" + port + "/"}, "localhost:" + port, true},
		{"user/password", Config{Auth: func(u, p string) bool { return u == "alice" && CheckPassword(p, "s3cret") }},
			[]string{"--socks5-hostname", "PROXY", "--proxy-user", "alice:s3cret", "http://localhost:" + port + "/"}, "localhost:" + port, true},
		{"wrong password", Config{Auth: func(u, p string) bool { return u == "alice" && CheckPassword(p, "s3cret") }},
			[]string{"--socks5-hostname", "PROXY", "--proxy-user", "alice:nope", "http://localhost:" + port + "/"}, "", false},
		{"not allowed", Config{Allow: func(string) bool { return false }},
			[]string{"--socks5", "PROXY", "http://127.0.0.1:" + port + "/"}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var wg sync.WaitGroup
			defer wg.Wait() // after ln.Close below, which ends a pending Accept
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			targets := make(chan string, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				serveOne(ln, tt.cfg, targets)
			}()
			args := append([]string{"-sS", "--max-time", "10"}, tt.args...)
			for i, a := range args {
				if a == "PROXY" {
					args[i] = ln.Addr().String()
				}
			}
			out, err := exec.Command(curl, args...).CombinedOutput()
			if tt.wantOK {
				if err != nil || string(out) != "hello via socks5" {
					t.Fatalf("curl = %q, %v", out, err)
				}
				if got := <-targets; got != tt.wantTarget {
					t.Errorf("target = %q; want %q", got, tt.wantTarget)
				}
			} else if err == nil {
				t.Fatalf("curl succeeded: %q", out)
			}
		})
	}
}

// serveOne is a minimal SOCKS5 proxy for one connection.
func serveOne(ln net.Listener, cfg Config, targets chan<- string) {
	c, err := ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	req, err := Handshake(context.Background(), c, cfg)
	if err != nil {
		return
	}
	targets <- req.Target
	up, err := net.Dial("tcp", req.Target)
	if err != nil {
		Reply(c, ReplyCode(err), netip.AddrPort{})
		return
	}
	defer up.Close()
	Reply(c, Succeeded, netip.MustParseAddrPort(up.LocalAddr().String()))
	done := make(chan struct{})
	go func() {
		io.Copy(up, c)
		up.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	io.Copy(c, up)
	c.(*net.TCPConn).CloseWrite()
	<-done
}
