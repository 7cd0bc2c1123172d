package httpconnect

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strconv"
	"strings"
)

// Errors of ReadRequest, wrapped with detail. StatusFor maps them to the
// status code to answer with.
var (
	ErrMalformed = errors.New("httpconnect: malformed request")
	ErrTooLarge  = errors.New("httpconnect: request header too large")
	ErrMethod    = errors.New("httpconnect: method not CONNECT")
)

// Defaults for Limits' zero fields.
const (
	DefaultMaxHeaderBytes = 8 << 10
	DefaultMaxHeaders     = 64
)

// Limits bounds what ReadRequest accepts. Zero fields take the defaults.
// Time limits are the caller's: set a read deadline on the connection.
type Limits struct {
	MaxHeaderBytes int // request line + header lines + final CRLF
	MaxHeaders     int // header fields
}

// ReadRequest reads one CONNECT request head from br and returns its
// authority-form target (host:port) and header. It stops right after the
// blank line ending the head: bytes the client pipelined after it (for
// instance a TLS ClientHello) stay in br, and the caller must forward
// br.Buffered() bytes before relaying the connection itself.
func ReadRequest(br *bufio.Reader, lim Limits) (string, http.Header, error) {
	if lim.MaxHeaderBytes <= 0 {
		lim.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if lim.MaxHeaders <= 0 {
		lim.MaxHeaders = DefaultMaxHeaders
	}
	budget := lim.MaxHeaderBytes
	line, err := readLine(br, &budget)
	if err != nil {
		return "", nil, err
	}
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || strings.Contains(proto, " ") {
		return "", nil, fmt.Errorf("%w: request line %q", ErrMalformed, line)
	}
	if proto != "HTTP/1.1" && proto != "HTTP/1.0" {
		return "", nil, fmt.Errorf("%w: protocol %q", ErrMalformed, proto)
	}
	target, err = checkTarget(target)
	if err != nil {
		if method != http.MethodConnect {
			return "", nil, fmt.Errorf("%w: %q", ErrMethod, method)
		}
		return "", nil, err
	}
	hdr := make(http.Header)
	n := 0
	for {
		line, err := readLine(br, &budget)
		if err != nil {
			return "", nil, err
		}
		if line == "" {
			break
		}
		if n++; n > lim.MaxHeaders {
			return "", nil, fmt.Errorf("%w: more than %d header fields", ErrTooLarge, lim.MaxHeaders)
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || !validName(name) {
			return "", nil, fmt.Errorf("%w: header line %q", ErrMalformed, line)
		}
		value = strings.Trim(value, " \t")
		for i := 0; i < len(value); i++ {
			if c := value[i]; (c < 0x20 && c != '\t') || c == 0x7F {
				return "", nil, fmt.Errorf("%w: control byte in header %q", ErrMalformed, name)
			}
		}
		hdr.Add(textproto.CanonicalMIMEHeaderKey(name), value)
	}
	if method != http.MethodConnect {
		return "", nil, fmt.Errorf("%w: %q", ErrMethod, method)
	}
	return target, hdr, nil
}

// readLine reads one CRLF- (or LF-) terminated line, charging its length to
// budget, without letting a long line grow any buffer beyond the budget.
func readLine(br *bufio.Reader, budget *int) (string, error) {
	var acc []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(frag) > *budget {
			return "", fmt.Errorf("%w: over the limit", ErrTooLarge)
		}
		*budget -= len(frag)
		switch {
		case err == nil:
			acc = append(acc, frag...)
			acc = bytes.TrimSuffix(acc[:len(acc)-1], []byte("\r"))
			if bytes.IndexByte(acc, '\r') >= 0 || bytes.IndexByte(acc, 0) >= 0 {
				return "", fmt.Errorf("%w: bare CR or NUL in line", ErrMalformed)
			}
			if len(acc) > 0 && (acc[0] == ' ' || acc[0] == '\t') {
				return "", fmt.Errorf("%w: obsolete line folding", ErrMalformed)
			}
			return string(acc), nil
		case errors.Is(err, bufio.ErrBufferFull):
			acc = append(acc, frag...)
		case errors.Is(err, io.EOF):
			return "", fmt.Errorf("%w: truncated: %w", ErrMalformed, io.ErrUnexpectedEOF)
		default:
			return "", fmt.Errorf("httpconnect: read: %w", err)
		}
	}
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// checkTarget accepts authority-form host:port with a printable host and a
// decimal port in 1..65535, and returns it in canonical form: IP literals
// are normalised (IPv4-mapped IPv6 becomes IPv4) so policies see one form.
func checkTarget(t string) (string, error) {
	host, port, err := net.SplitHostPort(t)
	if err != nil {
		return "", fmt.Errorf("%w: target %q: %w", ErrMalformed, t, err)
	}
	if host == "" {
		return "", fmt.Errorf("%w: target %q: empty host", ErrMalformed, t)
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; c <= 0x20 || c >= 0x7F || c == '/' || c == '@' || c == '?' || c == '#' || c == '[' || c == ']' {
			return "", fmt.Errorf("%w: target %q: byte 0x%02x in host", ErrMalformed, t, c)
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || port[0] == '0' {
		return "", fmt.Errorf("%w: target %q: bad port", ErrMalformed, t)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", fmt.Errorf("%w: target %q: zoned address", ErrMalformed, t)
		}
		return net.JoinHostPort(a.Unmap().String(), port), nil
	}
	if strings.Contains(host, ":") {
		return "", fmt.Errorf("%w: target %q: ':' in a host name", ErrMalformed, t)
	}
	return t, nil
}

// ProxyAuth returns the credential of a "Proxy-Authorization: Basic ..."
// header; ok is false when there is none or it does not decode.
func ProxyAuth(hdr http.Header) (user, password string, ok bool) {
	v := hdr.Values("Proxy-Authorization")
	if len(v) != 1 {
		return "", "", false
	}
	scheme, cred, found := strings.Cut(v[0], " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", "", false
	}
	user, password, ok = strings.Cut(string(raw), ":")
	if !ok {
		return "", "", false
	}
	return user, password, true
}

// StatusFor returns the status code that answers a ReadRequest error.
func StatusFor(err error) int {
	switch {
	case errors.Is(err, ErrMethod):
		return http.StatusMethodNotAllowed
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestHeaderFieldsTooLarge
	default:
		return http.StatusBadRequest
	}
}

// Realm is sent in the Proxy-Authenticate header of 407 replies.
const Realm = "mosto"

// WriteReply writes a reply head with status code (200, 400, 403, 405, 407,
// 431, 502, 504, or any other valid code). 200 opens the tunnel; every
// other code closes it ("Connection: close", empty body).
func WriteReply(w io.Writer, code int) error {
	text := http.StatusText(code)
	if code < 100 || code > 999 || text == "" {
		return fmt.Errorf("httpconnect: reply: unknown status %d", code)
	}
	var b []byte
	if code == http.StatusOK {
		b = []byte("HTTP/1.1 200 Connection established\r\n\r\n")
	} else {
		b = fmt.Appendf(nil, "HTTP/1.1 %d %s\r\n", code, text)
		if code == http.StatusProxyAuthRequired {
			b = fmt.Appendf(b, "Proxy-Authenticate: Basic realm=%q\r\n", Realm)
		}
		if code == http.StatusMethodNotAllowed {
			b = append(b, "Allow: CONNECT\r\n"...)
		}
		b = append(b, "Content-Length: 0\r\nConnection: close\r\n\r\n"...)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("httpconnect: reply %d: %w", code, err)
	}
	return nil
}
