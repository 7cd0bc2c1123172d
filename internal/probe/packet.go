package probe

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// PacketSize is the size of every probe datagram. Requests and replies have
// the same size, so the echo server never amplifies.
const PacketSize = 32

// Packet types.
const (
	TypeRequest = 1
	TypeReply   = 2
)

const (
	magic   = "MSTP"
	version = 1
)

// ErrPacket is wrapped by every decoding error.
var ErrPacket = errors.New("probe: bad packet")

// Packet is a probe datagram:
//
//	offset size
//	0      4    magic "MSTP"
//	4      1    version (1)
//	5      1    type (1 request, 2 reply)
//	6      2    reserved, zero
//	8      8    sender id (random per prober socket)
//	16     8    sequence number
//	24     8    sender's opaque timestamp (echoed, never interpreted)
type Packet struct {
	Type  uint8
	ID    uint64
	Seq   uint64
	Stamp uint64
}

// Append appends the encoding of p to b.
func (p Packet) Append(b []byte) []byte {
	b = append(b, magic...)
	b = append(b, version, p.Type, 0, 0)
	b = binary.BigEndian.AppendUint64(b, p.ID)
	b = binary.BigEndian.AppendUint64(b, p.Seq)
	return binary.BigEndian.AppendUint64(b, p.Stamp)
}

// ParsePacket decodes a probe datagram. Anything but exactly PacketSize
// bytes with the right magic, version, type and zero reserved bytes is an
// error wrapping ErrPacket.
func ParsePacket(b []byte) (Packet, error) {
	if len(b) != PacketSize {
		return Packet{}, fmt.Errorf("%w: %d bytes, want %d", ErrPacket, len(b), PacketSize)
	}
	if string(b[:4]) != magic {
		return Packet{}, fmt.Errorf("%w: bad magic", ErrPacket)
	}
	if b[4] != version {
		return Packet{}, fmt.Errorf("%w: version %d, want %d", ErrPacket, b[4], version)
	}
	if b[5] != TypeRequest && b[5] != TypeReply {
		return Packet{}, fmt.Errorf("%w: type %d", ErrPacket, b[5])
	}
	if b[6] != 0 || b[7] != 0 {
		return Packet{}, fmt.Errorf("%w: reserved bytes set", ErrPacket)
	}
	return Packet{
		Type:  b[5],
		ID:    binary.BigEndian.Uint64(b[8:]),
		Seq:   binary.BigEndian.Uint64(b[16:]),
		Stamp: binary.BigEndian.Uint64(b[24:]),
	}, nil
}
