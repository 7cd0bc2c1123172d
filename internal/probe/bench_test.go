package probe

import (
	"testing"
	"time"
)

func BenchmarkServerHandle(b *testing.B) {
	key := NewKey(1, []byte("0123456789abcdef0123456789abcdef"))
	for _, tt := range []struct {
		name string
		keys []Key
	}{{"untagged", nil}, {"hmac", []Key{key}}} {
		b.Run(tt.name, func(b *testing.B) {
			s := NewServer(ServerConfig{Rate: 1e12, Burst: 1 << 30, Keys: func() []Key { return tt.keys }}, nil)
			var k *Key
			p := Packet{Type: TypeRequest, ID: 1}
			if len(tt.keys) > 0 {
				k, p.KeyID = &tt.keys[0], tt.keys[0].ID
			}
			req := mustAppend(b, p, k)
			buf := make([]byte, len(req))
			for b.Loop() {
				copy(buf, req)
				if s.handle(buf, 1) == nil {
					b.Fatal("no reply")
				}
			}
		})
	}
}

func BenchmarkWindowEstimate(b *testing.B) {
	w := NewWindow(3)
	for i := range 3 {
		w.Add(time.Duration(10+i) * time.Millisecond)
	}
	for b.Loop() {
		w.Add(11 * time.Millisecond)
		w.Estimate()
	}
}
