package origin

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
)

// Body returns a reader of the first size bytes of the deterministic stream
// of seed. Byte k of the stream depends only on seed and k, so a prefix of a
// larger object equals the smaller object.
func Body(seed uint64, size int64) io.Reader {
	return BodyAt(seed, 0, size)
}

// BodyAt returns a reader of the n bytes of the seed's stream that start at
// offset off: bytes [off, off+n) of Body(seed, off+n).
func BodyAt(seed uint64, off, n int64) io.Reader {
	if n < 0 {
		n = 0
	}
	if off < 0 {
		off = 0
	}
	return &stream{seed: seed, left: n, start: off}
}

// Sum returns the SHA-256 of Body(seed, size).
func Sum(seed uint64, size int64) [32]byte {
	h := sha256.New()
	if _, err := io.Copy(h, Body(seed, size)); err != nil {
		panic("origin: hashing an in-memory stream cannot fail: " + err.Error())
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// stream generates 8-byte blocks: block i is splitmix64(seed + i·γ).
type stream struct {
	seed  uint64
	block uint64 // index of the next block to generate
	buf   [8]byte
	off   int // bytes of buf already consumed; 8 means empty
	left  int64
	start int64 // stream offset of the first byte
	init  bool
}

const gamma = 0x9e3779b97f4a7c15

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (s *stream) Read(p []byte) (int, error) {
	if s.left <= 0 {
		return 0, io.EOF
	}
	if !s.init {
		s.init = true
		s.block = uint64(s.start / 8)
		s.off = 8
		if r := int(s.start % 8); r != 0 {
			binary.LittleEndian.PutUint64(s.buf[:], mix(s.seed+s.block*gamma))
			s.block++
			s.off = r
		}
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n := 0
	// Drain a partly used block first.
	for s.off < 8 && n < len(p) {
		p[n] = s.buf[s.off]
		s.off++
		n++
	}
	// Whole blocks straight into p.
	for ; n+8 <= len(p); n += 8 {
		binary.LittleEndian.PutUint64(p[n:], mix(s.seed+s.block*gamma))
		s.block++
	}
	if n < len(p) {
		binary.LittleEndian.PutUint64(s.buf[:], mix(s.seed+s.block*gamma))
		s.block++
		s.off = 0
		for n < len(p) {
			p[n] = s.buf[s.off]
			s.off++
			n++
		}
	}
	s.left -= int64(n)
	return n, nil
}
