package router

import (
	"errors"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name, in string
		want     *Request // nil: an error
		err      error    // ErrIncomplete, ErrTooLarge, or nil for a *BadRequestError
	}{
		{"get", "GET /obj?size=10 HTTP/1.1\r\nHost: a\r\n\r\n",
			&Request{Method: "GET", Target: "/obj?size=10", Minor: 1, Host: "a", HeadLen: 38}, nil},
		{"fields", "GET / HTTP/1.1\r\nhOsT:  a:80 \r\nX-A:\r\nContent-Length: 5\r\nConnection: keep-alive, Close\r\n\r\nhello",
			&Request{Method: "GET", Target: "/", Minor: 1, Host: "a:80", HeadLen: 88, BodyLen: 5, Close: true}, nil},
		{"http10", "GET / HTTP/1.0\r\n\r\n", &Request{Method: "GET", Target: "/", HeadLen: 18, Close: true}, nil},
		{"http10 keepalive", "HEAD / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &Request{Method: "HEAD", Target: "/", HeadLen: 43}, nil},
		{"pipelined", "GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\n", &Request{Method: "GET", Target: "/a", Minor: 1, Host: "h", HeadLen: 28}, nil},
		{"incomplete line", "GET /obj", nil, ErrIncomplete},
		{"incomplete head", "GET / HTTP/1.1\r\nHost: a\r\n", nil, ErrIncomplete},
		{"incomplete crlf", "GET / HTTP/1.1\r\nHost: a\r\n\r", nil, ErrIncomplete},
		{"no host", "GET / HTTP/1.1\r\n\r\n", nil, nil},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", nil, nil},
		{"absolute form", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", nil, nil},
		{"http2", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", nil, nil},
		{"lowercase proto", "GET / http/1.1\r\nHost: a\r\n\r\n", nil, nil},
		{"bad method", "G(T / HTTP/1.1\r\nHost: a\r\n\r\n", nil, nil},
		{"bad method early", "G(T", nil, nil},
		{"tls hello early", "\x16\x03\x01\x02\x00\x01", nil, nil},
		{"bare lf early", "GET / HTTP/1.1\n", nil, nil},
		{"double space", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", nil, nil},
		{"space in target", "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", nil, nil},
		{"folding", "GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n", nil, nil},
		{"space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", nil, nil},
		{"chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", nil, nil},
		{"two lengths", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", nil, nil},
		{"bad length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n", nil, nil},
		{"ctl in value", "GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n", nil, nil},
		{"nul", "GET / HTTP/1.1\r\nHo\x00", nil, nil},
		{"too large", "GET /" + strings.Repeat("a", 9000) + " HTTP/1.1\r\nHost: a\r\n\r\n", nil, ErrTooLarge},
		{"too large incomplete", "GET /" + strings.Repeat("a", 9000), nil, ErrTooLarge},
		{"too many headers", "GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X: y\r\n", 64) + "\r\n", nil, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tt.in), Limits{})
			if tt.want != nil {
				if err != nil {
					t.Fatalf("ParseRequest(%q) error %v; want %+v", tt.in, err, tt.want)
				}
				if *got != *tt.want {
					t.Fatalf("ParseRequest(%q) = %+v; want %+v", tt.in, got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseRequest(%q) = %+v; want an error", tt.in, got)
			}
			var bre *BadRequestError
			switch {
			case tt.err != nil && !errors.Is(err, tt.err):
				t.Fatalf("ParseRequest(%q) error %v; want %v", tt.in, err, tt.err)
			case tt.err == nil && !errors.As(err, &bre):
				t.Fatalf("ParseRequest(%q) error %v; want a bad request", tt.in, err)
			}
		})
	}
}

// A valid head parses the same whatever comes after it, and every proper
// prefix of it is incomplete (never rejected), so a request split over
// packets anywhere is accepted.
func checkPrefixes(t *testing.T, in []byte) {
	t.Helper()
	req, err := ParseRequest(in, Limits{})
	if err != nil {
		return
	}
	if req.HeadLen > len(in) || req.HeadLen < 16 {
		t.Fatalf("ParseRequest(%q).HeadLen = %d", in, req.HeadLen)
	}
	for n := 1; n < req.HeadLen; n++ {
		if _, err := ParseRequest(in[:n], Limits{}); !errors.Is(err, ErrIncomplete) {
			t.Fatalf("ParseRequest(%q) = %v; want ErrIncomplete for a prefix of the valid %q", in[:n], err, in)
		}
	}
	again, err := ParseRequest(append(in[:req.HeadLen:req.HeadLen], "GARBAGE\x00"...), Limits{})
	if err != nil || *again != *req {
		t.Fatalf("head %q parsed as %+v, %v with other bytes after it; alone %+v", in[:req.HeadLen], again, err, req)
	}
}

func TestParseRequestPrefixes(t *testing.T) {
	for _, in := range []string{
		"GET /obj?size=10 HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nhOsT:  a:80 \r\nX-A:\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
		"DELETE /x HTTP/1.0\r\n\r\n",
	} {
		checkPrefixes(t, []byte(in))
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte("GET /obj?size=10 HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"))
	f.Add([]byte("GET / HTTP/1.0\r\n\r\nGET / HTTP/1.1\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		req, err := ParseRequest(in, Limits{MaxHead: 512, MaxHeaders: 8})
		if err != nil {
			var bre *BadRequestError
			if !errors.Is(err, ErrIncomplete) && !errors.Is(err, ErrTooLarge) && !errors.As(err, &bre) {
				t.Fatalf("unexpected error type %T %v", err, err)
			}
			return
		}
		if req.HeadLen > 512 || req.Target == "" || req.Target[0] != '/' || req.BodyLen < 0 {
			t.Fatalf("accepted %+v", req)
		}
		if req.Minor == 1 && req.Host == "" && !strings.Contains(strings.ToLower(string(in[:req.HeadLen])), "host:") {
			t.Fatalf("HTTP/1.1 without Host accepted: %q", in)
		}
		checkPrefixes(t, in)
	})
}
