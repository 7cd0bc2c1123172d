package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/api"
	"github.com/mosto-net/mosto/internal/testenv"
)

// TestStatusAgainstController runs a controller with its dashboard
// listener, registers two FEPs that report RTTs and counters, and reads
// them back with `mosto status` (text, pair chains, auth).
func TestStatusAgainstController(t *testing.T) {
	apiAddr, uiAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	auth := filepath.Join(t.TempDir(), "ui-auth")
	if err := os.WriteFile(auth, []byte("ops:correct-horse\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- Run(ctx, []string{"controller", "--data", t.TempDir(), "--insecure", "--listen", apiAddr, "--allow-member-net", "10.0.0.0/8",
			"--debounce", "50ms", "--ui-listen", uiAddr, "--ui-auth-file", auth, "--ui-poll", "100ms"},
			strings.NewReader(""), &bytes.Buffer{}, &errb)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("controller exit %d: %s", code, errb.String())
			}
		case <-time.After(20 * time.Second):
			t.Error("controller did not stop")
		}
	}()
	c := &api.Client{BaseURL: "http://" + apiAddr, HTTP: &http.Client{Timeout: 5 * time.Second}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.Health(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller not up: %s", errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, f := range []api.FEP{{ID: "fra", HopAddr: "10.0.0.1:7000", ProbeAddr: "10.0.0.1:7001", Lat: 50, Lon: 8, Location: "Frankfurt"},
		{ID: "nyc", HopAddr: "10.0.0.2:7000", ProbeAddr: "10.0.0.2:7001", Lat: 40, Lon: -74}} {
		if err := c.RegisterFEP(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	for _, r := range []api.Report{
		{FEP: "fra", Samples: []api.Sample{{Peer: "nyc", RTTMS: 81}}, Stats: &api.ProxyStats{Started: now, At: now,
			Flows: map[string]float64{"ok": 42}, Direct: map[string]float64{"no_chain": 3}, Active: map[string]float64{"inp": 2}}},
		{FEP: "nyc", Samples: []api.Sample{{Peer: "fra", RTTMS: 79}}},
	} {
		if _, err := c.Report(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// A report with bad counters is refused, not stored.
	if _, err := c.Report(ctx, api.Report{FEP: "fra", Stats: &api.ProxyStats{Bytes: -1}}); err == nil || !strings.Contains(err.Error(), "stats") {
		t.Errorf("report with bytes -1: %v; want a 400 about stats", err)
	}
	status := func(args ...string) (int, string, string) {
		var out, eb bytes.Buffer
		code := Run(ctx, append([]string{"status", "--url", "http://" + uiAddr}, args...), strings.NewReader(""), &out, &eb)
		return code, out.String(), eb.String()
	}
	var out string
	for {
		code, o, e := status("--auth-file", auth, "--pair", "fra,nyc")
		out = o
		if code == 0 && strings.Contains(o, "fra -> nyc  cost") && strings.Contains(o, "no_chain:3") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the chain and counters: exit %d\n%s\n%s", code, o, e)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("mosto status:\n%s", out)
	for _, want := range []string{"leader yes", "store bbolt", "2 FEPs", "Frankfurt", "up", "chains fra -> nyc (LoP fra"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q", want)
		}
	}
	if code, _, e := status(); code != 1 || !strings.Contains(e, "401") {
		t.Errorf("status without credentials: exit %d, %q; want 1 with 401", code, e)
	}
	if code, _, e := status("--pair", "fra"); code != 2 || !strings.Contains(e, "FROM,TO") {
		t.Errorf("status --pair fra: exit %d, %q; want usage error", code, e)
	}
}

func TestUIListenNeedsAuth(t *testing.T) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"controller", "--data", t.TempDir(), "--insecure", "--listen", testenv.FreeAddr(t),
		"--ui-listen", "0.0.0.0:0"}, strings.NewReader(""), &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--ui-auth-file") {
		t.Errorf("--ui-listen 0.0.0.0:0 without auth: exit %d, %q; want 2 asking for --ui-auth-file", code, errb.String())
	}
}
