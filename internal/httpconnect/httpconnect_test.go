package httpconnect

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestReadRequest(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		lim        Limits
		wantTarget string
		wantHdr    map[string]string
		wantErr    error
	}{
		{"minimal", "CONNECT example.com:443 HTTP/1.1\r\n\r\n", Limits{}, "example.com:443", nil, nil},
		{"with headers", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nuser-agent:  curl/8 \r\n\r\n", Limits{},
			"example.com:443", map[string]string{"Host": "example.com:443", "User-Agent": "curl/8"}, nil},
		{"http/1.0, LF only", "CONNECT 192.0.2.1:8443 HTTP/1.0\n\n", Limits{}, "192.0.2.1:8443", nil, nil},
		{"ipv6", "CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n", Limits{}, "[2001:db8::1]:443", nil, nil},
		{"mapped ipv6 canonical", "CONNECT [::ffff:127.0.0.1]:80 HTTP/1.1\r\n\r\n", Limits{}, "127.0.0.1:80", nil, nil},
		{"ipv6 canonical", "CONNECT [2001:DB8:0::1]:443 HTTP/1.1\r\n\r\n", Limits{}, "[2001:db8::1]:443", nil, nil},
		{"zoned ipv6", "CONNECT [fe80::1%eth0]:443 HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"colon in host name", "CONNECT [a:b]:443 HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"GET", "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", Limits{}, "", nil, ErrMethod},
		{"lowercase connect", "connect example.com:443 HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMethod},
		{"no port", "CONNECT example.com HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"port zero", "CONNECT example.com:0 HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"port too big", "CONNECT example.com:70000 HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"path in target", "CONNECT example.com/x:443 HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"userinfo in target", "CONNECT u@example.com:443 HTTP/1.1\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"http/2", "CONNECT example.com:443 HTTP/2\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"extra space", "CONNECT example.com:443 HTTP/1.1 x\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"no protocol", "CONNECT example.com:443\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"header without colon", "CONNECT a:1 HTTP/1.1\r\nBogus\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"bad header name", "CONNECT a:1 HTTP/1.1\r\nBad Name: x\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"folded header", "CONNECT a:1 HTTP/1.1\r\nA: x\r\n  y\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"bare CR", "CONNECT a:1 HTTP/1.1\r\nA: x\ry\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"control in value", "CONNECT a:1 HTTP/1.1\r\nA: x\x01y\r\n\r\n", Limits{}, "", nil, ErrMalformed},
		{"truncated", "CONNECT a:1 HTTP/1.1\r\nHost: a", Limits{}, "", nil, ErrMalformed},
		{"empty", "", Limits{}, "", nil, ErrMalformed},
		{"too large", "CONNECT a:1 HTTP/1.1\r\nA: " + strings.Repeat("x", 200) + "\r\n\r\n", Limits{MaxHeaderBytes: 100}, "", nil, ErrTooLarge},
		{"huge line", "CONNECT a:1 HTTP/1.1\r\nA: " + strings.Repeat("x", 100000) + "\r\n\r\n", Limits{}, "", nil, ErrTooLarge},
		{"too many headers", "CONNECT a:1 HTTP/1.1\r\n" + strings.Repeat("A: b\r\n", 5) + "\r\n", Limits{MaxHeaders: 4}, "", nil, ErrTooLarge},
		{"exactly at limit", "CONNECT a:1 HTTP/1.1\r\n\r\n", Limits{MaxHeaderBytes: 24}, "a:1", nil, nil},
		{"one over limit", "CONNECT a:1 HTTP/1.1\r\n\r\n", Limits{MaxHeaderBytes: 23}, "", nil, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tt.in), 64)
			target, hdr, err := ReadRequest(br, tt.lim)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ReadRequest = %q, %v; want %v", target, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadRequest: %v", err)
			}
			if target != tt.wantTarget {
				t.Errorf("target = %q; want %q", target, tt.wantTarget)
			}
			for k, v := range tt.wantHdr {
				if got := hdr.Get(k); got != v {
					t.Errorf("header %s = %q; want %q", k, got, v)
				}
			}
		})
	}
}

func TestReadRequestLeavesPipelinedBytes(t *testing.T) {
	br := bufio.NewReader(strings.NewReader("CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n\x16\x03\x01hello"))
	if _, _, err := ReadRequest(br, Limits{}); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "\x16\x03\x01hello" {
		t.Errorf("left %q; want the pipelined bytes", rest)
	}
}

func TestProxyAuth(t *testing.T) {
	tests := []struct {
		name       string
		values     []string
		user, pass string
		ok         bool
	}{
		{"valid", []string{"Basic YWxpY2U6czNjcmV0"}, "alice", "s3cret", true},
		{"scheme case", []string{"basic YWxpY2U6czNjcmV0"}, "alice", "s3cret", true},
		{"colon in password", []string{"Basic YWxpY2U6YTpi"}, "alice", "a:b", true},
		{"none", nil, "", "", false},
		{"bearer", []string{"Bearer abc"}, "", "", false},
		{"bad base64", []string{"Basic !!!"}, "", "", false},
		{"no colon", []string{"Basic YWxpY2U="}, "", "", false},
		{"two headers", []string{"Basic YWxpY2U6czNjcmV0", "Basic YWxpY2U6czNjcmV0"}, "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Proxy-Authorization", v)
			}
			u, p, ok := ProxyAuth(h)
			if u != tt.user || p != tt.pass || ok != tt.ok {
				t.Errorf("ProxyAuth = %q, %q, %v; want %q, %q, %v", u, p, ok, tt.user, tt.pass, tt.ok)
			}
		})
	}
}

func TestWriteReply(t *testing.T) {
	tests := []struct {
		code int
		want string
	}{
		{200, "HTTP/1.1 200 Connection established\r\n\r\n"},
		{400, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
		{403, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
		{405, "HTTP/1.1 405 Method Not Allowed\r\nAllow: CONNECT\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
		{407, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"mosto\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
		{502, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
		{504, "HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		if err := WriteReply(&b, tt.code); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("WriteReply(%d) = %q; want %q", tt.code, b.String(), tt.want)
		}
		// The reply must parse as an HTTP response.
		resp, err := http.ReadResponse(bufio.NewReader(&b), &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != tt.code {
			t.Errorf("WriteReply(%d) does not parse back: %v", tt.code, err)
		}
	}
	if err := WriteReply(io.Discard, 42); err == nil {
		t.Error("WriteReply(42) succeeded")
	}
}

func TestStatusFor(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{
		{"GET / HTTP/1.1\r\n\r\n", 405},
		{"CONNECT a HTTP/1.1\r\n\r\n", 400},
		{"CONNECT a:1 HTTP/1.1\r\nA: " + strings.Repeat("x", 9000) + "\r\n\r\n", 431},
	} {
		_, _, err := ReadRequest(bufio.NewReader(strings.NewReader(tt.in)), Limits{})
		if got := StatusFor(err); got != tt.want {
			t.Errorf("StatusFor(%v) = %d; want %d", err, got, tt.want)
		}
	}
}
