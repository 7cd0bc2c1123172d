package tcpjoin

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// TCP header offsets and flags.
const (
	offSeq    = 4
	offAck    = 8
	offOff    = 12
	offFlags  = 13
	offWin    = 14
	offSum    = 16
	flagACK   = 0x10
	flagSYN   = 0x02
	optEnd    = 0
	optNOP    = 1
	optSACK   = 5
	optTS     = 8
	minHeader = 20
)

// ErrHeader marks a TCP header Apply cannot parse.
var ErrHeader = errors.New("tcpjoin: malformed TCP header")

// Apply rewrites the TCP header at the start of seg in place: seq, ack (when
// ACK is set), the window field, every SACK block, TSval and TSecr, and
// adjusts the checksum incrementally (RFC 1624) so a segment that was valid
// stays valid (addresses and ports are not changed here). Options may be in
// any order and alignment. A SYN is refused: a join only translates
// established connections.
func (e Entry) Apply(seg []byte) error {
	if len(seg) < minHeader {
		return fmt.Errorf("%w: %d bytes", ErrHeader, len(seg))
	}
	hlen := int(seg[offOff]>>4) * 4
	if hlen < minHeader || hlen > len(seg) {
		return fmt.Errorf("%w: data offset %d", ErrHeader, hlen)
	}
	if seg[offFlags]&flagSYN != 0 {
		return fmt.Errorf("%w: SYN", ErrHeader)
	}
	hdr := seg[:hlen]
	before := sum16(hdr)
	add32(hdr[offSeq:], e.SeqDelta)
	ack := seg[offFlags]&flagACK != 0
	if ack {
		add32(hdr[offAck:], e.AckDelta)
	}
	w := uint64(binary.BigEndian.Uint16(hdr[offWin:])) << e.WinIn >> e.WinOut
	binary.BigEndian.PutUint16(hdr[offWin:], uint16(min(w, 0xffff)))
	opts := hdr[minHeader:]
	for i := 0; i < len(opts); {
		kind := opts[i]
		if kind == optEnd {
			break
		}
		if kind == optNOP {
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			return fmt.Errorf("%w: option %d at %d overruns the header", ErrHeader, kind, i)
		}
		n := int(opts[i+1])
		body := opts[i+2 : i+n]
		switch kind {
		case optSACK:
			if len(body)%8 != 0 {
				return fmt.Errorf("%w: SACK option of %d bytes", ErrHeader, n)
			}
			if ack {
				for b := 0; b < len(body); b += 4 {
					add32(body[b:], e.AckDelta)
				}
			}
		case optTS:
			if len(body) != 8 {
				return fmt.Errorf("%w: timestamp option of %d bytes", ErrHeader, n)
			}
			if e.TS {
				add32(body[0:], e.TSvalDelta)
				add32(body[4:], e.TSecrDelta)
			}
		}
		i += n
	}
	after := sum16(hdr)
	// HC' = ~(~HC + ~m + m') over the whole header (RFC 1624, eqn. 3).
	old := binary.BigEndian.Uint16(hdr[offSum:])
	s := uint32(^old) + uint32(^before) + uint32(after)
	binary.BigEndian.PutUint16(hdr[offSum:], ^fold(s))
	return nil
}

func add32(b []byte, d uint32) {
	binary.BigEndian.PutUint32(b, binary.BigEndian.Uint32(b)+d)
}

// sum16 is the one's complement sum of hdr's 16-bit words, the checksum
// field excluded (hdr has an even length).
func sum16(hdr []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(hdr); i += 2 {
		if i == offSum {
			continue
		}
		s += uint32(binary.BigEndian.Uint16(hdr[i:]))
	}
	return fold(s)
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
