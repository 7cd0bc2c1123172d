package probe

import (
	"bytes"
	"testing"
)

func FuzzParsePacket(f *testing.F) {
	f.Add(Packet{Type: TypeRequest, ID: 1, Seq: 2, Stamp: 3}.Append(nil))
	f.Add(Packet{Type: TypeReply}.Append(nil))
	f.Add([]byte("MSTP"))
	f.Add(make([]byte, PacketSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePacket(b)
		if err != nil {
			return
		}
		if out := p.Append(nil); !bytes.Equal(out, b) {
			t.Fatalf("re-encoding %x gives %x", b, out)
		}
		// The server answers only what decodes as a request, with the same size.
		s := NewServer(ServerConfig{}, nil)
		in := append([]byte(nil), b...)
		r := s.handle(in)
		if (r != nil) != (p.Type == TypeRequest) || (r != nil && len(r) != len(b)) {
			t.Fatalf("server reply %x to %x", r, b)
		}
	})
}
