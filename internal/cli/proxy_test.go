package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/controller"
	"github.com/mosto-net/mosto/internal/pathcomp"
	"github.com/mosto-net/mosto/internal/pki"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
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
	var stdout, stderr syncBuffer
	go func() { done <- Run(ctx, []string{"proxy", "--config", cfg}, strings.NewReader(""), &stdout, &stderr) }()
	testenv.WaitFor(t, 10*time.Second, "proxy serving", func() bool { return strings.Contains(stderr.String(), "proxy serving") })
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

// TestProxyWorkerMode runs two `mosto proxy` processes' worth of workers
// (relay.WorkerEnv set, as the supervisor does) in this process on one
// config with workers: 2: both bind the same service port (SO_REUSEPORT)
// and worker 1 serves metrics on the configured port + 1.
func TestProxyWorkerMode(t *testing.T) {
	svc, mport := testenv.FreeAddr(t), freePortPair(t)
	cfg := filepath.Join(t.TempDir(), "p.yaml")
	y := fmt.Sprintf("id: a\nworkers: 2\nservices: [{listen: '%s', origin: '127.0.0.1:9'}]\nmetrics: {listen: '127.0.0.1:%d'}\ntimeouts: {drain: 1s}\n", svc, mport)
	os.WriteFile(cfg, []byte(y), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 2)
	var stderr [2]syncBuffer
	for i := range 2 {
		t.Setenv(relay.WorkerEnv, fmt.Sprint(i))
		go func() {
			done <- Run(ctx, []string{"proxy", "--config", cfg}, strings.NewReader(""), io.Discard, &stderr[i])
		}()
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("worker %d serving", i), func() bool { return strings.Contains(stderr[i].String(), "proxy serving") })
	}
	for i := range 2 {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", mport+i))
		if err != nil {
			t.Fatalf("worker %d metrics on port %d: %v", i, mport+i, err)
		}
		resp.Body.Close()
	}
	cancel()
	for i := range 2 {
		select {
		case got := <-done:
			if got != 0 {
				t.Errorf("worker exit %d; stderr %s / %s", got, stderr[0].String(), stderr[1].String())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("worker %d did not stop after cancel", i)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freePortPair returns a port p such that p and p+1 were free a moment
// ago, below the ephemeral range (whose even ports connections take).
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + mrand.IntN(10000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		ln.Close()
		if err == nil {
			ln2.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// TestProxyFollowsAgentTable runs `mosto proxy` with a controller section
// whose controller is unreachable: the agent's persisted table (chain,
// members, overlay key) must still drive the daemon. The InP's own policy
// refuses the loopback origin, so an echo proves the flow took the chain.
func TestProxyFollowsAgentTable(t *testing.T) {
	testenv.CheckLeaks(t)
	secret := make([]byte, pki.OverlayKeySize)
	rand.Read(secret)

	origin := relaytest.NewOrigin(t, relaytest.Echo)
	startRelay := func(id string, members map[string]string) *relay.Server {
		t.Helper()
		cfg := relaytest.Config(id)
		cfg.Members = members
		cfg.Keys.Current = &relay.KeyConfig{ID: pki.KeyID(secret), SecretHex: hex.EncodeToString(secret)}
		return relaytest.Start(t, cfg)
	}
	c := startRelay("c", nil)
	b := startRelay("b", map[string]string{"c": c.HopAddr().String()})

	dir := t.TempDir()
	table := api.Table{
		LoP: "a", Version: 1, Keys: api.Keys{Current: controller.FEPKeyOf(secret, "a", []string{"b", "c"})},
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
		"services": []map[string]string{{"listen": svc, "origin": origin.Addr()}},
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
	var err error
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
