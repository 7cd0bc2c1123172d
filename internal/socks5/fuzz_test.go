package socks5

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// FuzzSocks5Handshake feeds arbitrary client bytes to the server side: no
// panic, every error typed, accepted targets well-formed and allowed, and
// never more than the handshake read.
func FuzzSocks5Handshake(f *testing.F) {
	f.Add(hx("050100 05010001 7f000001 0050"), false)
	f.Add(hx("050102 01 05616c696365 067333637265 74 05010003 0b6578616d706c652e636f6d 01bb"), true)
	f.Add(hx("050100 05010004 20010db8000000000000000000000001 01bb"), false)
	f.Add(hx("050100 05020001 7f000001 0050"), false)
	f.Add([]byte{5, 255}, true)
	f.Fuzz(func(t *testing.T, data []byte, auth bool) {
		cfg := Config{Allow: func(target string) bool { return target != "127.0.0.2:80" }}
		if auth {
			cfg.Auth = func(u, p string) bool { return CheckPassword(u, "alice") && CheckPassword(p, "s3cret") }
		}
		c := &rw{in: bytes.NewReader(data)}
		req, err := handshake(c, cfg)
		if err != nil {
			for _, e := range []error{ErrMalformed, ErrNoMethod, ErrAuth, ErrCommand, ErrAddrType, ErrNotAllowed} {
				if errors.Is(err, e) {
					return
				}
			}
			t.Fatalf("untyped error %v", err)
		}
		if _, _, err := net.SplitHostPort(req.Target); err != nil || req.Port == 0 || req.Target == "127.0.0.2:80" {
			t.Fatalf("accepted bad request %+v", req)
		}
		if auth && req.User != "alice" {
			t.Fatalf("accepted user %q", req.User)
		}
	})
}
