package router

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/mosto-net/mosto/internal/topo"
)

// LocationsFromMatrix builds the picker's locations from an RTT matrix (the
// controller's RTT data, or a dataset of package topo): each client prefix
// is placed at a site of m, each surrogate at a site, and the location's
// RTTs are the matrix entries between them. Unmeasured pairs are left out.
func LocationsFromMatrix(m *topo.Matrix, clientSites map[netip.Prefix]string, surrogateSites map[string]string) ([]Location, error) {
	site := func(name string) (int, error) {
		i := m.Find(name)
		if i < 0 {
			return 0, fmt.Errorf("router: site %q is not in the RTT matrix", name)
		}
		return i, nil
	}
	var out []Location
	for prefix, cs := range clientSites {
		ci, err := site(cs)
		if err != nil {
			return nil, err
		}
		loc := Location{Prefix: prefix, RTT: map[string]time.Duration{}}
		for name, ss := range surrogateSites {
			si, err := site(ss)
			if err != nil {
				return nil, err
			}
			rtt := m.RTT[ci][si]
			if math.IsInf(rtt, 0) || math.IsNaN(rtt) {
				continue
			}
			loc.RTT[name] = time.Duration(rtt * float64(time.Millisecond))
		}
		out = append(out, loc)
	}
	return out, nil
}
