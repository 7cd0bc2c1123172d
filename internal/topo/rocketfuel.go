package topo

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// RocketfuelOptions tunes ReadRocketfuel.
type RocketfuelOptions struct {
	// Cities collapses the routers of one city into one location. A city is
	// the router name without its trailing numeric id, with '+' read as a
	// space ("San+Jose,+CA4062" -> "San Jose, CA"). Links inside a city are
	// dropped and the delay of an inter-city link is the smallest delay of
	// the router links between the two cities.
	Cities bool
}

// ReadRocketfuel reads a Rocketfuel latencies.intra map (one directed link
// per line: "<router> <router> <one-way latency ms>") and returns the full
// mesh the seed paper built from it: the RTT of two locations is twice the
// one-way latency of the shortest path between them. Only the largest
// connected component is kept. A link listed with two different latencies
// keeps the smaller one. name labels errors ("latencies.intra:17: ...").
func ReadRocketfuel(r io.Reader, name string, opt RocketfuelOptions) (*Matrix, error) {
	m, _, err := readRocketfuel(r, name, opt)
	return m, err
}

func readRocketfuel(r io.Reader, name string, opt RocketfuelOptions) (*Matrix, []string, error) {
	index := make(map[string]int)
	var names []string
	type link struct {
		u, v int
		ms   float64
	}
	var links []link
	node := func(router string) (int, error) {
		n := router
		if opt.Cities {
			n = rocketfuelCity(router)
		}
		if i, ok := index[n]; ok {
			return i, nil
		}
		if len(names) >= MaxLocations {
			return 0, fmt.Errorf("more than %d locations", MaxLocations)
		}
		index[n] = len(names)
		names = append(names, n)
		return len(names) - 1, nil
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) != 3 {
			return nil, nil, fmt.Errorf("%s:%d: %d fields; want \"<router> <router> <latency ms>\"", name, line, len(f))
		}
		ms, err := strconv.ParseFloat(f[2], 64)
		if err != nil || math.IsNaN(ms) || math.IsInf(ms, 0) {
			return nil, nil, fmt.Errorf("%s:%d: field 3: latency %q is not a number", name, line, f[2])
		}
		if ms < 0 {
			return nil, nil, fmt.Errorf("%s:%d: field 3: latency %q is negative", name, line, f[2])
		}
		if f[0] == f[1] {
			return nil, nil, fmt.Errorf("%s:%d: link from %q to itself", name, line, f[0])
		}
		u, err := node(f[0])
		if err != nil {
			return nil, nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		v, err := node(f[1])
		if err != nil {
			return nil, nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		links = append(links, link{u, v, ms})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, nil, fmt.Errorf("%s:%d: line longer than 1 MiB", name, line+1)
		}
		return nil, nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(links) == 0 {
		return nil, nil, fmt.Errorf("%s: no links", name)
	}
	g := newGraph(names)
	for _, l := range links {
		g.link(l.u, l.v, l.ms)
	}
	m, warn := g.fullMesh(name)
	var warns []string
	if warn != "" {
		warns = append(warns, warn)
	}
	if len(m.Names) < 2 {
		return nil, nil, fmt.Errorf("%s: fewer than 2 locations after collapsing routers into cities", name)
	}
	return m, warns, nil
}

// rocketfuelCity turns a router name into its city name.
func rocketfuelCity(router string) string {
	c := strings.TrimRight(router, "0123456789")
	if c == "" {
		c = router
	}
	c = strings.TrimSpace(strings.ReplaceAll(c, "+", " "))
	if c == "" {
		return router
	}
	return c
}
