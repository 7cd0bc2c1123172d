package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Mode is how the router redirects a client.
type Mode string

// The redirection modes of Router (the DNS baseline is DNSServer).
const (
	ModeRedirect Mode = "302"
	ModeProxy    Mode = "proxy"
	ModeHandoff  Mode = "handoff"
)

// ParseMode parses a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeRedirect, ModeProxy, ModeHandoff:
		return m, nil
	}
	return "", fmt.Errorf("router: unknown mode %q (want 302, proxy or handoff)", s)
}

// Joiner hands a client's TCP session over to a surrogate: it joins the
// client's connection to the router and a pre-established connection from
// the router to the surrogate (translation of addresses, ports, seq/ack and
// options, internal/xlate), sends the client's bytes read so far (pending)
// to the surrogate (headLen: the first request head's length), and silences the router's two sockets. On success the
// Joiner owns both connections. On an error it returns how many bytes of
// pending it sent to the surrogate, with both connections still working
// (the router then proxies the session), or -1 when they are unusable.
// prepared is what the Joiner's Prepare returned for the surrogate
// connection when it entered the pool (nil: not prepared).
type Joiner interface {
	Join(ctx context.Context, client, surrogate *net.TCPConn, prepared any, pending []byte, headLen int) (sent int, err error)
}

// Preparer is a Joiner that reads what it needs of a pooled connection
// when the pool makes it, off the path of the request (the handoff then
// does not freeze the surrogate leg). An error leaves the connection
// unprepared (Join then reads it itself).
type Preparer interface {
	Prepare(surrogate *net.TCPConn) (any, error)
}

// Config configures a Router.
type Config struct {
	Mode   Mode
	Picker *Picker
	Limits Limits
	// HeaderTimeout bounds the time from a request's first byte (the
	// connection's start for the first request) to its complete head;
	// 0 means 10 s.
	HeaderTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a keep-alive
	// connection in 302 mode; 0 means 60 s.
	IdleTimeout time.Duration
	// PoolSize is the number of pre-established connections kept to each
	// surrogate (proxy and handoff modes); 0 means 8, negative means none.
	PoolSize int
	// PoolMaxIdle retires a pooled connection; 0 means 20 s (under nginx's
	// 60 s client_header_timeout and origin.DefaultHeaderTimeout). Keep it
	// well under the surrogates' wait for a first request: a leg the
	// surrogate closes as a handoff takes it resets that session.
	PoolMaxIdle time.Duration
	// DialTimeout bounds a connection to a surrogate; 0 means 5 s.
	DialTimeout time.Duration
	// Joiner hands sessions off (ModeHandoff only; required there).
	Joiner Joiner
	// Dial opens connections to surrogates; nil means a net.Dialer (a
	// caller outside the router's network namespace passes its own), with
	// DelayHandshakeAck in handoff mode.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Router is a running request router.
type Router struct {
	cfg   Config
	log   *slog.Logger
	pools []*pool

	accepted, requests, badRequest, timeouts counter
	redirects, proxied, handedOff, failed    counter
	fallbacks                                counter
	forwarded, forwardNs, poolNs             counter
}

// New validates cfg and returns a Router. A nil log discards.
func New(cfg Config, log *slog.Logger) (*Router, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if cfg.Picker == nil {
		return nil, errors.New("router: no picker")
	}
	if cfg.Mode == ModeHandoff && cfg.Joiner == nil {
		return nil, errors.New("router: handoff mode needs a joiner (internal/xlate)")
	}
	if cfg.HeaderTimeout == 0 {
		cfg.HeaderTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 60 * time.Second
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 8
	}
	if cfg.PoolMaxIdle == 0 {
		cfg.PoolMaxIdle = 20 * time.Second
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.HeaderTimeout < 0 || cfg.IdleTimeout < 0 || cfg.PoolMaxIdle < 0 || cfg.DialTimeout < 0 {
		return nil, errors.New("router: negative timeout")
	}
	r := &Router{cfg: cfg, log: log}
	for _, s := range cfg.Picker.Surrogates() {
		p := newPool(s.Addr, max(cfg.PoolSize, 0), cfg.PoolMaxIdle, r.dial, log)
		if pr, ok := cfg.Joiner.(Preparer); ok && cfg.Mode == ModeHandoff {
			p.prepare = pr.Prepare
		}
		r.pools = append(r.pools, p)
	}
	return r, nil
}

func (r *Router) dial(ctx context.Context, addr string) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DialTimeout)
	defer cancel()
	var c net.Conn
	var err error
	if r.cfg.Dial != nil {
		c, err = r.cfg.Dial(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		if r.cfg.Mode == ModeHandoff {
			d.Control = DelayHandshakeAck
		}
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial surrogate %s: %w", addr, err)
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("dial surrogate %s: not a TCP connection", addr)
	}
	return tc, nil
}

// Stats returns the router's counters.
func (r *Router) Stats() Stats {
	s := Stats{
		Accepted: r.accepted.get(), Requests: r.requests.get(), BadRequest: r.badRequest.get(),
		Timeouts: r.timeouts.get(), Redirects: r.redirects.get(), Proxied: r.proxied.get(),
		HandedOff: r.handedOff.get(), Failed: r.failed.get(), HandoffFallbacks: r.fallbacks.get(),
	}
	s.Forwarded, s.ForwardTime, s.PoolTime = r.forwarded.get(), time.Duration(r.forwardNs.get()), time.Duration(r.poolNs.get())
	for _, p := range r.pools {
		s.PoolHits += p.hits.get()
		s.PoolMisses += p.misses.get()
		s.PoolStale += p.stale.get()
	}
	return s
}

// Serve accepts clients on ln until ctx ends, then closes ln and every
// connection and returns once all its goroutines are done. It returns ctx's
// error, or the listener's error if accepting failed.
func (r *Router) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.cfg.Mode != ModeRedirect && r.cfg.PoolSize > 0 {
		for _, p := range r.pools {
			wg.Go(func() { p.run(ctx) })
		}
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			cancel()
			return fmt.Errorf("router: accept: %w", err)
		}
		r.accepted.add(1)
		wg.Go(func() { r.serveConn(ctx, c) })
	}
}

// serveConn reads the client's requests and redirects it.
func (r *Router) serveConn(ctx context.Context, c net.Conn) {
	owned := true // serveConn closes c unless a joiner took it
	defer func() {
		if owned {
			c.Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	client := addrOf(c.RemoteAddr())
	log := r.log.With("client", c.RemoteAddr().String())
	buf := make([]byte, 0, r.cfg.Limits.withDefaults().MaxHead)
	for first := true; ; first = false {
		req, err := r.readRequest(c, &buf, first)
		if err != nil {
			r.refuse(c, log, err, len(buf) > 0)
			return
		}
		r.requests.add(1)
		i := r.cfg.Picker.Pick(client, req.Target)
		s := r.cfg.Picker.Surrogates()[i]
		log.Debug("request", "target", req.Target, "surrogate", s.Name)
		switch r.cfg.Mode {
		case ModeRedirect:
			r.cfg.Picker.Done(i)
			r.redirects.add(1)
			closeAfter := req.Close || req.BodyLen > 0
			if err := writeRedirect(c, s, req, closeAfter); err != nil || closeAfter {
				return
			}
			buf = buf[:copy(buf, buf[req.HeadLen:])]
			continue
		case ModeProxy:
			r.proxy(ctx, c, i, buf, time.Now(), log)
			r.cfg.Picker.Done(i)
			return
		case ModeHandoff:
			owned = !r.handoff(ctx, c, i, buf, req.HeadLen, time.Now(), log)
			r.cfg.Picker.Done(i)
			return
		}
	}
}

// readRequest reads from c into *buf until it holds a complete head.
func (r *Router) readRequest(c net.Conn, buf *[]byte, first bool) (*Request, error) {
	started := first || len(*buf) > 0
	if started {
		c.SetReadDeadline(time.Now().Add(r.cfg.HeaderTimeout))
	} else {
		c.SetReadDeadline(time.Now().Add(r.cfg.IdleTimeout))
	}
	for {
		if len(*buf) > 0 {
			req, err := ParseRequest(*buf, r.cfg.Limits)
			if !errors.Is(err, ErrIncomplete) {
				if err == nil {
					c.SetReadDeadline(time.Time{})
				}
				return req, err
			}
		}
		b := *buf
		n, err := c.Read(b[len(b):cap(b)])
		*buf = b[:len(b)+n]
		if n > 0 && !started {
			started = true
			c.SetReadDeadline(time.Now().Add(r.cfg.HeaderTimeout))
		}
		if err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				continue // parse what arrived, then see EOF again
			}
			return nil, err
		}
	}
}

// refuse answers a request that cannot be served (or just closes).
func (r *Router) refuse(c net.Conn, log *slog.Logger, err error, partial bool) {
	var status string
	var bre *BadRequestError
	var ne net.Error
	switch {
	case errors.As(err, &bre):
		r.badRequest.add(1)
		status = "400 Bad Request"
	case errors.Is(err, ErrTooLarge):
		r.badRequest.add(1)
		status = "431 Request Header Fields Too Large"
	case errors.As(err, &ne) && ne.Timeout() && partial:
		r.timeouts.add(1)
		status = "408 Request Timeout"
	default:
		return // EOF, idle timeout, reset: nothing to answer
	}
	log.Debug("refused", "status", status, "err", err)
	writeStatus(c, status, err.Error())
	lingerClose(c)
}

func writeStatus(c net.Conn, status, body string) {
	body += "\n"
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, len(body), body)
}

// lingerClose half-closes c and drains it briefly, so the answer is not
// lost to a reset caused by unread request bytes.
func lingerClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

func writeRedirect(c net.Conn, s Surrogate, req *Request, closeAfter bool) error {
	conn := "keep-alive"
	if closeAfter {
		conn = "close"
	}
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := fmt.Fprintf(c, "HTTP/1.1 302 Found\r\nLocation: http://%s%s\r\nContent-Length: 0\r\nConnection: %s\r\n\r\n", s.Addr, req.Target, conn)
	c.SetWriteDeadline(time.Time{})
	return err
}

// proxy relays the session to surrogate i over a pooled connection.
func (r *Router) proxy(ctx context.Context, c net.Conn, i int, pending []byte, t0 time.Time, log *slog.Logger) {
	sc, _, err := r.pools[i].get(ctx)
	r.poolNs.add(int64(time.Since(t0)))
	if err != nil {
		r.failed.add(1)
		log.Warn("surrogate unreachable", "err", err)
		writeStatus(c, "502 Bad Gateway", "surrogate unreachable")
		lingerClose(c)
		return
	}
	defer sc.Close()
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	if _, err := sc.Write(pending); err != nil {
		r.failed.add(1)
		abort(c)
		return
	}
	r.forwarded.add(1)
	r.forwardNs.add(int64(time.Since(t0)))
	r.proxied.add(1)
	relay(c, sc)
}

// handoff joins the session to surrogate i; it reports whether the joiner
// took the client's connection.
func (r *Router) handoff(ctx context.Context, c net.Conn, i int, pending []byte, headLen int, t0 time.Time, log *slog.Logger) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		r.failed.add(1)
		return false
	}
	sc, prep, err := r.pools[i].get(ctx)
	r.poolNs.add(int64(time.Since(t0)))
	if err != nil {
		r.failed.add(1)
		log.Warn("surrogate unreachable", "err", err)
		writeStatus(c, "502 Bad Gateway", "surrogate unreachable")
		lingerClose(c)
		return false
	}
	sent, err := r.cfg.Joiner.Join(ctx, tc, sc, prep, pending, headLen)
	if err == nil {
		r.forwarded.add(1)
		r.forwardNs.add(int64(time.Since(t0)))
		r.handedOff.add(1)
		return true
	}
	if sent < 0 || sent > len(pending) {
		sc.Close()
		r.failed.add(1)
		log.Warn("handoff", "err", err)
		abort(c)
		return false
	}
	// Refused with both connections working: proxy the session.
	log.Debug("handoff refused, proxying", "err", err)
	r.fallbacks.add(1)
	defer sc.Close()
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	if _, err := sc.Write(pending[sent:]); err != nil {
		r.failed.add(1)
		abort(c)
		return false
	}
	r.forwarded.add(1)
	r.forwardNs.add(int64(time.Since(t0)))
	relay(c, sc)
	return false
}

// relay copies both directions until both are done. A surrogate that fails
// (reset, not a clean end) resets the client too, so the client sees the
// failure instead of a truncated response that looks complete.
func relay(c net.Conn, sc *net.TCPConn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := copyHalf(sc, c); err != nil {
			sc.Close() // the client is gone: stop the response too
		}
	})
	if err := copyHalf(c, sc); err != nil {
		abort(c)
		sc.Close()
	}
	wg.Wait()
}

// copyHalf copies src to dst (splice between TCP sockets) and half-closes
// dst when src ends cleanly.
func copyHalf(dst, src net.Conn) error {
	_, err := io.Copy(dst, src)
	if err != nil {
		return err
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	return nil
}

// abort closes c with a reset.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}
