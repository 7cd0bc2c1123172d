package relay

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Pool results counted in mosto_relay_pool_total.
const (
	poolHit   = "hit"   // a pooled connection was used
	poolMiss  = "miss"  // none was ready: the flow dialed
	poolStale = "stale" // a pooled connection was found closed or too old and discarded
)

// connPool keeps up to size pre-established connections to each target
// address, refilled in the background by one owned goroutine (run), each
// discarded after maxIdle. A connection is handed out once (get) and then
// belongs to the flow, which closes it. Targets are either static (the
// targets function, asked at every refill: the members) or learned on use
// (learn: origins), a learned target being dropped after forget without use.
type connPool struct {
	name    string
	log     *slog.Logger
	size    int
	maxIdle time.Duration
	forget  time.Duration
	dial    func(ctx context.Context, addr string) (*net.TCPConn, error)
	targets func() []string // static targets; nil: none
	results *prometheus.CounterVec

	kick chan struct{}

	mu      sync.Mutex
	idle    map[string][]pooledConn
	pending map[string]int       // dials in progress per target
	learned map[string]time.Time // learned target -> last use
	closed  bool
	dials   sync.WaitGroup // refill dials in progress
}

type pooledConn struct {
	c     *net.TCPConn
	since time.Time
}

func newConnPool(name string, size int, maxIdle time.Duration, dial func(context.Context, string) (*net.TCPConn, error), targets func() []string, results *prometheus.CounterVec, log *slog.Logger) *connPool {
	return &connPool{
		name: name, log: log.With("pool", name), size: size, maxIdle: maxIdle, forget: 10 * time.Minute,
		dial: dial, targets: targets, results: results,
		kick:    make(chan struct{}, 1),
		idle:    make(map[string][]pooledConn),
		pending: make(map[string]int),
		learned: make(map[string]time.Time),
	}
}

// get returns a live pooled connection to addr, or nil (a miss). It marks
// addr as used, so a learned target stays pooled, and asks for a refill.
func (p *connPool) get(addr string) *net.TCPConn {
	now := time.Now()
	p.mu.Lock()
	if _, ok := p.learned[addr]; ok {
		p.learned[addr] = now
	}
	var got *net.TCPConn
	for got == nil && len(p.idle[addr]) > 0 {
		q := p.idle[addr]
		pc := q[0]
		p.idle[addr] = q[1:]
		if now.Sub(pc.since) < p.maxIdle && alive(pc.c) {
			got = pc.c
			break
		}
		p.results.WithLabelValues(p.name, poolStale).Inc()
		pc.c.Close()
	}
	p.mu.Unlock()
	p.refill()
	if got == nil {
		p.results.WithLabelValues(p.name, poolMiss).Inc()
		return nil
	}
	p.results.WithLabelValues(p.name, poolHit).Inc()
	return got
}

// learn makes addr a pooled target until it goes unused for p.forget.
func (p *connPool) learn(addr string) {
	p.mu.Lock()
	_, known := p.learned[addr]
	p.learned[addr] = time.Now()
	p.mu.Unlock()
	if !known {
		p.refill()
	}
}

func (p *connPool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run refills and expires the pool until ctx ends, then closes every idle
// connection and waits for refill dials in flight.
func (p *connPool) run(ctx context.Context) {
	tick := time.NewTicker(p.tick())
	defer tick.Stop()
	defer p.shutdown()
	for {
		p.maintain(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-p.kick:
		}
	}
}

// tick is the interval of maintenance rounds.
func (p *connPool) tick() time.Duration { return max(p.maxIdle/4, 25*time.Millisecond) }

// maintain drops expired and dead connections and forgotten targets, and
// starts the dials that bring every target back to size.
func (p *connPool) maintain(ctx context.Context) {
	var static []string
	if p.targets != nil {
		static = p.targets()
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	want := make(map[string]bool, len(static)+len(p.learned))
	for _, a := range static {
		want[a] = true
	}
	for a, last := range p.learned {
		if now.Sub(last) > p.forget {
			delete(p.learned, a)
			continue
		}
		want[a] = true
	}
	// Retire a connection one tick before it reaches maxIdle, so get never
	// finds only expired ones between two ticks.
	retire := p.maxIdle - p.tick()
	for a, q := range p.idle {
		keep := q[:0]
		for _, pc := range q {
			if want[a] && now.Sub(pc.since) < retire && alive(pc.c) {
				keep = append(keep, pc)
				continue
			}
			pc.c.Close()
		}
		if len(keep) == 0 {
			delete(p.idle, a)
		} else {
			p.idle[a] = keep
		}
	}
	for a := range want {
		for n := len(p.idle[a]) + p.pending[a]; n < p.size; n++ {
			p.pending[a]++
			p.dials.Add(1)
			go p.dialOne(ctx, a)
		}
	}
}

// dialOne opens one connection to addr for the pool.
func (p *connPool) dialOne(ctx context.Context, addr string) {
	defer p.dials.Done()
	c, err := p.dial(ctx, addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending[addr]--
	if p.pending[addr] <= 0 {
		delete(p.pending, addr)
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			p.log.Debug("pool dial", "addr", addr, "err", err)
		}
		return
	}
	if p.closed {
		c.Close()
		return
	}
	p.idle[addr] = append(p.idle[addr], pooledConn{c: c, since: time.Now()})
}

// shutdown closes the pool: idle connections now, dials in flight as they
// return.
func (p *connPool) shutdown() {
	p.mu.Lock()
	p.closed = true
	for a, q := range p.idle {
		for _, pc := range q {
			pc.c.Close()
		}
		delete(p.idle, a)
	}
	p.mu.Unlock()
	p.dials.Wait()
}

// idleCount returns the number of pooled connections to addr.
func (p *connPool) idleCount(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle[addr])
}

// alive reports whether c looks usable: no EOF, no error and no unexpected
// bytes queued (a non-blocking peek answering "would block").
func alive(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		ok = err == unix.EAGAIN
		return true
	})
	return err == nil && ok
}
