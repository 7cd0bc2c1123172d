package xagent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mosto-net/mosto/internal/xlate"
)

// PlacerConfig configures a Placer.
type PlacerConfig struct {
	// Key is the key shared with the agents (at least 16 bytes).
	Key []byte
	// Agents maps a surrogate's address to its agent's control address.
	Agents map[netip.Addr]string
	// Dial dials an agent (nil: net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Retry is the wait between connection attempts; 0 means 1 s.
	Retry time.Duration
	Log   *slog.Logger
}

// Placer keeps a control connection to every agent and ships entries to
// them (the router's side). It implements router.Placer.
type Placer struct {
	cfg    PlacerConfig
	log    *slog.Logger
	agents map[netip.Addr]*agentConn
	wg     sync.WaitGroup

	placed, refused, lost atomic.Int64
}

// agentConn is one agent's connection and what was placed through it.
type agentConn struct {
	addr string

	mu      sync.Mutex
	conn    net.Conn // nil while down
	fr      *framer
	tsAdj   int64 // added to an entry's TSOffset: the agent's clock, plus a margin
	nextID  uint64
	pending map[uint64]xlate.Tuple
	placed  map[xlate.Tuple]func() // release, by In tuple
	wbuf    []byte
	ready   chan struct{} // closed at the first connection
}

// NewPlacer checks cfg; Start connects.
func NewPlacer(cfg PlacerConfig) (*Placer, error) {
	if len(cfg.Key) < 16 {
		return nil, errors.New("xagent: key shorter than 16 bytes")
	}
	if cfg.Retry == 0 {
		cfg.Retry = time.Second
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	p := &Placer{cfg: cfg, log: cfg.Log, agents: map[netip.Addr]*agentConn{}}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	for sur, addr := range cfg.Agents {
		p.agents[sur.Unmap()] = &agentConn{addr: addr, pending: map[uint64]xlate.Tuple{}, placed: map[xlate.Tuple]func(){}, ready: make(chan struct{})}
	}
	return p, nil
}

// Start keeps a connection to every agent until ctx ends; Wait waits for
// that.
func (p *Placer) Start(ctx context.Context) {
	for sur, a := range p.agents {
		p.wg.Go(func() { p.keep(ctx, sur, a) })
	}
}

// Wait waits for the connections' goroutines (after Start's ctx ended).
func (p *Placer) Wait() { p.wg.Wait() }

// WaitReady waits until every agent was connected once, or ctx ends.
func (p *Placer) WaitReady(ctx context.Context) error {
	for sur, a := range p.agents {
		select {
		case <-a.ready:
		case <-ctx.Done():
			return fmt.Errorf("xagent: agent of %s (%s) not connected: %w", sur, a.addr, ctx.Err())
		}
	}
	return nil
}

// PlacerStats are a Placer's counters: entries placed, refused by an agent,
// and released because their agent's connection was lost.
type PlacerStats struct{ Placed, Refused, Lost int64 }

// Stats returns the counters.
func (p *Placer) Stats() PlacerStats {
	return PlacerStats{Placed: p.placed.Load(), Refused: p.refused.Load(), Lost: p.lost.Load()}
}

// Ready reports whether surrogate's agent is connected now.
func (p *Placer) Ready(surrogate netip.Addr) bool {
	a := p.agents[surrogate.Unmap()]
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn != nil
}

// Place sends e (the surrogate -> client direction of a join, as the
// router's host computed it) to surrogate's agent without waiting for its
// answer. release is called (once, from another goroutine) if the agent
// refuses it or its connection is lost while e is placed; false means e
// was not sent (release is not called: the caller falls back).
func (p *Placer) Place(surrogate netip.Addr, e xlate.Entry, release func()) bool {
	a := p.agents[surrogate.Unmap()]
	if a == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil {
		return false
	}
	e.TSOffset = uint32(int64(e.TSOffset) + a.tsAdj)
	e.Ifindex, e.Remote = 0, false
	a.nextID++
	body, err := json.Marshal(installMsg{ID: a.nextID, Entry: e})
	if err != nil {
		return false
	}
	a.wbuf = a.fr.appendFrame(a.wbuf[:0], msgInstall, body)
	a.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := a.conn.Write(a.wbuf); err != nil {
		a.conn.Close() // the reader cleans up
		return false
	}
	a.pending[a.nextID] = e.In
	a.placed[e.In] = release
	p.placed.Add(1)
	return true
}

// Unplace tells surrogate's agent that the join of in is over (its
// entry's sweep would remove it anyway).
func (p *Placer) Unplace(surrogate netip.Addr, in xlate.Tuple) {
	a := p.agents[surrogate.Unmap()]
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.placed[in]; !ok || a.conn == nil {
		delete(a.placed, in)
		return
	}
	delete(a.placed, in)
	body, _ := json.Marshal(in)
	a.wbuf = a.fr.appendFrame(a.wbuf[:0], msgRemove, body)
	a.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := a.conn.Write(a.wbuf); err != nil {
		a.conn.Close()
	}
}

// keep connects to an agent, reads its results, and reconnects after a
// loss, until ctx ends.
func (p *Placer) keep(ctx context.Context, sur netip.Addr, a *agentConn) {
	first := true
	for ctx.Err() == nil {
		err := p.session(ctx, a, &first)
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("xagent: agent connection", "surrogate", sur, "agent", a.addr, "err", err)
		t := time.NewTimer(p.cfg.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session runs one control connection: the handshake, then the agent's
// results until the connection ends; on the way out every entry placed
// through it is released (the router translates it again).
func (p *Placer) session(ctx context.Context, a *agentConn, first *bool) error {
	t0 := monoNow()
	dctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	c, err := p.cfg.Dial(dctx, "tcp", a.addr)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	br := bufio.NewReader(c)
	hb := make([]byte, helloLen)
	if _, err := io.ReadFull(br, hb); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	t1 := monoNow()
	h, err := parseHello(hb)
	if err != nil {
		return err
	}
	var nc [nonceLen]byte
	rand.Read(nc[:])
	if _, err := c.Write(append(nc[:], clientProof(p.cfg.Key, h.Nonce[:], nc[:])...)); err != nil {
		return err
	}
	proof := make([]byte, 32)
	if _, err := io.ReadFull(br, proof); err != nil {
		return fmt.Errorf("agent's proof: %w", err)
	}
	if !hmac.Equal(proof, agentProof(p.cfg.Key, h.Nonce[:], nc[:])) {
		return ErrAuth
	}
	c.SetDeadline(time.Time{})
	// The agent's clock: the same as ours on the same kernel; else
	// estimated from its hello (sent between t0 and t1), with the
	// estimate's error bound added so the client's TSvals only go ahead.
	var adj int64
	if mine, err := bootID(); err != nil || !bytes.Equal(mine[:], h.BootID[:]) {
		mid := (t0 + t1) / 2
		d := time.Duration(h.Mono) - mid // agent - router
		margin := (t1-t0)/2 + time.Millisecond
		adj = int64((-d + margin) / time.Millisecond)
	}
	fr := newFramer(sessionKey(p.cfg.Key, h.Nonce[:], nc[:]), dirToAgent, dirToRouter)
	a.mu.Lock()
	a.conn, a.fr, a.tsAdj = c, fr, adj
	a.mu.Unlock()
	if *first {
		*first = false
		close(a.ready)
	}
	p.log.Info("xagent: agent connected", "agent", a.addr, "ts_adjust_ms", adj)
	err = p.results(br, a, fr)
	a.mu.Lock()
	a.conn = nil
	rel := make([]func(), 0, len(a.placed))
	for in, r := range a.placed {
		rel = append(rel, r)
		delete(a.placed, in)
	}
	clear(a.pending)
	a.mu.Unlock()
	p.lost.Add(int64(len(rel)))
	for _, r := range rel {
		r()
	}
	return err
}

// results reads the agent's results; a refusal releases its entry.
func (p *Placer) results(br *bufio.Reader, a *agentConn, fr *framer) error {
	for {
		typ, body, err := fr.read(br)
		if err != nil {
			return err
		}
		if typ != msgResult {
			return fmt.Errorf("xagent: unexpected frame type %d from the agent", typ)
		}
		var m resultMsg
		if err := json.Unmarshal(body, &m); err != nil {
			return fmt.Errorf("xagent: result frame: %w", err)
		}
		var rel func()
		a.mu.Lock()
		in, ok := a.pending[m.ID]
		delete(a.pending, m.ID)
		if ok && m.Err != "" {
			rel = a.placed[in]
			delete(a.placed, in)
		}
		a.mu.Unlock()
		if rel != nil {
			p.refused.Add(1)
			p.log.Warn("xagent: agent refused an entry", "agent", a.addr, "tuple", in, "err", m.Err)
			rel()
		}
	}
}
