package httpconnect

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"testing"
)

// FuzzReadConnect: no panic, typed errors, bounded consumption, and an
// accepted target is a valid host:port.
func FuzzReadConnect(f *testing.F) {
	f.Add([]byte("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: Basic YWxpY2U6czNjcmV0\r\n\r\n"))
	f.Add([]byte("CONNECT [::1]:80 HTTP/1.0\n\n"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte("CONNECT a:1 HTTP/1.1\r\nA: x\r\n y\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lim := Limits{MaxHeaderBytes: 512, MaxHeaders: 8}
		r := bytes.NewReader(data)
		br := bufio.NewReaderSize(r, 16)
		target, hdr, err := ReadRequest(br, lim)
		consumed := len(data) - r.Len() - br.Buffered()
		if consumed > lim.MaxHeaderBytes+16 {
			t.Fatalf("consumed %d bytes with a %d-byte limit", consumed, lim.MaxHeaderBytes)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrMethod) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if _, _, err := net.SplitHostPort(target); err != nil {
			t.Fatalf("accepted target %q: %v", target, err)
		}
		if again, err := checkTarget(target); err != nil || again != target {
			t.Fatalf("accepted target %q is not canonical: %q, %v", target, again, err)
		}
		if len(hdr) > lim.MaxHeaders {
			t.Fatalf("%d headers accepted, limit %d", len(hdr), lim.MaxHeaders)
		}
		ProxyAuth(hdr)
	})
}
