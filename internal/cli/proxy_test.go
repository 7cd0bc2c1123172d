package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestProxyCommand(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("id: a\nbogus: 1\n"), 0o600)
	for _, tc := range []struct {
		name   string
		args   []string
		status int
		out    string // in stdout or stderr
	}{
		{"check ok", []string{"proxy", "--config", "../relay/testdata/proxy.yaml", "--check"}, 0, "proxy.yaml: ok"},
		{"no config", []string{"proxy"}, 2, "--config is required"},
		{"extra args", []string{"proxy", "--config", "x", "y"}, 2, "unexpected arguments"},
		{"bad flag", []string{"proxy", "--nope"}, 2, "flag provided but not defined"},
		{"missing file", []string{"proxy", "--config", "/nonexistent.yaml"}, 1, "read config"},
		{"unknown key", []string{"proxy", "--config", bad, "--check"}, 1, "line 2: field bogus not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			got := Run(context.Background(), tc.args, strings.NewReader(""), &stdout, &stderr)
			if got != tc.status || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
				t.Errorf("mosto %v = %d, stdout %q, stderr %q; want %d and %q", tc.args, got, stdout.String(), stderr.String(), tc.status, tc.out)
			}
		})
	}
}

// TestProxyRunsUntilCancelled starts the daemon and stops it the way
// SIGTERM does (main cancels the context): it drains and exits 0.
func TestProxyRunsUntilCancelled(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(cfg, []byte("id: a\nservices: [{listen: '127.0.0.1:0', origin: '127.0.0.1:9'}]\ntimeouts: {drain: 1s}\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stdout, stderr bytes.Buffer
	go func() { done <- Run(ctx, []string{"proxy", "--config", cfg}, strings.NewReader(""), &stdout, &stderr) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case got := <-done:
		if got != 0 {
			t.Errorf("exit %d; stderr %s", got, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("proxy did not stop after cancel")
	}
}
