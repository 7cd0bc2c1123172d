package probe

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"sync"
)

// PacketSize is the size of every probe datagram. Requests and replies have
// the same size, so the echo server never amplifies.
const PacketSize = 64

// Packet types.
const (
	TypeRequest = 1
	TypeReply   = 2
)

const (
	magic   = "MSTP"
	version = 2
	tagOff  = 48 // the tag covers bytes [0, tagOff)
	tagLen  = PacketSize - tagOff
	// tagLabel separates probe tags from every other use of the overlay
	// key (hop headers are HMACs of PROXY v2 bytes, never of this label).
	tagLabel = "mosto probe v2\x00"
)

// ErrPacket is wrapped by every decoding error.
var ErrPacket = errors.New("probe: bad packet")

// Key is one overlay key a probe is authenticated with (the hop-header
// HMAC key the controller distributes; see pki.OverlayKeys). Make it with
// NewKey to reuse the HMAC state across packets; a literal Key works too,
// at the cost of a new HMAC per packet.
type Key struct {
	ID     uint8 // never 0: key id 0 means "not authenticated"
	Secret []byte
	macs   *sync.Pool // of hash.Hash: HMAC-SHA256 under Secret; nil: none
}

// NewKey returns the key id with secret (copied), with reusable HMAC state.
func NewKey(id uint8, secret []byte) Key {
	secret = bytes.Clone(secret)
	return Key{ID: id, Secret: secret, macs: &sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}}
}

// tag returns the truncated HMAC of the first tagOff bytes of a packet.
func (k *Key) tag(head []byte) []byte {
	var h hash.Hash
	if k.macs != nil {
		h = k.macs.Get().(hash.Hash)
		defer k.macs.Put(h)
		h.Reset()
	} else {
		h = hmac.New(sha256.New, k.Secret)
	}
	h.Write([]byte(tagLabel))
	h.Write(head[:tagOff])
	var sum [sha256.Size]byte
	return h.Sum(sum[:0])[:tagLen]
}

// Packet is a probe datagram (version 2, TWAMP-like):
//
//	offset size
//	0      4    magic "MSTP"
//	4      1    version (2)
//	5      1    type (1 request, 2 reply)
//	6      1    key id (0: no tag)
//	7      1    reserved, zero
//	8      8    sender id (random per measurement)
//	16     8    sequence number
//	24     8    sender's opaque timestamp (echoed, never interpreted)
//	32     8    responder's receive time, ns (zero in a request)
//	40     8    responder's send time, ns (zero in a request)
//	48     16   tag: HMAC-SHA256(key, "mosto probe v2\0" || bytes 0..47),
//	            first 16 bytes; zero when the key id is 0
//
// The two responder times are read on the responder's clock (the receive
// time from the kernel when it can): only their difference, the
// responder's turnaround, is used, so the clocks need not agree.
type Packet struct {
	Type   uint8
	KeyID  uint8
	ID     uint64
	Seq    uint64
	Stamp  uint64
	RxNano int64
	TxNano int64
}

// Turnaround returns the responder's time between receiving the request
// and sending the reply, or 0 when it did not say (or said nonsense).
func (p Packet) Turnaround() int64 {
	if p.RxNano == 0 || p.TxNano < p.RxNano {
		return 0
	}
	return p.TxNano - p.RxNano
}

// Append appends the encoding of p to b, tagged under key when p.KeyID is
// not 0 (key.ID must then be p.KeyID).
func (p Packet) Append(b []byte, key *Key) ([]byte, error) {
	if p.KeyID != 0 && (key == nil || key.ID != p.KeyID) {
		return b, fmt.Errorf("probe: no key %d to sign with", p.KeyID)
	}
	start := len(b)
	b = append(b, magic...)
	b = append(b, version, p.Type, p.KeyID, 0)
	b = binary.BigEndian.AppendUint64(b, p.ID)
	b = binary.BigEndian.AppendUint64(b, p.Seq)
	b = binary.BigEndian.AppendUint64(b, p.Stamp)
	b = binary.BigEndian.AppendUint64(b, uint64(p.RxNano))
	b = binary.BigEndian.AppendUint64(b, uint64(p.TxNano))
	if p.KeyID == 0 {
		return append(b, make([]byte, tagLen)...), nil
	}
	return append(b, key.tag(b[start:])...), nil
}

// ParsePacket decodes a probe datagram without checking its tag (Verify
// does). Anything but exactly PacketSize bytes with the right magic,
// version, type and zero reserved byte, and a zero tag when the key id is
// 0, is an error wrapping ErrPacket.
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
	if b[7] != 0 {
		return Packet{}, fmt.Errorf("%w: reserved byte set", ErrPacket)
	}
	if b[6] == 0 {
		for _, c := range b[tagOff:] {
			if c != 0 {
				return Packet{}, fmt.Errorf("%w: tag without a key id", ErrPacket)
			}
		}
	}
	return Packet{
		Type:   b[5],
		KeyID:  b[6],
		ID:     binary.BigEndian.Uint64(b[8:]),
		Seq:    binary.BigEndian.Uint64(b[16:]),
		Stamp:  binary.BigEndian.Uint64(b[24:]),
		RxNano: int64(binary.BigEndian.Uint64(b[32:])),
		TxNano: int64(binary.BigEndian.Uint64(b[40:])),
	}, nil
}

// Verify checks the tag of the packet b (PacketSize bytes that
// ParsePacket accepted) under the key of its key id among keys, and
// returns that key. With no keys, only untagged packets pass (and the key
// is nil); with keys, only packets tagged under one of them pass.
func Verify(b []byte, keys []Key) (*Key, bool) {
	if len(b) != PacketSize {
		return nil, false
	}
	id := b[6]
	if len(keys) == 0 {
		return nil, id == 0
	}
	if id == 0 {
		return nil, false
	}
	for i := range keys {
		if keys[i].ID == id {
			return &keys[i], hmac.Equal(keys[i].tag(b), b[tagOff:])
		}
	}
	return nil, false
}
