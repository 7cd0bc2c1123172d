package cli

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestControllerUsage(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"controller"}, 2, "--data is required"},
		{[]string{"controller", "--data", t.TempDir(), "--sizes", "12XB", "--insecure"}, 2, "--sizes"},
		{[]string{"controller", "--data", t.TempDir(), "--period", "0s", "--insecure"}, 2, "--period"},
		{[]string{"controller", "--data", t.TempDir(), "extra"}, 2, "unexpected"},
		{[]string{"controller", "--data", t.TempDir(), "--dests", "0", "--insecure"}, 2, "--dests 0: want >= 1"},
		{[]string{"controller", "--data", t.TempDir(), "--dests", "-3", "--insecure"}, 2, "--dests"},
		{[]string{"controller", "--data", t.TempDir(), "--icw", "0", "--insecure"}, 2, "--icw 0"},
		{[]string{"controller", "--data", t.TempDir(), "--mss", "70000", "--insecure"}, 2, "--mss 70000"},
		{[]string{"controller", "--data", t.TempDir(), "--end-icw", "-1", "--insecure"}, 2, "--end-icw -1"},
		{[]string{"controller", "--data", t.TempDir(), "--end-rtt", "20", "--insecure"}, 2, "--end-rtt needs --end-icw"},
		{[]string{"controller", "--data", t.TempDir(), "--listen", "127.0.0.1:1"}, 1, "controller init"},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		code := Run(context.Background(), tc.args, strings.NewReader(""), &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("mosto %v = %d, stderr %q; want %d mentioning %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

func TestControllerServesAndStops(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- Run(ctx, []string{"controller", "--data", t.TempDir(), "--insecure", "--listen", addr}, strings.NewReader(""), &bytes.Buffer{}, &errb)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("healthz = %d", resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller not serving within 20s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit status %d after cancel; want 0 (stderr %s)", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("controller did not stop within 20s of cancel")
	}
}
