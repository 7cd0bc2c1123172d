package cli

import (
	"strings"
	"testing"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/emu/emutest"
)

// TestCongestionNote checks that the bench reports the congestion control
// the origin's namespace really uses, and whether the world file chose it.
func TestCongestionNote(t *testing.T) {
	tests := []struct {
		name, tcp, want string
	}{
		{"set by the world", "tcp: {congestion: cubic}\n", "cubic (set by the world file)"},
		{"inherited", "", "(not set by the world file: the root namespace's default)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := emu.ParseSpec([]byte("name: cc\nhosts:\n  - {name: a}\n  - {name: origin}\nlinks:\n  - {a: a, b: origin, delay_ms: 1}\n" + tc.tcp))
			if err != nil {
				t.Fatal(err)
			}
			w := emutest.Start(t, spec)
			got := congestionNote(w, "origin", spec.TCP.Congestion)
			if !strings.Contains(got, tc.want) {
				t.Errorf("congestionNote = %q, want it to contain %q", got, tc.want)
			}
			if strings.Contains(got, "unknown") || strings.Contains(got, ":  (") {
				t.Errorf("congestionNote = %q: no congestion control read", got)
			}
		})
	}
}
