package emu

import (
	"fmt"
	"strings"

	"github.com/mosto-net/mosto/internal/topo"
)

// Datasets names the embedded RTT datasets a spec may use.
const Datasets = "wonderproxy (246 cities), default (30 WonderProxy cities)"

// loadDataset returns an embedded RTT dataset of package topo by name.
func loadDataset(name string) (*topo.Matrix, error) {
	switch strings.ToLower(name) {
	case "wonderproxy":
		return topo.WonderProxy(), nil
	case "default":
		return topo.Default(), nil
	}
	return nil, fmt.Errorf("unknown dataset (have: %s)", Datasets)
}

// loadCSV reads an RTT matrix file: CSV (ms), Rocketfuel .intra or GML, by
// extension.
func loadCSV(path string) (*topo.Matrix, error) {
	m, _, err := topo.Load(path, "")
	if err != nil {
		return nil, err
	}
	return m, nil
}

// findLocation returns the index of a location, matching exactly or else
// ignoring case, spaces and punctuation ("San Francisco" = "SanFrancisco").
func findLocation(m *topo.Matrix, name string) int {
	if i := m.Index(name); i >= 0 {
		return i
	}
	want := normLoc(name)
	for i, n := range m.Names {
		if normLoc(n) == want {
			return i
		}
	}
	return -1
}

func normLoc(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127 {
			b.WriteRune(r)
		}
	}
	return b.String()
}
