package socks5

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// Reply codes (RFC 1928 section 6).
const (
	Succeeded            byte = 0x00
	GeneralFailure       byte = 0x01
	NotAllowed           byte = 0x02 // connection not allowed by ruleset
	NetworkUnreachable   byte = 0x03
	HostUnreachable      byte = 0x04
	ConnectionRefused    byte = 0x05
	TTLExpired           byte = 0x06
	CommandNotSupported  byte = 0x07
	AddrTypeNotSupported byte = 0x08
)

const (
	version       = 0x05
	authVersion   = 0x01
	methodNone    = 0x00
	methodUserPwd = 0x02
	methodNoneOK  = 0xFF // "no acceptable methods"
	cmdConnect    = 0x01
	atypIPv4      = 0x01
	atypDomain    = 0x03
	atypIPv6      = 0x04

	// DefaultTimeout bounds the whole handshake when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
)

// Errors of Handshake, wrapped with detail. Every one of them has already
// been answered on the connection where the protocol has an answer.
var (
	ErrMalformed  = errors.New("socks5: malformed handshake")
	ErrNoMethod   = errors.New("socks5: no acceptable authentication method")
	ErrAuth       = errors.New("socks5: authentication failed")
	ErrCommand    = errors.New("socks5: command not supported")
	ErrAddrType   = errors.New("socks5: address type not supported")
	ErrNotAllowed = errors.New("socks5: destination not allowed")
)

// Config is the server's policy for one handshake.
type Config struct {
	// Auth, if set, requires username/password authentication (RFC 1929)
	// and reports whether a pair is valid. Nil means no authentication.
	// Use CheckPassword for a constant-time comparison.
	Auth func(user, password string) bool
	// Allow, if set, is asked about every target ("host:port", IPv6 in
	// brackets); false answers "connection not allowed by ruleset".
	// Nil allows every target.
	Allow func(target string) bool
	// Timeout bounds the handshake (DefaultTimeout if 0). The earlier of it
	// and ctx's deadline applies; the connection's deadline is cleared on
	// return.
	Timeout time.Duration
}

// Request is a client's accepted CONNECT request.
type Request struct {
	Target string     // host:port, as net.Dial takes it
	Host   string     // domain name, or empty for an address
	Addr   netip.Addr // address, or invalid for a domain name
	Port   uint16
	User   string // authenticated user, if any
}

// CheckPassword compares a got credential with a want one in constant time
// (for equal lengths).
func CheckPassword(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// Handshake runs the server side of a SOCKS5 handshake on conn up to and
// including the CONNECT request. On success the caller dials Request.Target
// and answers with Reply (Succeeded and the bound address, or a failure
// code). On failure the client has been answered when the protocol allows.
func Handshake(ctx context.Context, conn net.Conn, cfg Config) (Request, error) {
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return Request{}, fmt.Errorf("socks5: set deadline: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		stop()
		conn.SetDeadline(time.Time{})
	}()
	req, err := handshake(conn, cfg)
	if err != nil && ctx.Err() != nil {
		return Request{}, fmt.Errorf("socks5: %w (%w)", ctx.Err(), err)
	}
	return req, err
}

func handshake(rw io.ReadWriter, cfg Config) (Request, error) {
	var buf [2 + 255]byte
	// Greeting: VER NMETHODS METHODS...
	if err := readFull(rw, buf[:2]); err != nil {
		return Request{}, err
	}
	if buf[0] != version {
		return Request{}, fmt.Errorf("%w: version 0x%02x", ErrMalformed, buf[0])
	}
	n := int(buf[1])
	if n == 0 {
		return Request{}, fmt.Errorf("%w: no methods offered", ErrMalformed)
	}
	if err := readFull(rw, buf[:n]); err != nil {
		return Request{}, err
	}
	want := byte(methodNone)
	if cfg.Auth != nil {
		want = methodUserPwd
	}
	offered := false
	for _, m := range buf[:n] {
		offered = offered || m == want
	}
	if !offered {
		write(rw, []byte{version, methodNoneOK})
		return Request{}, fmt.Errorf("%w: want method 0x%02x, offered %x", ErrNoMethod, want, buf[:n])
	}
	if err := write(rw, []byte{version, want}); err != nil {
		return Request{}, err
	}
	var req Request
	if cfg.Auth != nil {
		user, err := authenticate(rw, cfg.Auth)
		if err != nil {
			return Request{}, err
		}
		req.User = user
	}
	// Request: VER CMD RSV ATYP DST.ADDR DST.PORT
	if err := readFull(rw, buf[:4]); err != nil {
		return Request{}, err
	}
	if buf[0] != version || buf[2] != 0 {
		Reply(rw, GeneralFailure, netip.AddrPort{})
		return Request{}, fmt.Errorf("%w: request header %x", ErrMalformed, buf[:4])
	}
	cmd, atyp := buf[1], buf[3]
	switch atyp {
	case atypIPv4:
		if err := readFull(rw, buf[:4]); err != nil {
			return Request{}, err
		}
		req.Addr = netip.AddrFrom4([4]byte(buf[:4]))
	case atypIPv6:
		if err := readFull(rw, buf[:16]); err != nil {
			return Request{}, err
		}
		// An IPv4-mapped address is the IPv4 address: policies see one form.
		req.Addr = netip.AddrFrom16([16]byte(buf[:16])).Unmap()
	case atypDomain:
		if err := readFull(rw, buf[:1]); err != nil {
			return Request{}, err
		}
		l := int(buf[0])
		if err := readFull(rw, buf[:l]); err != nil {
			return Request{}, err
		}
		host := string(buf[:l])
		if err := checkHost(host); err != nil {
			Reply(rw, GeneralFailure, netip.AddrPort{})
			return Request{}, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		if a, err := netip.ParseAddr(host); err == nil {
			// An address sent as a name is an address: policies see one form.
			if a.Zone() != "" {
				Reply(rw, GeneralFailure, netip.AddrPort{})
				return Request{}, fmt.Errorf("%w: zoned address %q", ErrMalformed, host)
			}
			req.Addr = a.Unmap()
		} else {
			req.Host = host
		}
	default:
		Reply(rw, AddrTypeNotSupported, netip.AddrPort{})
		return Request{}, fmt.Errorf("%w: 0x%02x", ErrAddrType, atyp)
	}
	if err := readFull(rw, buf[:2]); err != nil {
		return Request{}, err
	}
	req.Port = binary.BigEndian.Uint16(buf[:2])
	if cmd != cmdConnect {
		Reply(rw, CommandNotSupported, netip.AddrPort{})
		return Request{}, fmt.Errorf("%w: 0x%02x", ErrCommand, cmd)
	}
	if req.Port == 0 {
		Reply(rw, GeneralFailure, netip.AddrPort{})
		return Request{}, fmt.Errorf("%w: port 0", ErrMalformed)
	}
	host := req.Host
	if req.Addr.IsValid() {
		host = req.Addr.String()
	}
	req.Target = net.JoinHostPort(host, strconv.Itoa(int(req.Port)))
	if cfg.Allow != nil && !cfg.Allow(req.Target) {
		Reply(rw, NotAllowed, netip.AddrPort{})
		return Request{}, fmt.Errorf("%w: %s", ErrNotAllowed, req.Target)
	}
	return req, nil
}

// authenticate runs the RFC 1929 subnegotiation.
func authenticate(rw io.ReadWriter, check func(user, password string) bool) (string, error) {
	var buf [255]byte
	if err := readFull(rw, buf[:2]); err != nil {
		return "", err
	}
	if buf[0] != authVersion {
		write(rw, []byte{authVersion, 0x01})
		return "", fmt.Errorf("%w: auth version 0x%02x", ErrMalformed, buf[0])
	}
	ul := int(buf[1])
	if err := readFull(rw, buf[:ul]); err != nil {
		return "", err
	}
	user := string(buf[:ul])
	if err := readFull(rw, buf[:1]); err != nil {
		return "", err
	}
	pl := int(buf[0])
	if err := readFull(rw, buf[:pl]); err != nil {
		return "", err
	}
	if ul == 0 || !check(user, string(buf[:pl])) {
		write(rw, []byte{authVersion, 0x01})
		return "", fmt.Errorf("%w: user %q", ErrAuth, user)
	}
	if err := write(rw, []byte{authVersion, 0x00}); err != nil {
		return "", err
	}
	return user, nil
}

// checkHost accepts a non-empty domain name of printable ASCII without
// spaces, brackets, '/' or '@' (colons only in IPv6 literals).
func checkHost(h string) error {
	if h == "" {
		return errors.New("empty domain name")
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c <= 0x20 || c >= 0x7F || c == '[' || c == ']' || c == '/' || c == '@' {
			return fmt.Errorf("domain name %q: byte 0x%02x not allowed", h, c)
		}
		if c == ':' {
			if _, err := netip.ParseAddr(h); err != nil {
				return fmt.Errorf("domain name %q: ':' outside an IPv6 address", h)
			}
		}
	}
	return nil
}

func readFull(r io.Reader, b []byte) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: truncated: %w", ErrMalformed, err)
		}
		return fmt.Errorf("socks5: read: %w", err)
	}
	return nil
}

func write(w io.Writer, b []byte) error {
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("socks5: write: %w", err)
	}
	return nil
}

// Reply writes a SOCKS5 reply with code and the bound address (an invalid
// bound sends 0.0.0.0:0).
func Reply(w io.Writer, code byte, bound netip.AddrPort) error {
	b := make([]byte, 0, 22)
	b = append(b, version, code, 0)
	a := bound.Addr().Unmap()
	switch {
	case !bound.IsValid():
		b = append(b, atypIPv4, 0, 0, 0, 0, 0, 0)
		return write(w, b)
	case a.Is4():
		a4 := a.As4()
		b = append(b, atypIPv4)
		b = append(b, a4[:]...)
	default:
		a16 := a.As16()
		b = append(b, atypIPv6)
		b = append(b, a16[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, bound.Port())
	return write(w, b)
}

// ReplyCode maps a dial error to the reply code a client should see.
func ReplyCode(err error) byte {
	var dns *net.DNSError
	switch {
	case err == nil:
		return Succeeded
	case errors.As(err, &dns):
		return HostUnreachable
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return TTLExpired
	case errors.Is(err, syscall.ECONNREFUSED):
		return ConnectionRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return NetworkUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH):
		return HostUnreachable
	}
	return GeneralFailure
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
