package emu

import (
	"errors"
	"fmt"
	"os"

	"github.com/mosto-net/mosto/internal/topo"
)

// loadDataset returns an embedded RTT dataset of package topo by name.
func loadDataset(name string) (*topo.Matrix, error) {
	return nil, errors.New("unknown dataset")
}

// loadCSV reads an RTT-matrix CSV file (milliseconds).
func loadCSV(path string) (*topo.Matrix, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, _, err := topo.ReadCSV(f, path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return m, nil
}
