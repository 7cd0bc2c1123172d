package routerbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// sample is one fetch as the client saw it.
type sample struct {
	Handshake time.Duration // connect() to the first address (the router, or the surrogate for direct/DNS)
	TTFB      time.Duration // from sending the GET to the first byte of the object's response (a 302 included)
	Total     time.Duration // from the start (DNS query or connect) to the last byte
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// conn is a client connection with its reader.
type conn struct {
	c  net.Conn
	br *bufio.Reader
}

func open(ctx context.Context, dial dialFunc, addr string) (*conn, time.Duration, error) {
	t := time.Now()
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	return &conn{c: c, br: bufio.NewReaderSize(c, 64<<10)}, time.Since(t), nil
}

// get sends one GET and reads the response; it returns the time to the
// response's first byte, the response and whether the body was read.
func (c *conn) get(target string, wantSize int64) (ttfb time.Duration, resp *http.Response, err error) {
	t := time.Now()
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, dnsName); err != nil {
		return 0, nil, err
	}
	if _, err := c.br.Peek(1); err != nil {
		return 0, nil, fmt.Errorf("first byte: %w", err)
	}
	ttfb = time.Since(t)
	resp, err = http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, nil, err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, nil, fmt.Errorf("body: %w", err)
	}
	if resp.StatusCode == 200 && n != wantSize {
		return 0, nil, fmt.Errorf("body of %d bytes; want %d", n, wantSize)
	}
	return ttfb, resp, nil
}

// client fetches objects, following 302s, with keep-alive connections
// (one per host) or a connection per request.
type client struct {
	dial      dialFunc
	keepAlive bool
	conns     map[string]*conn
}

func (cl *client) close() {
	for _, c := range cl.conns {
		c.c.Close()
	}
	cl.conns = nil
}

func (cl *client) conn(ctx context.Context, addr string) (*conn, time.Duration, error) {
	if c, ok := cl.conns[addr]; ok && cl.keepAlive {
		return c, 0, nil
	}
	c, hs, err := open(ctx, cl.dial, addr)
	if err != nil {
		return nil, 0, err
	}
	if cl.keepAlive {
		if cl.conns == nil {
			cl.conns = map[string]*conn{}
		}
		cl.conns[addr] = c
	}
	return c, hs, nil
}

func (cl *client) done(c *conn) {
	if !cl.keepAlive {
		c.c.Close()
	}
}

// fetch gets target of size bytes from addr, following one 302.
func (cl *client) fetch(ctx context.Context, addr, target string, size int64) (sample, error) {
	start := time.Now()
	c, hs, err := cl.conn(ctx, addr)
	if err != nil {
		return sample{}, err
	}
	t := time.Now()
	ttfb, resp, err := c.get(target, size)
	cl.done(c)
	if err != nil {
		return sample{}, err
	}
	if resp.StatusCode == http.StatusFound {
		loc, err := url.Parse(resp.Header.Get("Location"))
		if err != nil {
			return sample{}, fmt.Errorf("302 Location: %w", err)
		}
		c2, _, err := cl.conn(ctx, loc.Host)
		if err != nil {
			return sample{}, err
		}
		t2 := time.Now()
		ttfb2, resp2, err := c2.get(loc.RequestURI(), size)
		cl.done(c2)
		if err != nil {
			return sample{}, err
		}
		if resp2.StatusCode != 200 {
			return sample{}, fmt.Errorf("after the 302: %s", resp2.Status)
		}
		return sample{Handshake: hs, TTFB: t2.Sub(t) + ttfb2, Total: time.Since(start)}, nil
	}
	if resp.StatusCode != 200 {
		return sample{}, fmt.Errorf("status %s", resp.Status)
	}
	return sample{Handshake: hs, TTFB: ttfb, Total: time.Since(start)}, nil
}

// resolve asks the DNS responder for the surrogate's address.
func resolve(ctx context.Context, dialUDP dialFunc, server string) (netip.Addr, error) {
	c, err := dialUDP(ctx, "udp", server)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 1, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(dnsName + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	if _, err := c.Write(q); err != nil {
		return netip.Addr{}, err
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return netip.Addr{}, err
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		return netip.Addr{}, err
	}
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			return netip.AddrFrom4(r.A), nil
		}
	}
	return netip.Addr{}, errors.New("dns: no A record")
}
