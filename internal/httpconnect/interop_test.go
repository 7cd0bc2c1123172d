package httpconnect

import (
	"bufio"
	"net"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// TestCurlInterop runs curl's HTTP CONNECT client (a reference
// implementation, forced with --proxytunnel) against ReadRequest and
// WriteReply in a minimal proxy, with and without Basic proxy auth.
func TestCurlInterop(t *testing.T) {
	testenv.CheckLeaks(t)
	if testing.Short() {
		t.Skip("runs curl")
	}
	curl := testenv.RequireCommand(t, "curl")
	port := testenv.HTTPOrigin(t, "hello via connect")
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
			targets := make(chan string, 1)
			proxy := testenv.NewServer(t, func(c *net.TCPConn) { serveOne(c, tt.needAuth, targets) })
			args := append([]string{"-sS", "--max-time", "10", "--proxytunnel", "-x", "http://" + proxy.Addr(), url}, tt.extra...)
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
func serveOne(c *net.TCPConn, needAuth bool, targets chan<- string) {
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
	testenv.Splice(c, up.(*net.TCPConn))
}
