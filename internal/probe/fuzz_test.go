package probe

import (
	"bytes"
	"testing"
)

func FuzzParsePacket(f *testing.F) {
	key := &Key{ID: 9, Secret: []byte("0123456789abcdef0123456789abcdef")}
	f.Add(mustAppend(f, Packet{Type: TypeRequest, ID: 1, Seq: 2, Stamp: 3}, nil))
	f.Add(mustAppend(f, Packet{Type: TypeReply, RxNano: 5, TxNano: 7}, nil))
	f.Add(mustAppend(f, Packet{Type: TypeRequest, KeyID: 9, ID: 1}, key))
	f.Add([]byte("MSTP"))
	f.Add(make([]byte, PacketSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePacket(b)
		if err != nil {
			return
		}
		var k *Key
		if p.KeyID != 0 {
			k = &Key{ID: p.KeyID, Secret: key.Secret}
		}
		out, err := p.Append(nil, k)
		if err != nil {
			t.Fatal(err)
		}
		_, valid := Verify(b, []Key{*key})
		if (p.KeyID == 0 || valid) && !bytes.Equal(out, b) {
			t.Fatalf("re-encoding %x gives %x", b, out)
		}
		// The server answers only what decodes as a request, with the
		// same size; with a key, only requests tagged under it.
		for _, keys := range [][]Key{nil, {*key}} {
			s := NewServer(ServerConfig{Keys: func() []Key { return keys }}, nil)
			in := append([]byte(nil), b...)
			r := s.handle(in, 1)
			_, ok := Verify(b, keys)
			if (r != nil) != (p.Type == TypeRequest && ok) || (r != nil && len(r) != len(b)) {
				t.Fatalf("server (%d keys) reply %x to %x", len(keys), r, b)
			}
			if r != nil {
				if _, ok := Verify(r, keys); !ok {
					t.Fatalf("server reply %x does not verify", r)
				}
			}
		}
	})
}
