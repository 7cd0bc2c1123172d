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
