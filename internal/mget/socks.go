package mget

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// DialFunc opens a connection.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ViaSOCKS5 returns a Dial that reaches addr through the SOCKS5 entry at
// entry (no authentication): the local mosto proxy, which carries the flow
// over the overlay's chain to the source. dial reaches the entry; nil
// dials directly.
func ViaSOCKS5(entry string, dial DialFunc) DialFunc {
	return viaEntry("socks5 entry", entry, dial, socksConnect)
}

// viaEntry returns a Dial that connects to a local proxy entry with dial
// (nil: directly) and runs handshake for addr on that connection, within
// the context's deadline (10 s without one); kind names the entry in errors.
func viaEntry(kind, entry string, dial DialFunc, handshake func(rw io.ReadWriter, addr string) error) DialFunc {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, "tcp", entry)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", kind, entry, err)
		}
		if dl, ok := ctx.Deadline(); ok {
			conn.SetDeadline(dl)
		} else {
			conn.SetDeadline(time.Now().Add(10 * time.Second))
		}
		if err := handshake(conn, addr); err != nil {
			conn.Close()
			return nil, fmt.Errorf("%s %s to %s: %w", kind, entry, addr, err)
		}
		conn.SetDeadline(time.Time{})
		return conn, nil
	}
}

// socksConnect runs the client side of an RFC 1928 CONNECT to host:port
// with no authentication.
func socksConnect(rw io.ReadWriter, addr string) error {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return fmt.Errorf("port %q: %w", ps, err)
	}
	if _, err := rw.Write([]byte{5, 1, 0}); err != nil {
		return err
	}
	var b [262]byte
	if _, err := io.ReadFull(rw, b[:2]); err != nil {
		return err
	}
	if b[0] != 5 || b[1] != 0 {
		return fmt.Errorf("entry refused the no-authentication method (%d %d)", b[0], b[1])
	}
	req := []byte{5, 1, 0}
	if ip := net.ParseIP(host); ip != nil && ip.To4() != nil {
		req = append(append(req, 1), ip.To4()...)
	} else if ip != nil {
		req = append(append(req, 4), ip.To16()...)
	} else {
		if len(host) > 255 {
			return fmt.Errorf("host name too long")
		}
		req = append(append(req, 3, byte(len(host))), host...)
	}
	req = binary.BigEndian.AppendUint16(req, uint16(port))
	if _, err := rw.Write(req); err != nil {
		return err
	}
	if _, err := io.ReadFull(rw, b[:4]); err != nil {
		return err
	}
	if b[0] != 5 || b[1] != 0 {
		return fmt.Errorf("entry replied %d", b[1])
	}
	var n int
	switch b[3] {
	case 1:
		n = 4 + 2
	case 4:
		n = 16 + 2
	case 3:
		if _, err := io.ReadFull(rw, b[:1]); err != nil {
			return err
		}
		n = int(b[0]) + 2
	default:
		return fmt.Errorf("reply address type %d", b[3])
	}
	_, err = io.ReadFull(rw, b[:n])
	return err
}

// ViaConnect returns a Dial that reaches addr through the HTTP CONNECT
// entry at entry (a local mosto proxy), pinned to route when it is not
// empty (the chain's FEP ids, the entry's FEP first: the proxy's
// Mosto-Route header), with Basic proxy authentication when user is set.
// dial reaches the entry; nil dials directly.
func ViaConnect(entry string, route []string, user, password string, dial DialFunc) DialFunc {
	return viaEntry("connect entry", entry, dial, func(rw io.ReadWriter, addr string) error {
		return httpConnect(rw, addr, route, user, password)
	})
}

// httpConnect sends a CONNECT for addr and reads the reply head byte by
// byte (nothing after it may be consumed: the tunnel starts there).
func httpConnect(rw io.ReadWriter, addr string, route []string, user, password string) error {
	req := "CONNECT " + addr + " HTTP/1.1\r\nHost: " + addr + "\r\n"
	if user != "" {
		req += "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)) + "\r\n"
	}
	if len(route) > 0 {
		req += "Mosto-Route: " + strings.Join(route, ",") + "\r\n"
	}
	if _, err := io.WriteString(rw, req+"\r\n"); err != nil {
		return err
	}
	var head []byte
	var b [1]byte
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		if len(head) > 8<<10 {
			return fmt.Errorf("reply head longer than 8 KiB")
		}
		if _, err := io.ReadFull(rw, b[:]); err != nil {
			return fmt.Errorf("reply: %w", err)
		}
		head = append(head, b[0])
	}
	line, _, _ := strings.Cut(string(head), "\r\n")
	proto, rest, _ := strings.Cut(line, " ")
	code, _, _ := strings.Cut(rest, " ")
	if !strings.HasPrefix(proto, "HTTP/1.") || len(code) != 3 {
		return fmt.Errorf("malformed reply %q", line)
	}
	if code[0] != '2' {
		return fmt.Errorf("entry replied %q", line)
	}
	return nil
}
