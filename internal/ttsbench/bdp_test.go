package ttsbench

import (
	"strings"
	"testing"
)

func TestBDPMode(t *testing.T) {
	for _, tt := range []struct {
		m    Mode
		g    float64
		isIt bool
	}{
		{"tts-bdp1.25", 1.25, true}, {"tts-bdp2", 2, true}, {"tts-bdp0.5", 0, false}, {"tts-bdp", 0, false}, {"tts", 0, false},
	} {
		if g, ok := tt.m.BDPGain(); g != tt.g || ok != tt.isIt {
			t.Errorf("%q.BDPGain() = %v, %v; want %v, %v", tt.m, g, ok, tt.g, tt.isIt)
		}
	}
	cfg := &Config{TProxyWindowClamp: 3e6, TProxyInitCwnd: 2000}
	conf := proxyConfWith("r1bdp0", []int{portBDP}, nil, "cubic", cfg, extraTProxy{listen: portBDPTP, mark: bdpMark, table: bdpTable, windowBDP: 1.25})
	for _, want := range []string{"id: r1bdp0\n", `listen: "0.0.0.0:15002"`, `ports: "8081"`, "mark: 19808, route_table: 19800", "window_bdp: 1.25", "initcwnd: 2000"} {
		if !strings.Contains(conf, want) {
			t.Errorf("the tts-bdp proxy's config lacks %q:\n%s", want, conf)
		}
	}
	if strings.Contains(conf, "window_clamp") {
		t.Errorf("the tts-bdp proxy's config has window_clamp beside window_bdp:\n%s", conf)
	}
	if proxyID(conf) != "r1bdp0" {
		t.Errorf("proxyID = %q", proxyID(conf))
	}
	if err := (&Config{Mosto: []string{"x"}, Dir: t.TempDir(), Trials: 1, Modes: []Mode{"tts-bdp0.5"}}).defaults(); err == nil {
		t.Error("defaults accepted mode tts-bdp0.5")
	}
}
