package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/probe"
)

// TestProxyFileErrors checks the checks of a proxy file that span the
// daemon's settings and the controller section, and that the controller
// section is checked by its owner (internal/agent) with its line numbers.
func TestProxyFileErrors(t *testing.T) {
	const keys = "keys: {current: {id: 1, secret_hex: 000102030405060708090a0b0c0d0e0f}}\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"controller url", "id: a\ncontroller: {data_dir: d, hop_addr: 'h:1'}\n", "controller.url: required"},
		{"controller data", "id: a\ncontroller: {url: 'http://c:1', hop_addr: 'h:1'}\n", "controller.data_dir: required"},
		{"controller hop", "id: a\ncontroller: {url: 'http://c:1', data_dir: d}\n", "controller.hop_addr"},
		{"controller token", "id: a\ncontroller: {url: 'http://c:1', data_dir: d, hop_addr: 'h:1', token: x, token_file: y}\n", "exclusive"},
		{"controller unreachable after", "id: a\ncontroller: {url: 'http://c:1', data_dir: d, hop_addr: 'h:1', probe_unreachable_after: -1}\n", "probe_unreachable_after"},
		{"controller probe method", "id: a\ncontroller: {url: 'http://c:1', data_dir: d, hop_addr: 'h:1', probe_method: icmp}\n", "probe_method"},
		{"controller unknown key", "id: a\ncontroller:\n  url: 'http://c:1'\n  probe_intervall: 5s\n", "line 4: field probe_intervall not found"},
		{"lop and controller.lop", "id: a\nlop: b\ncontroller: {url: 'http://c:1', data_dir: d, hop_addr: 'h:1', lop: c}\n", "set at most one of lop"},
		{"workers with controller", "id: a\nworkers: 2\ncontroller: {url: 'http://c:1', data_dir: d, hop_addr: 'h:1'}\n", "workers: 2 with a controller"},
		{"daemon error beside", "id: a\nworkers: -1\ncontroller: {url: 'http://c:1', data_dir: d, hop_addr: 'h:1'}\n", "workers: -1"},
		{"unmanaged needs keys", "id: a\nhop: {listen: ':1'}\n", "keys.current: missing"},
		{"daemon unknown key", "id: a\nhop:\n  listen: :1\n  bogus: 1\n" + keys, "line 4: field bogus not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseProxyFile(strings.NewReader(tc.yaml), ".")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseProxyFile = %v; want error containing %q", err, tc.want)
			}
		})
	}
}

// TestProxyProbeMethod checks that `mosto proxy` accepts the controller
// section docs/discovery.md documents, probe_method included (it used to
// reject it: the section was defined twice and the copies had drifted),
// and that the method and the relative paths reach the agent.
func TestProxyProbeMethod(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "join.token"), []byte(" mosto1.tok\n"), 0o600)
	y := `id: fra
hop: {listen: "127.0.0.1:0"}
controller:
  url: https://controller.example:7443
  token_file: join.token
  data_dir: data
  hop_addr: 203.0.113.7:7000
  probe_listen: ":7001"
  probe_addr: 203.0.113.7:7001
  location: Frankfurt, DE
  lat: 50.11
  lon: 8.68
  probe_interval: 10s
  probe_method: tcp
  probe_unreachable_after: 5
`
	path := filepath.Join(dir, "fra.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := Run(context.Background(), []string{"proxy", "--config", path, "--check"}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("mosto proxy --check = %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), ": ok") {
		t.Errorf("stdout = %q", stdout.String())
	}
	pf, err := LoadProxyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := pf.agentConfig()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ac.Probe.Measurer.(probe.TCPHandshake); !ok {
		t.Errorf("Probe.Measurer = %#v; want probe.TCPHandshake", ac.Probe.Measurer)
	}
	if ac.Token != "mosto1.tok" || ac.DataDir != filepath.Join(dir, "data") || ac.Probe.UnreachableAfter != 5 ||
		ac.FEP.ID != "fra" || ac.FEP.HopAddr != "203.0.113.7:7000" || ac.ProbeListen != ":7001" {
		t.Errorf("agent config = %+v", ac)
	}
}

// FuzzProxyFile checks that no proxy file makes the composed parser panic
// or hang, and that an accepted one yields an agent config or a clear error.
func FuzzProxyFile(f *testing.F) {
	f.Add("id: a\ncontroller: {url: 'https://c:1', data_dir: d, hop_addr: 'h:1', probe_addr: 'h:2', probe_method: tcp}\n")
	f.Add("id: a\nlop: b\ncontroller: {url: 'http://c:1', data_dir: d, hop_addr: 'h:1', lop: c}\n")
	f.Add("id: a\nworkers: 2\nhop: {listen: ':1'}\nkeys: {current: {id: 1, secret_hex: 00}}\n")
	f.Add("controller: [1, 2]\n")
	f.Fuzz(func(t *testing.T, s string) {
		pf, err := ParseProxyFile(strings.NewReader(s), t.TempDir())
		if err != nil {
			return
		}
		if (pf.Controller != nil) != pf.Config.Managed {
			t.Fatalf("Managed = %v with controller section %v", pf.Config.Managed, pf.Controller != nil)
		}
		pf.agentConfig()
	})
}
