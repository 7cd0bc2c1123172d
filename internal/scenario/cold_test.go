package scenario

import (
	"strings"
	"testing"
)

func TestParsePooled(t *testing.T) {
	tests := []struct {
		name, in string
		want     int
		err      bool
	}{
		{"none", "", 0, false},
		{"mixed", `# TYPE mosto_relay_upstream_total counter
mosto_relay_upstream_total{peer="London",via="dial"} 1
mosto_relay_upstream_total{peer="London",via="pool"} 2
mosto_relay_upstream_total{peer="origin",via="pool"} 3
mosto_relay_pool_total{pool="hop",result="hit"} 9
`, 5, false},
		{"malformed", `mosto_relay_upstream_total{peer="London",via="pool"} x` + "\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePooled(strings.NewReader(tt.in))
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("parsePooled = %d, %v; want %d, error %v", got, err, tt.want, tt.err)
			}
		})
	}
}

func FuzzParsePooled(f *testing.F) {
	f.Add(`mosto_relay_upstream_total{peer="a",via="pool"} 2`)
	f.Add(`mosto_relay_upstream_total{via="pool"`)
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parsePooled(strings.NewReader(s))
		if err == nil && n < 0 && !strings.Contains(s, "-") {
			t.Errorf("parsePooled(%q) = %d", s, n)
		}
	})
}

func TestParseCPU(t *testing.T) {
	d, err := parsePidStat([]byte("1234 (mosto (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 0 0"))
	if err != nil || d != 325*clockTick {
		t.Errorf("parsePidStat = %v, %v; want %v", d, err, 325*clockTick)
	}
	if _, err := parsePidStat([]byte("1 (x) S 1 2")); err == nil {
		t.Error("parsePidStat accepted a short line")
	}
	busy, total, err := parseProcStat([]byte("cpu  100 5 50 800 20 3 2 0 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"))
	if err != nil || busy != 160 || total != 980 {
		t.Errorf("parseProcStat = %d, %d, %v; want 160, 980", busy, total, err)
	}
	if _, _, err := parseProcStat([]byte("intr 1 2 3")); err == nil {
		t.Error("parseProcStat accepted a file without a cpu line")
	}
}
