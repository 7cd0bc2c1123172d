package httpconnect

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestCurlInterop runs curl's HTTP CONNECT client (a reference
// implementation, forced with --proxytunnel) against ReadRequest and
// WriteReply in a minimal proxy, with and without Basic proxy auth.
func TestCurlInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("runs curl")
	}
	curl := testenv.RequireCommand(t, "curl")
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello via connect")
	}))
	t.Cleanup(origin.Close)
	_, port, _ := net.SplitHostPort(origin.Listener.Addr().String())
	url := "http://localhost:" + port + "/"

	tests := []struct {
		name       string
		needAuth   bool
		extra      []string
		wantTarget string
		wantOK     bool
	}{
		{"no auth", false, nil, "localhost:" + port, true},
		{"basic auth", true, []string{"--proxy-user", "alice:s3cret"}, "localhost:" + port, true},
		{"auth missing", true, nil, "localhost:" + port, false},
		{"wrong password", true, []string{"--proxy-user", "alice:nope"}, "localhost:" + port, false},
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
				serveOne(ln, tt.needAuth, targets)
			}()
			args := append([]string{"-sS", "--max-time", "10", "--proxytunnel", "-x", "http://" + ln.Addr().String(), url}, tt.extra...)
			out, err := exec.Command(curl, args...).CombinedOutput()
			select {
			case got := <-targets:
				if got != tt.wantTarget {
					t.Errorf("target = %q; want %q", got, tt.wantTarget)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("curl never reached the proxy: %q, %v", out, err)
			}
			if tt.wantOK && (err != nil || string(out) != "hello via connect") {
				t.Fatalf("curl = %q, %v", out, err)
			}
			if !tt.wantOK && err == nil {
				t.Fatalf("curl succeeded: %q", out)
			}
		})
	}
}

// serveOne is a minimal HTTP CONNECT proxy for one connection.
func serveOne(ln net.Listener, needAuth bool, targets chan<- string) {
	c, err := ln.Accept()
	if err != nil {
		targets <- ""
		return
	}
	defer c.Close()
	br := bufio.NewReader(c)
	target, hdr, err := ReadRequest(br, Limits{})
	targets <- target
	if err != nil {
		WriteReply(c, StatusFor(err))
		return
	}
	if needAuth {
		if u, p, ok := ProxyAuth(hdr); !ok || u != "alice" || p != "s3cret" {
			WriteReply(c, http.StatusProxyAuthRequired)
			return
		}
	}
	up, err := net.Dial("tcp", target)
	if err != nil {
		WriteReply(c, http.StatusBadGateway)
		return
	}
	defer up.Close()
	WriteReply(c, http.StatusOK)
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		up.Write(b)
	}
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
