package topo

import (
	"fmt"
	"math"
	"strings"
	"unicode"
)

// Matrix is a square matrix of round-trip times in milliseconds between named
// locations. RTT[i][j] is +Inf when there is no direct link (not measured).
// RTT[i][i] is 0. A Matrix is symmetric once returned by a reader.
type Matrix struct {
	Names []string
	RTT   [][]float64
}

// Len returns the number of locations.
func (m *Matrix) Len() int { return len(m.Names) }

// Index returns the position of the location called name, or -1.
func (m *Matrix) Index(name string) int {
	for i, n := range m.Names {
		if n == name {
			return i
		}
	}
	return -1
}

// Validate checks that the matrix is square, named uniquely, has a zero
// diagonal and only non-negative (or +Inf) entries.
func (m *Matrix) Validate() error {
	n := len(m.Names)
	if len(m.RTT) != n {
		return fmt.Errorf("topo: matrix has %d rows for %d names", len(m.RTT), n)
	}
	seen := make(map[string]bool, n)
	for i, name := range m.Names {
		if name == "" {
			return fmt.Errorf("topo: location %d has an empty name", i)
		}
		if seen[name] {
			return fmt.Errorf("topo: duplicate location %q", name)
		}
		seen[name] = true
		if len(m.RTT[i]) != n {
			return fmt.Errorf("topo: row %q has %d columns, want %d", name, len(m.RTT[i]), n)
		}
		for j, v := range m.RTT[i] {
			if math.IsNaN(v) || v < 0 || math.IsInf(v, -1) {
				return fmt.Errorf("topo: RTT %q -> %q is %v; want >= 0 or +Inf", name, m.Names[j], v)
			}
		}
		if m.RTT[i][i] != 0 {
			return fmt.Errorf("topo: RTT %q -> itself is %v; want 0", name, m.RTT[i][i])
		}
	}
	return nil
}

// Subset returns the matrix restricted to the named locations, in that order.
func (m *Matrix) Subset(names []string) (*Matrix, error) {
	idx := make([]int, len(names))
	for k, name := range names {
		i := m.Index(name)
		if i < 0 {
			return nil, fmt.Errorf("topo: unknown location %q", name)
		}
		idx[k] = i
	}
	out := &Matrix{Names: append([]string(nil), names...), RTT: make([][]float64, len(names))}
	for a, i := range idx {
		out.RTT[a] = make([]float64, len(names))
		for b, j := range idx {
			out.RTT[a][b] = m.RTT[i][j]
		}
	}
	return out, nil
}

// Find returns the position of the location called name, matching exactly
// first and then ignoring case, spaces and punctuation ("san francisco"
// finds "SanFrancisco"); -1 if there is no match or the loose match is
// ambiguous.
func (m *Matrix) Find(name string) int {
	if i := m.Index(name); i >= 0 {
		return i
	}
	key := looseName(name)
	if key == "" {
		return -1
	}
	found := -1
	for i, n := range m.Names {
		if looseName(n) == key {
			if found >= 0 {
				return -1
			}
			found = i
		}
	}
	return found
}

// looseName lowercases s and keeps only its letters and digits.
func looseName(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}
