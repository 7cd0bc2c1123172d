package topo

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// data holds the embedded datasets; data/PROVENANCE says where each came
// from and under which terms.
//
//go:embed data
var data embed.FS

// DefaultCities returns the 30 WonderProxy locations of Default: the cities the
// demo needs (Dublin, London, New York, Washington, Chicago, Denver, San
// Francisco, Los Angeles) and a spread over every continent.
func DefaultCities() []string {
	return []string{
		// Europe
		"Dublin", "London", "Amsterdam", "Frankfurt", "Paris", "Madrid", "Stockholm", "Moscow",
		// North America
		"NewYork", "Washington", "Chicago", "Atlanta", "Miami", "Dallas", "Denver", "Seattle", "SanFrancisco", "LosAngeles",
		// Middle East, Asia, Oceania
		"TelAviv", "Dubai", "NewDelhi", "Singapore", "HongKong", "Tokyo", "Sydney", "Auckland",
		// South America, Africa
		"SaoPaulo", "Santiago", "Johannesburg", "Nairobi",
	}
}

// RocketfuelASes returns the numbers of the embedded Rocketfuel maps.
func RocketfuelASes() []string {
	return []string{"1221", "1239", "1755", "3257", "3967", "6461"}
}

const wonderProxyFile = "data/wonderproxy/rtt_min_ms.csv"

// WonderProxy returns the embedded 246-location WonderProxy matrix
// (2020-07-19, minimum RTT of `ping -c 30` per hour, symmetrised by ReadCSV's
// rule). It panics only if the embedded file is corrupt, which the package
// tests rule out.
func WonderProxy() *Matrix {
	b, err := data.ReadFile(wonderProxyFile)
	if err != nil {
		panic(fmt.Sprintf("topo: embedded WonderProxy matrix: %v", err))
	}
	m, _, err := ReadCSV(bytes.NewReader(b), "wonderproxy/rtt_min_ms.csv")
	if err != nil {
		panic(fmt.Sprintf("topo: embedded WonderProxy matrix: %v", err))
	}
	return m
}

// Default returns the default input of `mosto plan`: the DefaultCities subset
// of WonderProxy, in that order.
func Default() *Matrix {
	m, err := WonderProxy().Subset(DefaultCities())
	if err != nil {
		panic(fmt.Sprintf("topo: default subset: %v", err))
	}
	return m
}

// Rocketfuel returns the embedded Rocketfuel map of the AS ("1221" or
// "AS1221"), at router level or with routers collapsed into cities.
func Rocketfuel(as string, cities bool) (*Matrix, error) {
	as = strings.TrimPrefix(strings.ToUpper(as), "AS")
	found := false
	for _, a := range RocketfuelASes() {
		found = found || a == as
	}
	if !found {
		return nil, fmt.Errorf("topo: no embedded Rocketfuel map for AS%s; have %s", as, strings.Join(RocketfuelASes(), ", "))
	}
	name := "rocketfuel/AS" + as + "/latencies.intra"
	b, err := data.ReadFile("data/" + name)
	if err != nil {
		return nil, fmt.Errorf("topo: %w", err)
	}
	return ReadRocketfuel(bytes.NewReader(b), name, RocketfuelOptions{Cities: cities})
}

// Graph is a named matrix of an evaluation set.
type Graph struct {
	Name   string
	Matrix *Matrix
}

// ZooGraphs returns the embedded geolocated Topology Zoo graphs whose full
// mesh has between minN and maxN locations, ordered by file name.
func ZooGraphs(minN, maxN int) ([]*Matrix, error) {
	gs, err := ZooNamed(minN, maxN)
	if err != nil {
		return nil, err
	}
	out := make([]*Matrix, len(gs))
	for i, g := range gs {
		out[i] = g.Matrix
	}
	return out, nil
}

// ZooNamed is ZooGraphs with each graph's name (its file name without .gml).
func ZooNamed(minN, maxN int) ([]Graph, error) {
	entries, err := fs.ReadDir(data, "data/zoo")
	if err != nil {
		return nil, fmt.Errorf("topo: %w", err)
	}
	var out []Graph
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".gml") {
			continue
		}
		b, err := data.ReadFile(path.Join("data/zoo", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("topo: %w", err)
		}
		m, err := ReadGML(bytes.NewReader(b), "zoo/"+e.Name())
		if err != nil {
			return nil, err
		}
		if m.Len() >= minN && m.Len() <= maxN {
			out = append(out, Graph{Name: "Zoo " + strings.TrimSuffix(e.Name(), ".gml"), Matrix: m})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// EvalGraphs returns the evaluation set of the seed paper's Sec. V with sizes
// in [minN, maxN]: the Rocketfuel maps at city and router level, then the
// geolocated Topology Zoo graphs.
func EvalGraphs(minN, maxN int) ([]Graph, error) {
	var out []Graph
	for _, cities := range []bool{true, false} {
		for _, as := range RocketfuelASes() {
			m, err := Rocketfuel(as, cities)
			if err != nil {
				return nil, err
			}
			level := "routers"
			if cities {
				level = "cities"
			}
			if m.Len() >= minN && m.Len() <= maxN {
				out = append(out, Graph{Name: fmt.Sprintf("Rocketfuel AS%s %s", as, level), Matrix: m})
			}
		}
	}
	zoo, err := ZooNamed(minN, maxN)
	if err != nil {
		return nil, err
	}
	return append(out, zoo...), nil
}
