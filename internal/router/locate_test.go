package router

import (
	"net/netip"
	"testing"

	"github.com/mosto-net/mosto/internal/topo"
)

func TestLocationsFromMatrix(t *testing.T) {
	m := topo.WonderProxy()
	dublin := netip.MustParsePrefix("10.1.0.0/16")
	tokyo := netip.MustParsePrefix("10.2.0.0/16")
	locs, err := LocationsFromMatrix(m, map[netip.Prefix]string{dublin: "Dublin", tokyo: "Tokyo"},
		map[string]string{"eu": "London", "asia": "Osaka"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPicker(PickConfig{Surrogates: []Surrogate{{"eu", "10.0.0.1:80"}, {"asia", "10.0.0.2:80"}}, Locations: locs})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Nearest(netip.MustParseAddr("10.1.3.4")).Name; got != "eu" {
		t.Errorf("Dublin client -> %s; want eu", got)
	}
	if got := p.Nearest(netip.MustParseAddr("10.2.3.4")).Name; got != "asia" {
		t.Errorf("Tokyo client -> %s; want asia", got)
	}
	if _, err := LocationsFromMatrix(m, map[netip.Prefix]string{dublin: "Atlantis"}, nil); err == nil {
		t.Error("unknown site accepted")
	}
}
