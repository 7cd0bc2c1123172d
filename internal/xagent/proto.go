package xagent

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame types.
const (
	msgInstall byte = 1 // router -> agent: an entry (JSON installMsg)
	msgRemove  byte = 2 // router -> agent: a tuple (JSON xlate.Tuple)
	msgResult  byte = 3 // agent -> router: an install's outcome (JSON resultMsg)
)

const (
	nonceLen = 16
	tagLen   = 16
	// maxBody bounds a frame's body (an entry is ~300 bytes of JSON).
	maxBody = 4096
	version = "mosto-xagent-1"
)

// ErrAuth is a failed authentication or a frame whose tag does not match.
var ErrAuth = errors.New("xagent: authentication failed")

func mac(key []byte, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// dirs of a frame, bound into its tag.
var (
	dirToAgent  = []byte("r>a")
	dirToRouter = []byte("a>r")
)

// framer writes and reads the tagged frames of one direction each.
type framer struct {
	key          []byte // session key
	wdir, rdir   []byte
	wseq, rseq   uint64
	rbuf, header []byte
}

func newFramer(session []byte, wdir, rdir []byte) *framer {
	return &framer{key: session, wdir: wdir, rdir: rdir, header: make([]byte, 13)}
}

func (f *framer) tag(dir []byte, seq uint64, typ byte, body []byte) []byte {
	var s [9]byte
	binary.BigEndian.PutUint64(s[:8], seq)
	s[8] = typ
	return mac(f.key, dir, s[:], body)[:tagLen]
}

// appendFrame appends one frame: length (4), type (1), seq (8), body, tag.
// The caller serializes writes.
func (f *framer) appendFrame(b []byte, typ byte, body []byte) []byte {
	f.wseq++
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	b = append(b, typ)
	b = binary.BigEndian.AppendUint64(b, f.wseq)
	b = append(b, body...)
	return append(b, f.tag(f.wdir, f.wseq, typ, body)...)
}

// read reads one frame; the body is valid until the next read.
func (f *framer) read(r io.Reader) (byte, []byte, error) {
	if _, err := io.ReadFull(r, f.header); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(f.header[:4])
	if n > maxBody {
		return 0, nil, fmt.Errorf("xagent: frame of %d bytes (max %d)", n, maxBody)
	}
	typ := f.header[4]
	seq := binary.BigEndian.Uint64(f.header[5:13])
	if cap(f.rbuf) < int(n)+tagLen {
		f.rbuf = make([]byte, maxBody+tagLen)
	}
	buf := f.rbuf[:int(n)+tagLen]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, err
	}
	body, tag := buf[:n], buf[n:]
	if seq != f.rseq+1 || !hmac.Equal(tag, f.tag(f.rdir, seq, typ, body)) {
		return 0, nil, ErrAuth
	}
	f.rseq = seq
	return typ, body, nil
}

// hello is the agent's first message: its nonce, boot id and
// CLOCK_MONOTONIC (ns) when sent.
type hello struct {
	Nonce  [nonceLen]byte
	BootID [16]byte
	Mono   int64
}

const helloLen = len(version) + nonceLen + 16 + 8

func (h hello) marshal() []byte {
	b := append([]byte(version), h.Nonce[:]...)
	b = append(b, h.BootID[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(h.Mono))
}

func parseHello(b []byte) (hello, error) {
	var h hello
	if len(b) != helloLen || string(b[:len(version)]) != version {
		return h, fmt.Errorf("xagent: not an agent's hello (want %s)", version)
	}
	b = b[len(version):]
	copy(h.Nonce[:], b[:nonceLen])
	copy(h.BootID[:], b[nonceLen:nonceLen+16])
	h.Mono = int64(binary.BigEndian.Uint64(b[nonceLen+16:]))
	return h, nil
}

// The handshake's proofs and the session key.
func clientProof(key []byte, na, nc []byte) []byte {
	return mac(key, []byte(version+" router"), na, nc)
}

func agentProof(key []byte, na, nc []byte) []byte {
	return mac(key, []byte(version+" agent"), na, nc)
}

func sessionKey(key []byte, na, nc []byte) []byte {
	return mac(key, []byte(version+" session"), na, nc)
}
