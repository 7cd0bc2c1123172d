package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/relay"
	"gopkg.in/yaml.v3"
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

// TestProxyFollowsAgentTable runs `mosto proxy` with a controller section
// whose controller is unreachable: the agent's persisted table (chain,
// members, overlay key) must still drive the daemon. The InP's own policy
// refuses the loopback origin, so an echo proves the flow took the chain.
func TestProxyFollowsAgentTable(t *testing.T) {
	secret := make([]byte, pki.OverlayKeySize)
	rand.Read(secret)
	keys := map[string]any{"current": map[string]any{"id": int(pki.KeyID(secret)), "secret_hex": hex.EncodeToString(secret)}}

	origin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer origin.Close()
	go func() {
		for {
			c, err := origin.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()

	startRelay := func(id string, members map[string]string) *relay.Server {
		t.Helper()
		y, _ := yaml.Marshal(map[string]any{
			"id": id, "hop": map[string]string{"listen": "127.0.0.1:0"}, "keys": keys, "members": members,
			"destinations": map[string]any{"allow": []string{"127.0.0.0/8"}},
		})
		cfg, err := relay.ParseConfig(bytes.NewReader(y), ".")
		if err != nil {
			t.Fatal(err)
		}
		s, err := relay.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return s
	}
	c := startRelay("c", nil)
	b := startRelay("b", map[string]string{"c": c.HopAddr().String()})

	dir := t.TempDir()
	table := api.Table{
		LoP: "a", Version: 1, Keys: api.Keys{Current: hex.EncodeToString(secret)},
		Members: map[string]string{"a": "127.0.0.1:7", "b": b.HopAddr().String(), "c": c.HopAddr().String()},
		Table: pathcomp.TableFile{Version: 1, Locations: []string{"a", "b", "c"}, Chains: []pathcomp.ChainEntry{
			{From: "a", To: "c", Size: 1000, Rounds: 1, Path: []string{"a", "b", "c"}},
		}},
	}
	tb, _ := json.Marshal(table)
	os.MkdirAll(filepath.Join(dir, "data"), 0o700)
	if err := os.WriteFile(filepath.Join(dir, "data", "table.json"), tb, 0o600); err != nil {
		t.Fatal(err)
	}
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	svc := free.Addr().String()
	free.Close()
	y, _ := yaml.Marshal(map[string]any{
		"id":       "a",
		"egress":   map[string]string{"default": "c"},
		"services": []map[string]string{{"listen": svc, "origin": origin.Addr().String()}},
		"controller": map[string]string{"url": "http://127.0.0.1:1", "data_dir": "data",
			"hop_addr": "127.0.0.1:7", "probe_addr": "127.0.0.1:9", "probe_listen": "off"},
		"timeouts": map[string]string{"drain": "1s"},
	})
	cfgPath := filepath.Join(dir, "a.yaml")
	os.WriteFile(cfgPath, y, 0o600)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		exit <- Run(ctx, []string{"proxy", "--config", cfgPath}, strings.NewReader(""), io.Discard, &stderr)
	}()
	var conn net.Conn
	for deadline := time.Now().Add(10 * time.Second); conn == nil; {
		if conn, err = net.Dial("tcp", svc); err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("service never listened: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write([]byte("via the agent's chain"))
	conn.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(conn)
	conn.Close()
	if string(got) != "via the agent's chain" {
		t.Errorf("echo = %q, %v", got, err)
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit %d; stderr %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("proxy did not stop")
	}
}
