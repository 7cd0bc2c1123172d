package topo

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// MaxLocations bounds the number of locations a reader accepts, so that a
// hostile or mistaken input cannot make it allocate a huge matrix.
const MaxLocations = 5000

// maxListed is how many individual pairs a warning names before it only
// counts the rest.
const maxListed = 10

// asymmetryWarn is the relative difference between the two directions of a
// pair above which ReadCSV names the pair in a warning.
const asymmetryWarn = 0.10

// ReadCSV reads an RTT matrix in milliseconds from CSV. name labels errors
// and warnings ("rtt.csv:17: column 4: ...").
//
// The first record is a header of location names. Two layouts are accepted,
// told apart by the number of data rows:
//   - labelled: the header's first cell is a label (it may be empty) and every
//     row starts with its location's name; rows may come in any order. A row
//     naming a location that has no column adds that location, measured in
//     one direction only (with a warning; the Azure matrix has one);
//   - bare: the header holds only names and row i belongs to the i-th name.
//
// Row = source, column = destination. A blank cell, NaN, NA, "-" or Inf means
// "not measured" (no direct link, +Inf). Lines starting with '#' are comments.
// Diagonal entries other than 0 or blank are ignored with a warning.
//
// The result is symmetric: when both directions are measured the RTT is their
// mean, when only one is, that one. Pairs whose directions differ by more than
// 10% are named in a warning; the total number of averaged pairs is reported.
func ReadCSV(r io.Reader, name string) (*Matrix, []string, error) {
	br := bufio.NewReader(r)
	if bom, err := br.Peek(3); err == nil && string(bom) == "\ufeff" {
		br.Discard(3)
	}
	cr := csv.NewReader(br)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	var recs [][]string
	var lines []int
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, nil, fmt.Errorf("%s:%d: column %d: %v", name, pe.Line, pe.Column, pe.Err)
			}
			return nil, nil, fmt.Errorf("read %s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		recs = append(recs, rec)
		lines = append(lines, line)
		if len(recs) > MaxLocations+1 {
			return nil, nil, fmt.Errorf("%s: more than %d locations", name, MaxLocations)
		}
	}
	if len(recs) == 0 {
		return nil, nil, fmt.Errorf("%s: empty file; want a header row of location names", name)
	}
	header := recs[0]
	if len(header) > MaxLocations+1 {
		return nil, nil, fmt.Errorf("%s:%d: more than %d locations", name, lines[0], MaxLocations)
	}
	rows, rowLines := recs[1:], lines[1:]
	h := len(header)
	labelled := false
	switch len(rows) {
	case h - 1:
		labelled = true
	case h:
	default:
		return nil, nil, fmt.Errorf("%s: %d cells in the header but %d data rows; want a square matrix: n names then n rows, or a label cell and n names then n rows that start with their name", name, h, len(rows))
	}
	first := 0
	if labelled {
		first = 1
	}
	names := make([]string, 0, h-first)
	index := make(map[string]int, h-first)
	for c := first; c < h; c++ {
		n := strings.TrimSpace(header[c])
		if n == "" {
			return nil, nil, fmt.Errorf("%s:%d: column %d: empty location name", name, lines[0], c+1)
		}
		if _, dup := index[n]; dup {
			return nil, nil, fmt.Errorf("%s:%d: column %d: duplicate location %q", name, lines[0], c+1, n)
		}
		index[n] = len(names)
		names = append(names, n)
	}
	cols := len(names)
	if cols == 0 {
		return nil, nil, fmt.Errorf("%s: no locations", name)
	}
	// In the labelled layout a row may name a location without a column
	// (and then some column has no row): such locations are measured in one
	// direction only.
	var rowOnly []string
	if labelled {
		for k, rec := range rows {
			rn := strings.TrimSpace(rec[0])
			if rn == "" {
				return nil, nil, fmt.Errorf("%s:%d: column 1: empty row name", name, rowLines[k])
			}
			if _, ok := index[rn]; !ok {
				index[rn] = len(names)
				names = append(names, rn)
				rowOnly = append(rowOnly, rn)
			}
		}
	}
	n := len(names)
	raw := make([][]float64, n)
	for i := range raw {
		raw[i] = make([]float64, n)
		for j := range raw[i] {
			raw[i][j] = math.Inf(1)
		}
	}
	seen := make([]bool, n)
	var warns []string
	var diag []string
	for k, rec := range rows {
		line := rowLines[k]
		if len(rec) != h {
			return nil, nil, fmt.Errorf("%s:%d: row has %d cells; want %d like the header", name, line, len(rec), h)
		}
		i := k
		if labelled {
			i = index[strings.TrimSpace(rec[0])]
			if seen[i] {
				return nil, nil, fmt.Errorf("%s:%d: column 1: second row for %q", name, line, names[i])
			}
		}
		seen[i] = true
		for c := first; c < h; c++ {
			j := c - first
			v, err := parseRTT(rec[c])
			if err != nil {
				return nil, nil, fmt.Errorf("%s:%d: column %d: %w", name, line, c+1, err)
			}
			if i == j && v != 0 && !math.IsInf(v, 1) {
				diag = append(diag, names[i])
			}
			raw[i][j] = v
		}
	}
	if len(rowOnly) > 0 {
		var colOnly []string
		for i := 0; i < cols; i++ {
			if !seen[i] {
				colOnly = append(colOnly, names[i])
			}
		}
		warns = append(warns, fmt.Sprintf("%s: rows and columns name different locations; measured in one direction only: %s (row, no column), %s (column, no row)",
			name, listed(rowOnly), listed(colOnly)))
	}
	if len(diag) > 0 {
		warns = append(warns, fmt.Sprintf("%s: ignored %d non-zero diagonal entries (RTT of a location to itself is 0): %s", name, len(diag), listed(diag)))
	}
	m := &Matrix{Names: names, RTT: make([][]float64, n)}
	for i := range m.RTT {
		m.RTT[i] = make([]float64, n) // the diagonal stays 0
	}
	var asym []string
	averaged := 0
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			a, b := raw[i][j], raw[j][i]
			var v float64
			switch {
			case math.IsInf(a, 1):
				v = b
			case math.IsInf(b, 1):
				v = a
			default:
				v = (a + b) / 2
				if a != b {
					averaged++
					if math.Abs(a-b) > asymmetryWarn*math.Min(a, b) {
						asym = append(asym, fmt.Sprintf("%s<->%s %g/%g ms", names[i], names[j], a, b))
					}
				}
			}
			m.RTT[i][j], m.RTT[j][i] = v, v
		}
	}
	if averaged > 0 {
		warns = append(warns, fmt.Sprintf("%s: %d asymmetric pairs symmetrised to the mean of both directions", name, averaged))
	}
	if len(asym) > 0 {
		warns = append(warns, fmt.Sprintf("%s: %d pairs differ by more than %.0f%% between directions: %s", name, len(asym), asymmetryWarn*100, listed(asym)))
	}
	return m, warns, nil
}

// parseRTT parses one matrix cell: +Inf for "not measured".
func parseRTT(s string) (float64, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "", "nan", "na", "n/a", "-", "inf", "+inf", "infinity", "+infinity":
		return math.Inf(1), nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("RTT %q is not a number", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("RTT %q is negative", s)
	}
	return v, nil
}

// listed joins the first maxListed items and counts the rest.
func listed(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:maxListed], ", "), len(items)-maxListed)
}
