package probe

import (
	"testing"
	"time"
)

func BenchmarkServerHandle(b *testing.B) {
	s := NewServer(ServerConfig{Rate: 1e12, Burst: 1 << 30}, nil)
	req := Packet{Type: TypeRequest, ID: 1}.Append(nil)
	buf := make([]byte, len(req))
	for b.Loop() {
		copy(buf, req)
		if s.handle(buf) == nil {
			b.Fatal("no reply")
		}
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
