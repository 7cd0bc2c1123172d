package scenario

import (
	"maps"
	"strings"
	"testing"
)

func TestParseOffloadCounts(t *testing.T) {
	in := `# HELP mosto_relay_offload_joined_total Handovers that joined the flow in the kernel.
# TYPE mosto_relay_offload_joined_total counter
mosto_relay_offload_joined_total 6
mosto_relay_offload_refused_total 1
mosto_relay_offload_handovers_total 7
mosto_relay_upstream_total{peer="origin"} 3
`
	got, err := parseOffloadCounts(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"joined": 6, "refused": 1, "handovers": 7}
	if !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"mosto_relay_offload_joined_total x\n", "mosto_relay_offload_joined_total\n"} {
		if _, err := parseOffloadCounts(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
