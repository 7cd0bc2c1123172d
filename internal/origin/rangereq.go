package origin

import (
	"errors"
	"strconv"
	"strings"
)

// errNoRange says a Range header is absent, not a byte range, or a
// multi-range request: the server answers with the whole object (RFC 9110
// lets a server ignore Range).
var errNoRange = errors.New("origin: no single byte range")

// errUnsatisfiable says a single byte range lies beyond the object (416).
var errUnsatisfiable = errors.New("origin: range not satisfiable")

// parseRange parses a Range header value of one byte range against an
// object of size bytes and returns the first offset and the length. Forms:
// "bytes=a-b", "bytes=a-" and "bytes=-n" (the last n bytes).
func parseRange(v string, size int64) (off, n int64, err error) {
	unit, spec, ok := strings.Cut(strings.TrimSpace(v), "=")
	if !ok || !strings.EqualFold(strings.TrimSpace(unit), "bytes") {
		return 0, 0, errNoRange
	}
	spec = strings.TrimSpace(spec)
	if spec == "" || strings.Contains(spec, ",") {
		return 0, 0, errNoRange
	}
	first, last, ok := strings.Cut(spec, "-")
	if !ok {
		return 0, 0, errNoRange
	}
	first, last = strings.TrimSpace(first), strings.TrimSpace(last)
	if first == "" {
		// Suffix range: the last n bytes.
		k, err := parseDigits(last)
		if err != nil {
			return 0, 0, errNoRange
		}
		if k == 0 || size == 0 {
			return 0, 0, errUnsatisfiable
		}
		k = min(k, size)
		return size - k, k, nil
	}
	a, err := parseDigits(first)
	if err != nil {
		return 0, 0, errNoRange
	}
	b := size - 1
	if last != "" {
		if b, err = parseDigits(last); err != nil || b < a {
			return 0, 0, errNoRange
		}
	}
	if a >= size {
		return 0, 0, errUnsatisfiable
	}
	b = min(b, size-1)
	return a, b - a + 1, nil
}

// parseDigits parses a non-empty run of ASCII digits (no sign, no spaces).
func parseDigits(s string) (int64, error) {
	if s == "" {
		return 0, errNoRange
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errNoRange
		}
	}
	return strconv.ParseInt(s, 10, 64)
}
