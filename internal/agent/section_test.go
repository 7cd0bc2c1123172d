package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

func TestSection(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte("mosto1.abc\n"), 0o600)
	tests := []struct {
		name    string
		yaml    string
		hop     string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{"full", `
url: https://c:7443
token_file: ` + tokFile + `
data_dir: /var/lib/mosto
lop: par
hop_addr: 203.0.113.7:7000
probe_listen: ":7001"
probe_addr: 203.0.113.7:7001
location: Frankfurt, DE
lat: 50.1
lon: 8.7
probe_interval: 5s
probe_method: tcp
`, ":7000", "", func(t *testing.T, c Config) {
			if c.Token != "mosto1.abc" || c.LoP != "par" || c.FEP.HopAddr != "203.0.113.7:7000" ||
				c.ProbeListen != ":7001" || c.FEP.ProbeAddr != "203.0.113.7:7001" || c.Probe.Interval != 5*time.Second ||
				c.Probe.Measurer == nil || c.FEP.Lat != 50.1 || c.FEP.ID != "fra" {
				t.Errorf("Config = %+v", c)
			}
		}},
		{"defaults from the hop listener", "url: https://c:7443\ndata_dir: /d\nprobe_listen: 10.0.0.1:7001\n", "10.0.0.1:7000", "", func(t *testing.T, c Config) {
			if c.FEP.HopAddr != "10.0.0.1:7000" || c.FEP.ProbeAddr != "10.0.0.1:7001" || c.Probe.Measurer != nil {
				t.Errorf("Config = %+v", c)
			}
		}},
		{"missing token file is fine once joined", "url: https://c:7443\ndata_dir: /d\ntoken_file: /proc/mosto-no-such-token\nprobe_listen: 10.0.0.1:7001\n", "10.0.0.1:7000", "", nil},
		{"no url", "data_dir: /d\n", "10.0.0.1:7000", "url", nil},
		{"no data dir", "url: https://c\n", "10.0.0.1:7000", "data_dir", nil},
		{"unroutable hop", "url: https://c\ndata_dir: /d\nprobe_listen: 10.0.0.1:1\n", ":7000", "hop_addr", nil},
		{"bad method", "url: https://c\ndata_dir: /d\nprobe_listen: 10.0.0.1:1\nprobe_method: icmp\n", "10.0.0.1:7000", "probe_method", nil},
		{"token and file", "url: https://c\ndata_dir: /d\ntoken: a\ntoken_file: b\n", "10.0.0.1:7000", "exclusive", nil},
		{"off without addr", "url: https://c\ndata_dir: /d\nprobe_listen: \"off\"\n", "10.0.0.1:7000", "probe_addr", nil},
		{"bad lat", "url: https://c\ndata_dir: /d\nprobe_listen: 10.0.0.1:1\nlat: 91\n", "10.0.0.1:7000", "lat", nil},
		{"unknown key", "url: https://c\ndata_dir: /d\nprobe_intervall: 5s\n", "10.0.0.1:7000", "probe_intervall", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Section
			dec := yaml.NewDecoder(bytes.NewReader([]byte(tt.yaml)))
			dec.KnownFields(true)
			err := dec.Decode(&s)
			var c Config
			if err == nil {
				c, err = s.Config("fra", tt.hop, "")
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v; want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}
