package relay

// Stage: handshake workers. An accepted connection's handshake (hop header
// or entry protocol, chain choice, dial) runs on a pooled worker goroutine;
// its copy phase then runs on a goroutine of its own.

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/mosto-net/mosto/internal/hop"
)

// workerState holds the handshake workers (see dispatch): idle ones wait
// on jobs until stop is closed.
type workerState struct {
	jobs chan handshakeJob
	stop chan struct{}
	idle atomic.Int32
	wg   sync.WaitGroup
}

// handshakeJob is one accepted connection for a handshake worker.
type handshakeJob struct {
	l   *listener
	c   *net.TCPConn
	src netip.AddrPort
	// A hop flow an event loop gave up after reading its header (checked,
	// not replayed): h and the bytes that followed it.
	h     *hop.Header
	early []byte
}

// maxIdleWorkers bounds the handshake workers kept waiting for work.
const maxIdleWorkers = 32

// dispatch hands j to an idle handshake worker, or starts a new one.
// Workers live on after their handshake, so the deep stack a handshake
// needs (the dial path) is grown once per worker instead of once per flow;
// each flow's copy phase runs on fresh small-stack goroutines.
func (s *Server) dispatch(j handshakeJob) {
	select {
	case s.workers.jobs <- j:
		return
	default:
	}
	s.workers.wg.Add(1)
	go s.handshakeWorker(j)
}

// handshakeWorker runs handshakes until it is told to stop, or finds
// enough workers idle already.
func (s *Server) handshakeWorker(j handshakeJob) {
	defer s.workers.wg.Done()
	for {
		s.serveConn(j)
		if s.workers.idle.Add(1) > maxIdleWorkers {
			s.workers.idle.Add(-1)
			return
		}
		select {
		case j = <-s.workers.jobs:
			s.workers.idle.Add(-1)
		case <-s.workers.stop:
			s.workers.idle.Add(-1)
			return
		}
	}
}

// serveConn runs the accept-side protocol of one connection (header or
// entry protocol, chain choice, dial) on a handshake worker, then hands the
// flow to its own goroutine for the copy phase.
func (s *Server) serveConn(j handshakeJob) {
	l, c, src := j.l, j.c, j.src
	s.track(c)
	if nd := s.cfg.Socket.NoDelay; nd != nil {
		c.SetNoDelay(*nd)
	}
	var role role
	var up *net.TCPConn
	var learn sizeKeys
	switch {
	case j.h != nil:
		role, up = s.hopOnward(c, src, j.h, j.early)
	case l.kind == kindHop:
		role, up = s.serveHop(c, src)
	default:
		role = roleInP
		up, learn = s.serveEntry(l, c, src)
	}
	if up == nil { // refused or failed: already counted and closed
		s.endConn(l, c, src)
		return
	}
	go s.relayConn(l, c, src, role, up, learn)
}

// relayConn owns an accepted connection for its copy phase.
func (s *Server) relayConn(l *listener, c *net.TCPConn, src netip.AddrPort, role role, up *net.TCPConn, learn sizeKeys) {
	defer s.endConn(l, c, src)
	if l.kind == kindTProxy {
		s.relayTransparent(role, c, up)
		return
	}
	s.relay(role, c, up, learn, 0)
}

// endConn releases what an accepted connection held.
func (s *Server) endConn(l *listener, c *net.TCPConn, src netip.AddrPort) {
	s.untrack(c)
	c.Close() // every path closes c already; this is the safety net
	s.accept.limits.release(src.Addr(), l.kind == kindHop)
	s.flows.wg.Done()
}
