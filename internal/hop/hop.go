package hop

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// Errors returned by Read, wrapped with detail. Use errors.Is to count
// refusals by reason.
var (
	// ErrMalformed: not a PROXY v2 header, bad lengths, truncated input,
	// unknown critical or duplicate TLVs, missing TLVs, invalid values.
	ErrMalformed = errors.New("hop: malformed header")
	// ErrTooLarge: the header announces more than MaxHeaderLen bytes.
	ErrTooLarge = errors.New("hop: header too large")
	// ErrAuth: unknown key id or HMAC mismatch.
	ErrAuth = errors.New("hop: authentication failed")
	// ErrExpired: the issue time is further than the allowed skew from now.
	ErrExpired = errors.New("hop: header expired")
	// ErrReplay: the (flow id, hop) pair was already seen (ReplayCache.Check).
	ErrReplay = errors.New("hop: header replayed")
)

// Wire constants; see docs/hop.md.
const (
	// MaxHeaderLen bounds the whole header (16-byte fixed part included).
	MaxHeaderLen = 4096
	// MaxRoute bounds the number of FEP ids in a route.
	MaxRoute = 16
	// MaxIDLen bounds one FEP id, in bytes.
	MaxIDLen = 64
	// MaxTargetLen bounds the target host:port, in bytes.
	MaxTargetLen = 261
	// DefaultMaxSkew is used by Read when maxSkew <= 0.
	DefaultMaxSkew = 30 * time.Second
	// MinSecretLen is the shortest accepted HMAC secret.
	MinSecretLen = 16

	// Version is the value of the version TLV this package writes and accepts.
	Version = 1

	fixedLen = 16
	macLen   = sha256.Size
)

// TLV types of the mosto header, in PROXY v2's custom range 0xE0-0xEF.
// Unknown types inside this range are critical: a header carrying one is
// refused. Types outside the range are ignored (but authenticated).
const (
	TLVVersion = 0xE0 // 1 byte: Version
	TLVRoute   = 0xE1 // repeated (len u8, id bytes)
	TLVHop     = 0xE2 // 1 byte: index in Route of the receiver
	TLVTarget  = 0xE3 // host:port, printable ASCII
	TLVSize    = 0xE4 // 8 bytes big endian: transfer-size hint
	TLVFlowID  = 0xE5 // 16 bytes
	TLVTime    = 0xE6 // 8 bytes big endian: Unix nanoseconds
	TLVLookup  = 0xE7 // optional: EgP id; asks the receiver (a LoP) to complete the route
	TLVVerdict = 0xE8 // optional, empty: the InP waits for the EgP's verdict (VerdictLen bytes back)
	TLVMAC     = 0xEF // 1 byte key id + 32 bytes HMAC-SHA256; always last
)

// signature is the 12-byte PROXY v2 signature.
var signature = [12]byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}

const (
	verCmdLocal = 0x20
	verCmdProxy = 0x21
	famUnspec   = 0x00
	famTCP4     = 0x11
	famTCP6     = 0x21
)

// Header is what an InP/TrP sends first on a fresh hop connection.
type Header struct {
	Source, Dest netip.AddrPort // client's original addresses (PROXY v2 address block)
	Route        []string       // the whole chain of FEP ids, InP .. EgP
	Hop          int            // index in Route of the receiver of this header
	Target       string         // final destination host:port (the origin)
	Size         int64          // transfer-size hint in bytes (the size class key)
	FlowID       [16]byte
	Time         time.Time // issue time, for replay protection
	// Lookup, when set, is the EgP id of a route completion request: the
	// receiver, the route's last id (a lookup proxy), completes the route to
	// this EgP from its chain table. Empty in every other header.
	Lookup string
	// Verdict asks the EgP to answer VerdictLen bytes (AppendVerdict)
	// before the origin's bytes: whether it reached the origin, so an
	// entry replies to its client only after the destination was accepted.
	Verdict bool
}

// VerdictLen is the length of an EgP's verdict: VerdictMagic, then a
// SOCKS5 reply code (RFC 1928: 0 succeeded, 2 not allowed by ruleset, 4 host
// unreachable, 5 connection refused, 6 TTL expired, 1 general failure...).
const (
	VerdictLen   = 2
	VerdictMagic = 0x56 // 'V'
)

// AppendVerdict appends the verdict carrying code to b.
func AppendVerdict(b []byte, code byte) []byte { return append(b, VerdictMagic, code) }

// ParseVerdict returns the code of a verdict read from an EgP.
func ParseVerdict(v [VerdictLen]byte) (byte, error) {
	if v[0] != VerdictMagic {
		return 0, fmt.Errorf("%w: verdict starts with 0x%02x, want 0x%02x", ErrMalformed, v[0], VerdictMagic)
	}
	return v[1], nil
}

// Marshal encodes h and signs it with the keyring's current key.
func (h *Header) Marshal(kr *Keyring) ([]byte, error) {
	if kr == nil {
		return nil, errors.New("hop: marshal: nil keyring")
	}
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("hop: marshal: %w", err)
	}
	if h.Hop == 0 {
		return nil, errors.New("hop: marshal: hop index 0: a header is sent by route[hop-1]")
	}
	pk, err := kr.signer(h.Route[h.Hop-1], h.Route[h.Hop])
	if err != nil {
		return nil, fmt.Errorf("hop: marshal: %w", err)
	}
	if h.Time.Before(time.Unix(0, 0)) || h.Time.After(time.Unix(0, math.MaxInt64)) {
		return nil, fmt.Errorf("hop: marshal: issue time %v outside 1970..2262 (zero?)", h.Time)
	}
	b := make([]byte, 0, 128+len(h.Target)+routeLen(h.Route)+3+len(h.Lookup))
	b = appendFixed(b, verCmdProxy, h.Source, h.Dest)
	b = appendTLV(b, TLVVersion, []byte{Version})
	b = append(b, TLVRoute, 0, 0)
	off := len(b)
	for _, id := range h.Route {
		b = append(b, byte(len(id)))
		b = append(b, id...)
	}
	binary.BigEndian.PutUint16(b[off-2:], uint16(len(b)-off))
	b = appendTLV(b, TLVHop, []byte{byte(h.Hop)})
	b = append(b, TLVTarget)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Target)))
	b = append(b, h.Target...)
	b = append(b, TLVSize, 0, 8)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Size))
	b = appendTLV(b, TLVFlowID, h.FlowID[:])
	b = append(b, TLVTime, 0, 8)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Time.UnixNano()))
	if h.Lookup != "" {
		b = appendTLV(b, TLVLookup, []byte(h.Lookup))
	}
	if h.Verdict {
		b = append(b, TLVVerdict, 0, 0)
	}
	b = append(b, TLVMAC, 0, 1+macLen, kr.cur.id)
	if len(b)+macLen > MaxHeaderLen {
		return nil, fmt.Errorf("hop: marshal: %w: %d bytes", ErrTooLarge, len(b)+macLen)
	}
	binary.BigEndian.PutUint16(b[14:16], uint16(len(b)+macLen-fixedLen))
	return pk.sum(b, b), nil
}

func routeLen(route []string) int {
	n := 0
	for _, id := range route {
		n += 1 + len(id)
	}
	return n
}

func appendTLV(b []byte, typ byte, v []byte) []byte {
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
	return append(b, v...)
}

// appendFixed appends the 16-byte fixed part (with a zero length, patched
// by the caller) and the address block.
func appendFixed(b []byte, verCmd byte, src, dst netip.AddrPort) []byte {
	b = append(b, signature[:]...)
	s, d := src.Addr().WithZone(""), dst.Addr().WithZone("")
	switch {
	case !src.IsValid() || !dst.IsValid():
		return append(b, verCmd, famUnspec, 0, 0)
	case s.Unmap().Is4() && d.Unmap().Is4():
		b = append(b, verCmd, famTCP4, 0, 12)
		s4, d4 := s.Unmap().As4(), d.Unmap().As4()
		b = append(b, s4[:]...)
		b = append(b, d4[:]...)
	default:
		b = append(b, verCmd, famTCP6, 0, 36)
		s16, d16 := s.As16(), d.As16()
		b = append(b, s16[:]...)
		b = append(b, d16[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, src.Port())
	return binary.BigEndian.AppendUint16(b, dst.Port())
}

// AppendPlainV2 appends a standard PROXY protocol v2 header (command PROXY,
// TCP over IPv4 or IPv6, no TLVs) for origins that want the client's
// addresses. Invalid addresses give the UNSPEC family with no address block.
// An IPv4 and an IPv6 address together are sent as TCP6 (IPv4-mapped).
func AppendPlainV2(b []byte, src, dst netip.AddrPort) []byte {
	return appendFixed(b, verCmdProxy, src, dst)
}

// validate checks the fields shared by Marshal and Read.
func (h *Header) validate() error {
	if len(h.Route) == 0 {
		return errors.New("empty route")
	}
	if len(h.Route) > MaxRoute {
		return fmt.Errorf("route of %d ids, at most %d", len(h.Route), MaxRoute)
	}
	for i, id := range h.Route {
		if err := checkID(id); err != nil {
			return fmt.Errorf("route[%d]: %w", i, err)
		}
	}
	if h.Hop < 0 || h.Hop >= len(h.Route) {
		return fmt.Errorf("hop index %d outside route of %d", h.Hop, len(h.Route))
	}
	if err := CheckTarget(h.Target); err != nil {
		return err
	}
	if h.Size < 0 {
		return fmt.Errorf("negative size %d", h.Size)
	}
	if h.Lookup != "" {
		if err := checkID(h.Lookup); err != nil {
			return fmt.Errorf("lookup: %w", err)
		}
		if h.Hop != len(h.Route)-1 {
			return fmt.Errorf("lookup in a header for hop %d of %d: only the route's last id completes it", h.Hop, len(h.Route))
		}
	}
	return nil
}

// checkID accepts 1..MaxIDLen printable ASCII bytes without spaces.
func checkID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("id of %d bytes, want 1..%d", len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= 0x20 || c >= 0x7F {
			return fmt.Errorf("id %q: non-printable byte 0x%02x", id, c)
		}
	}
	return nil
}

// CheckTarget reports whether t is a valid host:port target: printable
// ASCII without spaces, at most MaxTargetLen bytes, a non-empty host and a
// decimal port in 1..65535.
func CheckTarget(t string) error {
	if t == "" || len(t) > MaxTargetLen {
		return fmt.Errorf("target of %d bytes, want 1..%d", len(t), MaxTargetLen)
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c <= 0x20 || c >= 0x7F {
			return fmt.Errorf("target %q: non-printable byte 0x%02x", t, c)
		}
	}
	host, port, err := net.SplitHostPort(t)
	if err != nil {
		return fmt.Errorf("target %q: %w", t, err)
	}
	if host == "" {
		return fmt.Errorf("target %q: empty host", t)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || port[0] == '0' {
		return fmt.Errorf("target %q: bad port", t)
	}
	return nil
}

// Read reads exactly one signed header from r (never a byte more), checks
// its structure, its MAC under kr and that its issue time is within maxSkew
// of now (DefaultMaxSkew if maxSkew <= 0). Errors wrap ErrMalformed,
// ErrTooLarge, ErrAuth or ErrExpired; I/O errors other than end of input
// (for instance a deadline) are wrapped as they are.
func Read(r io.Reader, kr *Keyring, now time.Time, maxSkew time.Duration) (*Header, error) {
	if kr == nil {
		return nil, errors.New("hop: read: nil keyring")
	}
	var fixed [fixedLen]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return nil, readErr(err)
	}
	if [12]byte(fixed[:12]) != signature {
		return nil, fmt.Errorf("%w: no PROXY v2 signature", ErrMalformed)
	}
	if fixed[12] != verCmdProxy {
		return nil, fmt.Errorf("%w: version/command 0x%02x, want 0x21", ErrMalformed, fixed[12])
	}
	n := int(binary.BigEndian.Uint16(fixed[14:16]))
	if fixedLen+n > MaxHeaderLen {
		return nil, fmt.Errorf("%w: %d bytes announced, at most %d", ErrTooLarge, fixedLen+n, MaxHeaderLen)
	}
	buf := make([]byte, fixedLen+n)
	copy(buf, fixed[:])
	if _, err := io.ReadFull(r, buf[fixedLen:]); err != nil {
		return nil, readErr(err)
	}
	return parse(buf, kr, now, maxSkew)
}

func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated: %w", ErrMalformed, err)
	}
	return fmt.Errorf("hop: read header: %w", err)
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// parse decodes a complete header buffer.
func parse(buf []byte, kr *Keyring, now time.Time, maxSkew time.Duration) (*Header, error) {
	h := &Header{}
	p := buf[fixedLen:]
	switch buf[13] {
	case famUnspec:
	case famTCP4:
		if len(p) < 12 {
			return nil, malformed("TCP4 address block in %d bytes", len(p))
		}
		h.Source = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[0:4])), binary.BigEndian.Uint16(p[8:10]))
		h.Dest = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[4:8])), binary.BigEndian.Uint16(p[10:12]))
		p = p[12:]
	case famTCP6:
		if len(p) < 36 {
			return nil, malformed("TCP6 address block in %d bytes", len(p))
		}
		h.Source = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[0:16])).Unmap(), binary.BigEndian.Uint16(p[32:34]))
		h.Dest = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[16:32])).Unmap(), binary.BigEndian.Uint16(p[34:36]))
		p = p[36:]
	default:
		return nil, malformed("address family/protocol 0x%02x", buf[13])
	}
	var seen [256]bool
	var macID uint8
	var mac []byte
	for len(p) > 0 {
		if len(p) < 3 {
			return nil, malformed("TLV header in %d bytes", len(p))
		}
		typ, l := p[0], int(binary.BigEndian.Uint16(p[1:3]))
		if len(p) < 3+l {
			return nil, malformed("TLV 0x%02x of %d bytes overruns the header", typ, l)
		}
		v := p[3 : 3+l]
		p = p[3+l:]
		if seen[typ] {
			return nil, malformed("duplicate TLV 0x%02x", typ)
		}
		seen[typ] = true
		if err := h.decodeTLV(typ, v); err != nil {
			return nil, err
		}
		if typ == TLVMAC {
			if len(p) != 0 {
				return nil, malformed("%d bytes after the MAC TLV", len(p))
			}
			if l != 1+macLen {
				return nil, malformed("MAC TLV of %d bytes, want %d", l, 1+macLen)
			}
			macID, mac = v[0], v[1:]
		}
	}
	for _, t := range []byte{TLVVersion, TLVRoute, TLVHop, TLVTarget, TLVSize, TLVFlowID, TLVTime, TLVMAC} {
		if !seen[t] {
			return nil, malformed("missing TLV 0x%02x", t)
		}
	}
	if h.Hop < 1 || h.Hop >= len(h.Route) {
		return nil, malformed("hop index %d in a route of %d (a header is sent by route[hop-1] to route[hop])", h.Hop, len(h.Route))
	}
	pk, err := kr.verifier(macID, h.Route[h.Hop-1], h.Route[h.Hop])
	if err != nil {
		return nil, err
	}
	var sum [macLen]byte
	if !hmac.Equal(pk.sum(sum[:0], buf[:len(buf)-macLen]), mac) {
		return nil, fmt.Errorf("%w: MAC mismatch", ErrAuth)
	}
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if maxSkew <= 0 {
		maxSkew = DefaultMaxSkew
	}
	if d := now.Sub(h.Time); d > maxSkew || d < -maxSkew {
		return nil, fmt.Errorf("%w: issued %v from now, allowed skew %v", ErrExpired, -d, maxSkew)
	}
	return h, nil
}

func (h *Header) decodeTLV(typ byte, v []byte) error {
	want := -1
	switch typ {
	case TLVVersion, TLVHop:
		want = 1
	case TLVSize, TLVTime:
		want = 8
	case TLVFlowID:
		want = 16
	}
	if want >= 0 && len(v) != want {
		return malformed("TLV 0x%02x of %d bytes, want %d", typ, len(v), want)
	}
	switch typ {
	case TLVVersion:
		if v[0] != Version {
			return malformed("version %d, want %d", v[0], Version)
		}
	case TLVRoute:
		// Check the framing first, then cut every id out of one string.
		n := 0
		for p := v; len(p) > 0; n++ {
			l := int(p[0])
			if l == 0 || len(p) < 1+l {
				return malformed("route entry of %d bytes in %d", l, len(p)-1)
			}
			if n == MaxRoute {
				return malformed("more than %d route entries", MaxRoute)
			}
			p = p[1+l:]
		}
		all := string(v)
		h.Route = make([]string, 0, n)
		for off := 0; off < len(all); {
			l := int(all[off])
			h.Route = append(h.Route, all[off+1:off+1+l])
			off += 1 + l
		}
	case TLVHop:
		h.Hop = int(v[0])
	case TLVTarget:
		h.Target = string(v)
	case TLVSize:
		s := binary.BigEndian.Uint64(v)
		if s > math.MaxInt64 {
			return malformed("size %d out of range", s)
		}
		h.Size = int64(s)
	case TLVFlowID:
		h.FlowID = [16]byte(v)
	case TLVTime:
		h.Time = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
	case TLVLookup:
		if len(v) == 0 {
			return malformed("empty lookup TLV")
		}
		h.Lookup = string(v) // checked by validate
	case TLVVerdict:
		if len(v) != 0 {
			return malformed("verdict TLV of %d bytes, want 0", len(v))
		}
		h.Verdict = true
	case TLVMAC:
		// Checked by the caller.
	default:
		if typ >= 0xE0 && typ <= 0xEF {
			return malformed("unknown critical TLV 0x%02x", typ)
		}
	}
	return nil
}
