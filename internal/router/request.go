package router

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Limits bound a request head. The zero value means the defaults.
type Limits struct {
	MaxHead    int // bytes of the request line and headers, CRLFCRLF included; 0 means 8192
	MaxHeaders int // header fields; 0 means 64
}

func (l Limits) withDefaults() Limits {
	if l.MaxHead <= 0 {
		l.MaxHead = 8192
	}
	if l.MaxHeaders <= 0 {
		l.MaxHeaders = 64
	}
	return l
}

// Request is a parsed HTTP/1.1 (or 1.0) request head.
type Request struct {
	Method string
	Target string // origin-form: starts with '/'
	Minor  int    // HTTP/1.Minor
	Host   string
	// HeadLen is the length of the head in the buffer, CRLFCRLF included.
	HeadLen int
	// BodyLen is the Content-Length (0 without one).
	BodyLen int64
	// Close is true when the client asked to close after this request
	// (Connection: close, or HTTP/1.0 without keep-alive).
	Close bool
}

// ErrIncomplete means the buffer holds the start of a request head that is
// valid so far but not yet complete: read more and parse again.
var ErrIncomplete = errors.New("router: incomplete request head")

// ErrTooLarge means the head exceeds Limits.MaxHead or MaxHeaders.
var ErrTooLarge = errors.New("router: request head too large")

// BadRequestError describes why a request head is invalid.
type BadRequestError struct{ Reason string }

func (e *BadRequestError) Error() string { return "router: bad request: " + e.Reason }

func bad(format string, args ...any) error {
	return &BadRequestError{Reason: fmt.Sprintf(format, args...)}
}

// ParseRequest parses the request head at the start of buf. It returns
// ErrIncomplete when buf is a valid prefix of a head, ErrTooLarge when the
// head is over the limits, a *BadRequestError when it is invalid. Bytes after
// the head (a body, pipelined requests) are left alone. The parser is
// strict: CRLF line ends, no obsolete line folding, a token method, an
// origin-form target, HTTP/1.0 or 1.1, a Host header (exactly one) for 1.1,
// no Transfer-Encoding, at most one Content-Length.
func ParseRequest(buf []byte, lim Limits) (*Request, error) {
	lim = lim.withDefaults()
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		if len(buf) >= lim.MaxHead {
			return nil, ErrTooLarge
		}
		// Reject early what can never become valid, so a garbage stream
		// does not wait for the timeout.
		if err := checkPrefix(buf); err != nil {
			return nil, err
		}
		return nil, ErrIncomplete
	}
	headLen := end + 4
	if headLen > lim.MaxHead {
		return nil, ErrTooLarge
	}
	head := buf[:end+2] // every line ends with CRLF
	lineEnd := bytes.Index(head, []byte("\r\n"))
	req := &Request{HeadLen: headLen}
	if err := parseRequestLine(head[:lineEnd], req); err != nil {
		return nil, err
	}
	rest := head[lineEnd+2:]
	hosts, lengths, fields := 0, 0, 0
	keepAlive, closeConn := false, false
	for len(rest) > 0 {
		i := bytes.Index(rest, []byte("\r\n"))
		line := rest[:i]
		rest = rest[i+2:]
		fields++
		if fields > lim.MaxHeaders {
			return nil, ErrTooLarge
		}
		name, value, err := parseField(line)
		if err != nil {
			return nil, err
		}
		switch {
		case asciiEqualFold(name, "host"):
			hosts++
			req.Host = string(value)
		case asciiEqualFold(name, "content-length"):
			lengths++
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || len(value) == 0 || value[0] == '+' {
				return nil, bad("invalid Content-Length %q", value)
			}
			req.BodyLen = n
		case asciiEqualFold(name, "transfer-encoding"):
			return nil, bad("Transfer-Encoding is not accepted")
		case asciiEqualFold(name, "connection"):
			for _, opt := range bytes.Split(value, []byte(",")) {
				opt = bytes.TrimSpace(opt)
				if asciiEqualFold(opt, "close") {
					closeConn = true
				}
				if asciiEqualFold(opt, "keep-alive") {
					keepAlive = true
				}
			}
		}
	}
	if lengths > 1 {
		return nil, bad("more than one Content-Length")
	}
	if hosts > 1 {
		return nil, bad("more than one Host")
	}
	if req.Minor == 1 && hosts == 0 {
		return nil, bad("HTTP/1.1 request without Host")
	}
	req.Close = closeConn || (req.Minor == 0 && !keepAlive)
	return req, nil
}

// checkPrefix rejects an incomplete head whose first line is already
// invalid (or which holds a bare LF or NUL).
func checkPrefix(buf []byte) error {
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		return bad("NUL byte in head")
	}
	lineEnd := bytes.Index(buf, []byte("\r\n"))
	if lineEnd < 0 {
		// Only the method's characters and the separators can come first.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			return bad("bare LF in request line")
		}
		sp := bytes.IndexByte(buf, ' ')
		method := buf
		if sp >= 0 {
			method = buf[:sp]
		}
		for _, c := range method {
			if !isTChar(c) && c != '\r' {
				return bad("invalid method character %q", c)
			}
		}
		if sp == 0 {
			return bad("empty method")
		}
		return nil
	}
	req := &Request{}
	return parseRequestLine(buf[:lineEnd], req)
}

func parseRequestLine(line []byte, req *Request) error {
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return bad("malformed request line")
	}
	method := line[:sp1]
	for _, c := range method {
		if !isTChar(c) {
			return bad("invalid method character %q", c)
		}
	}
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return bad("malformed request line")
	}
	target, proto := rest[:sp2], rest[sp2+1:]
	if target[0] != '/' {
		return bad("request target must be origin-form (start with /)")
	}
	for _, c := range target {
		if c <= ' ' || c >= 0x7f {
			return bad("invalid character %q in request target", c)
		}
	}
	switch string(proto) {
	case "HTTP/1.1":
		req.Minor = 1
	case "HTTP/1.0":
		req.Minor = 0
	default:
		return bad("unsupported protocol %q", proto)
	}
	req.Method = string(method)
	req.Target = string(target)
	return nil
}

func parseField(line []byte) (name, value []byte, err error) {
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			return nil, nil, bad("obsolete line folding")
		}
		return nil, nil, bad("header line without a name and colon")
	}
	name = line[:colon]
	for _, c := range name {
		if !isTChar(c) {
			return nil, nil, bad("invalid header name character %q", c)
		}
	}
	value = line[colon+1:]
	for _, c := range value {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return nil, nil, bad("invalid header value character %q", c)
		}
	}
	value = bytes.Trim(value, " \t")
	return name, value, nil
}

// isTChar reports whether c is an RFC 9110 token character.
func isTChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

func asciiEqualFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
