package topo

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Formats lists the input formats Load accepts, for help texts.
const Formats = "csv, rocketfuel (router level), rocketfuel-cities, gml"

// Load reads a network description from path and returns its RTT matrix and
// any warnings. format is one of "csv", "rocketfuel" (alias "intra": router
// level), "rocketfuel-cities" (routers collapsed into cities) and "gml"
// (alias "zoo"); "" picks it by extension: .csv, .intra, .gml.
func Load(path, format string) (*Matrix, []string, error) {
	if format == "" {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".csv":
			format = "csv"
		case ".intra":
			format = "rocketfuel"
		case ".gml":
			format = "gml"
		default:
			return nil, nil, fmt.Errorf("%s: cannot tell the format from the extension; want .csv, .intra or .gml, or name a format (%s)", path, Formats)
		}
	}
	read, err := reader(format)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open network input: %w", err)
	}
	defer f.Close()
	return read(f, path)
}

// Read is Load for an already open input; name labels errors.
func Read(r io.Reader, name, format string) (*Matrix, []string, error) {
	read, err := reader(format)
	if err != nil {
		return nil, nil, err
	}
	return read(r, name)
}

func reader(format string) (func(io.Reader, string) (*Matrix, []string, error), error) {
	switch strings.ToLower(format) {
	case "csv":
		return ReadCSV, nil
	case "rocketfuel", "intra":
		return func(r io.Reader, name string) (*Matrix, []string, error) {
			return readRocketfuel(r, name, RocketfuelOptions{})
		}, nil
	case "rocketfuel-cities", "intra-cities":
		return func(r io.Reader, name string) (*Matrix, []string, error) {
			return readRocketfuel(r, name, RocketfuelOptions{Cities: true})
		}, nil
	case "gml", "zoo":
		return readGML, nil
	}
	return nil, fmt.Errorf("unknown network input format %q; want one of %s", format, Formats)
}
