package mget

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Identity names one version of an object: mirrors must agree on it.
type Identity struct {
	Size     int64  `json:"size"`
	ETag     string `json:"etag,omitempty"`
	Modified string `json:"last_modified,omitempty"`
}

// ErrBadSource marks a response that breaks the range protocol (200 to a
// range request, a wrong or missing Content-Range, a length that does not
// match): the sub-flow stops using that source.
var ErrBadSource = errors.New("bad source")

// ErrMismatch marks a mirror whose object differs from the reference one.
var ErrMismatch = errors.New("mirror disagrees")

// parseContentRange parses "bytes first-last/complete" (complete may be
// "*" only in a 416, which is an error here).
func parseContentRange(v string) (first, last, complete int64, err error) {
	unit, rest, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || unit != "bytes" {
		return 0, 0, 0, fmt.Errorf("content-range %q: not a byte range", v)
	}
	rng, total, ok := strings.Cut(strings.TrimSpace(rest), "/")
	if !ok {
		return 0, 0, 0, fmt.Errorf("content-range %q: no complete length", v)
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, fmt.Errorf("content-range %q: no range", v)
	}
	if first, err = digits(a); err != nil {
		return 0, 0, 0, fmt.Errorf("content-range %q: %w", v, err)
	}
	if last, err = digits(b); err != nil {
		return 0, 0, 0, fmt.Errorf("content-range %q: %w", v, err)
	}
	if complete, err = digits(total); err != nil {
		return 0, 0, 0, fmt.Errorf("content-range %q: %w", v, err)
	}
	if last < first || last >= complete {
		return 0, 0, 0, fmt.Errorf("content-range %q: range outside the object", v)
	}
	return first, last, complete, nil
}

func digits(s string) (int64, error) {
	if s == "" || len(s) > 18 {
		return 0, errors.New("not a byte count")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("not a byte count")
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// identityOf returns the identity a 206 response reports.
func identityOf(h http.Header, complete int64) Identity {
	return Identity{Size: complete, ETag: h.Get("ETag"), Modified: h.Get("Last-Modified")}
}

// checkPart validates the response to a request for bytes [off, end) of the
// object id (id.Size < 0: not known yet) and returns the bytes it carries,
// [off, upto), and the identity it reports. A source may send fewer bytes
// than asked (upto < end), never other ones.
func checkPart(status int, h http.Header, off, end int64, id Identity) (upto int64, got Identity, err error) {
	switch status {
	case http.StatusPartialContent:
	case http.StatusOK:
		return 0, got, fmt.Errorf("%w: answered 200 (whole object) to a range request: no range support, or the object changed (If-Range)", ErrBadSource)
	case http.StatusRequestedRangeNotSatisfiable:
		return 0, got, fmt.Errorf("%w: 416 for bytes %d-%d: the object is shorter here", ErrMismatch, off, end-1)
	default:
		return 0, got, fmt.Errorf("status %d", status)
	}
	if len(h.Values("Content-Range")) != 1 {
		return 0, got, fmt.Errorf("%w: 206 with %d Content-Range headers", ErrBadSource, len(h.Values("Content-Range")))
	}
	first, last, complete, err := parseContentRange(h.Get("Content-Range"))
	if err != nil {
		return 0, got, fmt.Errorf("%w: %v", ErrBadSource, err)
	}
	if first != off || last >= end {
		return 0, got, fmt.Errorf("%w: asked bytes %d-%d, got Content-Range %d-%d", ErrBadSource, off, end-1, first, last)
	}
	if cl := h.Get("Content-Length"); cl != "" {
		n, err := digits(cl)
		if err != nil || n != last-first+1 {
			return 0, got, fmt.Errorf("%w: Content-Length %q does not match Content-Range %d-%d", ErrBadSource, cl, first, last)
		}
	}
	got = identityOf(h, complete)
	if id.Size >= 0 {
		if err := sameObject(id, got); err != nil {
			return 0, got, err
		}
	}
	return last + 1, got, nil
}

// sameObject reports whether a mirror's identity got matches the reference
// want: equal length, and equal validators where both sides have them
// (ETag first, else Last-Modified).
func sameObject(want, got Identity) error {
	if want.Size != got.Size {
		return fmt.Errorf("%w: length %d, reference %d", ErrMismatch, got.Size, want.Size)
	}
	// Weak tags promise equal meaning, not equal bytes: only strong ones
	// count.
	if strong(want.ETag) && strong(got.ETag) {
		if want.ETag != got.ETag {
			return fmt.Errorf("%w: ETag %s, reference %s", ErrMismatch, got.ETag, want.ETag)
		}
		return nil
	}
	if want.Modified != "" && got.Modified != "" && want.Modified != got.Modified {
		return fmt.Errorf("%w: Last-Modified %s, reference %s", ErrMismatch, got.Modified, want.Modified)
	}
	return nil
}

func strong(etag string) bool { return etag != "" && !strings.HasPrefix(etag, "W/") }
