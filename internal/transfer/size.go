package transfer

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize parses a transfer size: a non-negative number of bytes with an
// optional unit B, KB, MB or GB (decimal: 1 KB = 1000 B; case-insensitive,
// "K"/"M"/"G" accepted too), e.g. "500", "10KB", "1.5MB".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"G", 1e9}, {"M", 1e6}, {"K", 1e3}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || t == "" || strings.ContainsAny(t, "EXPINFAx_") {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional unit B, KB, MB or GB", s)
	}
	v *= mult
	if v < 0 || v > 1e15 || math.IsNaN(v) {
		return 0, fmt.Errorf("size %q: out of range [0, 1PB]", s)
	}
	n := math.Round(v)
	if math.Abs(n-v) > 1e-6 {
		return 0, fmt.Errorf("size %q: not a whole number of bytes", s)
	}
	return int64(n), nil
}

// ParseSizes parses a comma-separated list of sizes.
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := ParseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sizes %q: empty list", s)
	}
	return out, nil
}

// FormatSize prints n bytes in the largest decimal unit that divides it
// evenly enough to stay short: 10000 -> "10KB", 1500000 -> "1.5MB", 999 -> "999B".
func FormatSize(n int64) string {
	switch {
	case n >= 1e9 && n%1e7 == 0:
		return strconv.FormatFloat(float64(n)/1e9, 'f', -1, 64) + "GB"
	case n >= 1e6 && n%1e4 == 0:
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + "MB"
	case n >= 1e3 && n%10 == 0:
		return strconv.FormatFloat(float64(n)/1e3, 'f', -1, 64) + "KB"
	}
	return strconv.FormatInt(n, 10) + "B"
}
