package relay

// Stage: dial and pools (the pools). Pre-established connections to hop
// members and origins, kept filled and retired before the peer's idle
// timeout; the pool hello that asks a member for a longer grant.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/metrics"
	"golang.org/x/sys/unix"
)

// Pool results counted in mosto_relay_pool_total.
const (
	poolHit   = "hit"   // a pooled connection was used
	poolMiss  = "miss"  // none was ready: the flow dialed
	poolStale = "stale" // a pooled connection was found closed or too old and discarded
	// poolUnsupported: a member did not answer the pool hello (a relay
	// that does not know pooled connections); it is dialed per flow for
	// poolRetry.
	poolUnsupported = "unsupported"
)

// The pool hello: a pooled hop connection starts with poolHello, and a
// member that keeps pooled connections idle answers poolGrantMagic and how
// long (uint32 ms, big endian) it will wait for the flow's header. A relay
// that does not know the hello reads it as a malformed hop header (it is
// not a PROXY v2 signature) and resets the connection: the pool then stops
// pooling to it for poolRetry and its flows dial, as without a pool.
var (
	poolHello      = [16]byte{'M', 'O', 'S', 'T', 'O', '-', 'P', 'O', 'O', 'L', '/', '1', '\r', '\n', '\r', '\n'}
	poolGrantMagic = [4]byte{'M', 'P', 'O', 'K'}
)

const (
	// poolGrantLen is the answer's length: magic + uint32 milliseconds.
	poolGrantLen = 8
	// DefaultPoolGrant is how long a relay keeps a member's pooled
	// connection idle when its hop.member_idle is 0.
	DefaultPoolGrant = 60 * time.Second
	// poolRetry is how long a member that refused the hello is not pooled
	// (short: a new member refuses it until it has the member list).
	poolRetry = time.Minute
	// poolGrantMargin: a pooled connection is retired this long before the
	// peer's grant runs out, so a flow never races the peer's close.
	poolGrantMargin = time.Second
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
	results *metrics.CounterVec
	// hello, if set, runs on every new connection before it is pooled and
	// returns how long the peer keeps it idle (see poolHello); an error
	// marks the target unsupported for poolRetry.
	hello func(ctx context.Context, c *net.TCPConn) (time.Duration, error)

	kick chan struct{}

	mu      sync.Mutex
	idle    map[string][]pooledConn
	pending map[string]int        // dials in progress per target
	learned map[string]time.Time  // learned target -> last use
	nopool  map[string]time.Time  // target -> when to try the hello again
	retry   map[string]retryState // targets whose last dial failed
	closed  bool
	dials   sync.WaitGroup // refill dials in progress
}

type pooledConn struct {
	c       *net.TCPConn
	since   time.Time
	expires time.Time // since + the lesser of maxIdle and the peer's grant
}

func newConnPool(name string, size int, maxIdle time.Duration, dial func(context.Context, string) (*net.TCPConn, error), targets func() []string, results *metrics.CounterVec, log *slog.Logger) *connPool {
	return &connPool{
		name: name, log: log.With("pool", name), size: size, maxIdle: maxIdle, forget: 10 * time.Minute,
		dial: dial, targets: targets, results: results,
		kick:    make(chan struct{}, 1),
		idle:    make(map[string][]pooledConn),
		pending: make(map[string]int),
		learned: make(map[string]time.Time),
		nopool:  make(map[string]time.Time),
		retry:   make(map[string]retryState),
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
		if now.Before(pc.expires) && alive(pc.c) {
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
	wake := time.NewTimer(p.tick())
	defer wake.Stop()
	defer p.shutdown()
	for {
		p.maintain(ctx)
		wake.Reset(p.nextRound())
		select {
		case <-ctx.Done():
			return
		case <-wake.C:
		case <-p.kick:
		}
	}
}

// tick is the interval of maintenance rounds.
func (p *connPool) tick() time.Duration { return max(p.maxIdle/4, 25*time.Millisecond) }

// Retry of failed pool dials (a member restarting, say): the next round
// comes after poolRetryMin, doubling with every failure in a row, at most
// one tick.
const poolRetryMin = 50 * time.Millisecond

// nextRound returns when the next maintenance round is due: a tick from
// now, or sooner when a failed target may be dialed again.
func (p *connPool) nextRound() time.Duration {
	d := p.tick()
	now := time.Now()
	p.mu.Lock()
	for _, r := range p.retry {
		d = min(d, max(r.at.Sub(now), time.Millisecond))
	}
	p.mu.Unlock()
	return d
}

// retryState is the dial backoff of one target.
type retryState struct {
	fails int       // dials failed in a row
	at    time.Time // no dial before
}

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
	for a, until := range p.nopool {
		if now.After(until) {
			delete(p.nopool, a)
			continue
		}
		delete(want, a) // dialed per flow until then
	}
	for a := range p.retry {
		if !want[a] {
			delete(p.retry, a)
		}
	}
	// Retire a connection one tick before it expires, so get never finds
	// only expired ones between two ticks.
	for a, q := range p.idle {
		keep := q[:0]
		for _, pc := range q {
			if want[a] && now.Before(pc.expires.Add(-p.tick())) && alive(pc.c) {
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
		if r, ok := p.retry[a]; ok && now.Before(r.at) {
			continue // backing off after a failed dial
		}
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
	life := p.maxIdle
	if err == nil && p.hello != nil {
		var grant time.Duration
		if grant, err = p.hello(ctx, c); err != nil {
			c.Close()
			if ctx.Err() == nil {
				p.unsupported(addr, err)
			}
		} else {
			life = min(life, grant-poolGrantMargin)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending[addr]--
	if p.pending[addr] <= 0 {
		delete(p.pending, addr)
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			p.log.Debug("pool dial", "addr", addr, "err", err)
			r := p.retry[addr]
			r.fails++
			r.at = time.Now().Add(min(poolRetryMin<<min(r.fails-1, 16), p.tick()))
			p.retry[addr] = r
			p.refill() // the run loop sets its timer for the retry
		}
		return
	}
	delete(p.retry, addr)
	if p.closed {
		c.Close()
		return
	}
	now := time.Now()
	p.idle[addr] = append(p.idle[addr], pooledConn{c: c, since: now, expires: now.Add(life)})
}

// unsupported stops pooling to addr for poolRetry: its peer did not answer
// the hello.
func (p *connPool) unsupported(addr string, err error) {
	p.results.WithLabelValues(p.name, poolUnsupported).Inc()
	p.mu.Lock()
	_, known := p.nopool[addr]
	p.nopool[addr] = time.Now().Add(poolRetry)
	p.mu.Unlock()
	if !known {
		p.log.Info("member does not take pooled connections: dialing per flow", "addr", addr, "retry", poolRetry, "err", err)
	}
}

// writePoolHello sends the pool hello on c and reads the peer's grant.
func writePoolHello(c *net.TCPConn, timeout time.Duration) (time.Duration, error) {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(poolHello[:]); err != nil {
		return 0, fmt.Errorf("send pool hello: %w", err)
	}
	var b [poolGrantLen]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, fmt.Errorf("read pool grant: %w", err)
	}
	if [4]byte(b[:4]) != poolGrantMagic {
		return 0, fmt.Errorf("read pool grant: unexpected answer %q", b[:])
	}
	grant := time.Duration(binary.BigEndian.Uint32(b[4:])) * time.Millisecond
	if grant <= poolGrantMargin {
		return 0, fmt.Errorf("pool grant %v too short", grant)
	}
	return grant, nil
}

// poolHelloDial is the hop pool's hello: the pool hello with the connect
// timeout.
func (s *Server) poolHelloDial(ctx context.Context, c *net.TCPConn) (time.Duration, error) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	return writePoolHello(c, s.out.dialer.Timeout)
}

// memberPreamble runs before the hop header of a connection from a
// member's address. A pooled connection announces itself with the pool
// hello: it is granted hop.member_idle (DefaultPoolGrant when 0) to wait
// for its flow's header. Any other connection's first bytes are handed back
// in the returned reader, so hop.Read sees the whole header. A connection
// closed before its header was waiting idle and ends quietly (ok false).
func (s *Server) memberPreamble(c *net.TCPConn, src netip.AddrPort) (r io.Reader, ok bool) {
	mi := time.Duration(s.cfg.Hop.MemberIdle)
	if mi > 0 && !s.awaitFirstByte(c, src, mi) {
		return nil, false
	}
	var b [len(poolHello)]byte
	c.SetReadDeadline(time.Now().Add(s.accept.header))
	n, err := io.ReadFull(deadlineReader{c}, b[:])
	if err != nil || b != poolHello {
		// Not a pooled connection (or a broken one: hop.Read meets the
		// same error after these bytes and refuses it).
		return io.MultiReader(bytes.NewReader(b[:n]), deadlineReader{c}), true
	}
	grant := mi
	if grant <= 0 {
		grant = DefaultPoolGrant
	}
	var ans [poolGrantLen]byte
	copy(ans[:], poolGrantMagic[:])
	binary.BigEndian.PutUint32(ans[4:], uint32(grant.Milliseconds()))
	c.SetWriteDeadline(time.Now().Add(s.accept.header))
	if _, err := c.Write(ans[:]); err != nil {
		c.Close()
		return nil, false
	}
	c.SetWriteDeadline(time.Time{})
	if !s.awaitFirstByte(c, src, grant) {
		return nil, false
	}
	return deadlineReader{c}, true
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
