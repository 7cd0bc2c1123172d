package router

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// pool keeps up to size pre-established TCP connections to one surrogate,
// refilled by run (one goroutine owned by Router.Serve). A connection is
// handed out once and then belongs to the session, which closes it. A
// connection idle for maxIdle is closed (before the surrogate's own idle
// timeout), and one the surrogate closed is found stale on get.
type pool struct {
	addr    string
	size    int
	maxIdle time.Duration
	dial    func(ctx context.Context, addr string) (*net.TCPConn, error)
	log     *slog.Logger
	// prepare, if set, runs on every connection the refill adds (Preparer).
	prepare func(*net.TCPConn) (any, error)

	mu   sync.Mutex
	idle []pooledConn
	wake chan struct{} // a get took a connection: refill

	hits, misses, stale counter
}

type pooledConn struct {
	c     *net.TCPConn
	since time.Time
	prep  any // prepare's result (nil: none)
}

func newPool(addr string, size int, maxIdle time.Duration, dial func(context.Context, string) (*net.TCPConn, error), log *slog.Logger) *pool {
	return &pool{addr: addr, size: size, maxIdle: maxIdle, dial: dial, log: log, wake: make(chan struct{}, 1)}
}

// get returns a pooled connection and what prepare made of it, or dials one
// (unprepared) when none is ready.
func (p *pool) get(ctx context.Context) (*net.TCPConn, any, error) {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		pc := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		p.kick()
		if time.Since(pc.since) > p.maxIdle || !alive(pc.c) {
			p.stale.add(1)
			pc.c.Close()
			continue
		}
		p.hits.add(1)
		return pc.c, pc.prep, nil
	}
	p.misses.add(1)
	p.kick()
	c, err := p.dial(ctx, p.addr)
	return c, nil, err
}

func (p *pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run keeps the pool full until ctx ends, then closes the idle connections.
func (p *pool) run(ctx context.Context) {
	defer func() {
		p.mu.Lock()
		for _, pc := range p.idle {
			pc.c.Close()
		}
		p.idle = nil
		p.mu.Unlock()
	}()
	backoff := 10 * time.Millisecond
	tick := time.NewTicker(p.maxIdle / 4)
	defer tick.Stop()
	for {
		p.retire()
		for p.len() < p.size && ctx.Err() == nil {
			c, err := p.dial(ctx, p.addr)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Debug("pool dial", "surrogate", p.addr, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 2*time.Second)
				continue
			}
			backoff = 10 * time.Millisecond
			var prep any
			if p.prepare != nil {
				if v, err := p.prepare(c); err == nil {
					prep = v
				} else {
					p.log.Debug("pool prepare", "surrogate", p.addr, "err", err)
				}
			}
			p.mu.Lock()
			p.idle = append(p.idle, pooledConn{c, time.Now(), prep})
			p.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
		}
	}
}

// retire closes connections that have been idle for too long.
func (p *pool) retire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := p.idle[:0]
	for _, pc := range p.idle {
		if time.Since(pc.since) > p.maxIdle*3/4 {
			pc.c.Close()
			continue
		}
		keep = append(keep, pc)
	}
	p.idle = keep
}

func (p *pool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// alive reports whether an idle connection is still open: a peek that
// finds neither data nor EOF nor an error.
func alive(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		_ = n
		ok = errors.Is(err, unix.EAGAIN)
		return true
	})
	return err == nil && ok
}
