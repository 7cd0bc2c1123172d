package socks5

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// rw is an in-memory client: it reads the scripted client bytes and records
// what the server writes.
type rw struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *rw) Read(b []byte) (int, error)  { return c.in.Read(b) }
func (c *rw) Write(b []byte) (int, error) { return c.out.Write(b) }

func hx(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

func TestHandshake(t *testing.T) {
	users := func(u, p string) bool { return CheckPassword(u, "alice") && CheckPassword(p, "s3cret") }
	onlyExample := func(target string) bool { return strings.HasPrefix(target, "example.com:") }
	tests := []struct {
		name       string
		cfg        Config
		in         string // hex
		wantTarget string
		wantUser   string
		wantOut    string // hex written by the server
		wantErr    error
	}{
		{"ipv4 no auth", Config{}, "050100" + "05010001 7f000001 0050", "127.0.0.1:80", "", "0500", nil},
		{"ipv6 no auth", Config{}, "050100" + "05010004 20010db8000000000000000000000001 01bb", "[2001:db8::1]:443", "", "0500", nil},
		{"domain no auth", Config{}, "05020100" + "05010003 0b6578616d706c652e636f6d 01bb", "example.com:443", "", "0500", nil},
		{"user/password", Config{Auth: users},
			"050102" + "01 05616c696365 067333637265 74" + "05010001 7f000001 0050", "127.0.0.1:80", "alice", "0502" + "0100", nil},
		{"wrong password", Config{Auth: users},
			"050102" + "01 05616c696365 0678787878787878", "", "", "0502" + "0101", ErrAuth},
		{"empty user", Config{Auth: func(string, string) bool { return true }},
			"050102" + "01 00 00", "", "", "0502" + "0101", ErrAuth},
		{"auth required, none offered", Config{Auth: users}, "050100", "", "", "05ff", ErrNoMethod},
		{"bad auth version", Config{Auth: users}, "050102" + "02 00 00", "", "", "0502" + "0101", ErrMalformed},
		{"bind refused", Config{}, "050100" + "05020001 7f000001 0050", "", "", "0500" + "05070001 00000000 0000", ErrCommand},
		{"udp associate refused", Config{}, "050100" + "05030001 7f000001 0050", "", "", "0500" + "05070001 00000000 0000", ErrCommand},
		{"unknown address type", Config{}, "050100" + "05010005", "", "", "0500" + "05080001 00000000 0000", ErrAddrType},
		{"not allowed", Config{Allow: onlyExample}, "050100" + "05010001 7f000001 0050", "", "", "0500" + "05020001 00000000 0000", ErrNotAllowed},
		{"allowed", Config{Allow: onlyExample}, "050100" + "05010003 0b6578616d706c652e636f6d 01bb", "example.com:443", "", "0500", nil},
		{"socks4", Config{}, "04010050 7f000001 00", "", "", "", ErrMalformed},
		{"no methods", Config{}, "0500", "", "", "", ErrMalformed},
		{"truncated greeting", Config{}, "0503 00", "", "", "", ErrMalformed},
		{"truncated request", Config{}, "050100 05010001 7f00", "", "", "0500", ErrMalformed},
		{"bad reserved", Config{}, "050100 05010101 7f000001 0050", "", "", "0500" + "05010001 00000000 0000", ErrMalformed},
		{"port zero", Config{}, "050100 05010001 7f000001 0000", "", "", "0500" + "05010001 00000000 0000", ErrMalformed},
		{"empty domain", Config{}, "050100 05010003 00 0050", "", "", "0500" + "05010001 00000000 0000", ErrMalformed},
		{"ipv4-mapped ipv6 is ipv4", Config{}, "050100" + "05010004 00000000000000000000ffff7f000001 0050", "127.0.0.1:80", "", "0500", nil},
		{"ip literal as domain", Config{}, "050100" + "05010003 093132372e302e302e31 0050", "127.0.0.1:80", "", "0500", nil},
		{"ipv6 literal as domain", Config{}, "050100" + "05010003 033a3a31 0050", "[::1]:80", "", "0500", nil},
		{"mapped literal as domain refused by allowlist", Config{Allow: onlyExample}, "050100" + "05010003 103a3a666666663a3132372e302e302e31 0050", "", "", "0500" + "05020001 00000000 0000", ErrNotAllowed},
		{"domain with colon", Config{}, "050100 05010003 03613a62 0050", "", "", "0500" + "05010001 00000000 0000", ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &rw{in: bytes.NewReader(hx(tt.in))}
			req, err := handshake(c, tt.cfg)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("handshake = %+v, %v; want %v", req, err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			if req.Target != tt.wantTarget || req.User != tt.wantUser {
				t.Errorf("request = %+v; want target %q user %q", req, tt.wantTarget, tt.wantUser)
			}
			if got := hex.EncodeToString(c.out.Bytes()); got != strings.ReplaceAll(tt.wantOut, " ", "") {
				t.Errorf("server wrote %s; want %s", got, strings.ReplaceAll(tt.wantOut, " ", ""))
			}
			if err == nil && c.in.Len() != 0 {
				t.Errorf("%d request bytes left unread", c.in.Len())
			}
		})
	}
}

func TestHandshakeDoesNotOverRead(t *testing.T) {
	c := &rw{in: bytes.NewReader(append(hx("050100 05010001 7f000001 0050"), "early data"...))}
	if _, err := handshake(c, Config{}); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(c.in); string(rest) != "early data" {
		t.Errorf("left %q; want the early data untouched", rest)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	srv, cli := net.Pipe()
	defer srv.Close()
	defer cli.Close()
	go cli.Write([]byte{5, 1}) // slowloris: never sends the methods
	start := time.Now()
	_, err := Handshake(context.Background(), srv, Config{Timeout: 50 * time.Millisecond})
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Handshake = %v; want a timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Handshake took %v with a 50ms timeout", d)
	}
}

func TestHandshakeContextCancel(t *testing.T) {
	srv, cli := net.Pipe()
	defer srv.Close()
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Handshake(ctx, srv, Config{Timeout: time.Hour})
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Handshake = %v; want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Handshake did not return after cancel")
	}
}

func TestHandshakeOverTCP(t *testing.T) {
	testenv.CheckLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		req Request
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		req, err := Handshake(context.Background(), c, Config{})
		if err == nil {
			err = Reply(c, Succeeded, netip.MustParseAddrPort("10.0.0.1:1234"))
		}
		done <- result{req, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(hx("050100 05010003 0b6578616d706c652e636f6d 01bb"))
	got := make([]byte, 12)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if want := "0500" + "050000010a00000104d2"; hex.EncodeToString(got) != want {
		t.Errorf("client read %x; want %s", got, want)
	}
	r := <-done
	if r.err != nil || r.req.Target != "example.com:443" || r.req.Host != "example.com" || r.req.Port != 443 {
		t.Errorf("server: %+v, %v", r.req, r.err)
	}
}

func TestReply(t *testing.T) {
	tests := []struct {
		code  byte
		bound string
		want  string
	}{
		{Succeeded, "192.0.2.1:8080", "05000001c00002011f90"},
		{Succeeded, "[2001:db8::1]:1", "0500000420010db80000000000000000000000010001"},
		{HostUnreachable, "", "05040001000000000000"},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		var bound netip.AddrPort
		if tt.bound != "" {
			bound = netip.MustParseAddrPort(tt.bound)
		}
		if err := Reply(&b, tt.code, bound); err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(b.Bytes()); got != tt.want {
			t.Errorf("Reply(%d, %s) = %s; want %s", tt.code, tt.bound, got, tt.want)
		}
	}
}

func TestReplyCode(t *testing.T) {
	testenv.CheckLeaks(t)
	tests := []struct {
		err  error
		want byte
	}{
		{nil, Succeeded},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, ConnectionRefused},
		{&net.OpError{Op: "dial", Err: syscall.ENETUNREACH}, NetworkUnreachable},
		{&net.OpError{Op: "dial", Err: syscall.EHOSTUNREACH}, HostUnreachable},
		{&net.DNSError{Err: "no such host", Name: "x"}, HostUnreachable},
		{context.DeadlineExceeded, TTLExpired},
		{errors.New("other"), GeneralFailure},
	}
	for _, tt := range tests {
		if got := ReplyCode(tt.err); got != tt.want {
			t.Errorf("ReplyCode(%v) = %d; want %d", tt.err, got, tt.want)
		}
	}
	// A real refused dial.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if _, err := net.Dial("tcp", addr); ReplyCode(err) != ConnectionRefused {
		t.Errorf("ReplyCode(dial closed port: %v) = %d; want %d", err, ReplyCode(err), ConnectionRefused)
	}
}
