package socks5

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestCurlInterop runs curl's SOCKS5 client (a reference implementation)
// against Handshake in a minimal proxy: addresses, host names and RFC 1929
// authentication.
func TestCurlInterop(t *testing.T) {
	testenv.CheckLeaks(t)
	if testing.Short() {
		t.Skip("runs curl")
	}
	curl := testenv.RequireCommand(t, "curl")
	port := testenv.HTTPOrigin(t, "hello via socks5")

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
			targets := make(chan string, 1)
			proxy := testenv.NewServer(t, func(c *net.TCPConn) { serveOne(c, tt.cfg, targets) })
			args := append([]string{"-sS", "--max-time", "10"}, tt.args...)
			for i, a := range args {
				if a == "PROXY" {
					args[i] = proxy.Addr()
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
func serveOne(c *net.TCPConn, cfg Config, targets chan<- string) {
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
	testenv.Splice(c, up.(*net.TCPConn))
}
