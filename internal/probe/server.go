package probe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ServerConfig configures the measurement endpoint.
type ServerConfig struct {
	// Rate bounds the replies per second (a token bucket of Burst); 0
	// means 2000. Excess requests are dropped, so the endpoint cannot be
	// used to flood anyone, and replies are never larger than requests.
	Rate  float64
	Burst int // 0 means 200
	Now   func() time.Time
}

// ServerStats counts what the server did with datagrams.
type ServerStats struct {
	Replied   uint64 // echoed
	Oversized uint64 // longer than PacketSize: dropped
	Garbage   uint64 // undecodable or not a request: dropped
	Limited   uint64 // over the rate: dropped
}

// Server is the UDP echo endpoint of a FEP.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	replied, oversized, garbage, limited atomic.Uint64

	mu     sync.Mutex // guards the bucket
	tokens float64
	last   time.Time
}

// NewServer returns a Server; log may be nil.
func NewServer(cfg ServerConfig, log *slog.Logger) *Server {
	if cfg.Rate <= 0 {
		cfg.Rate = 2000
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 200
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, tokens: float64(cfg.Burst)}
}

// Stats returns the counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Replied: s.replied.Load(), Oversized: s.oversized.Load(), Garbage: s.garbage.Load(), Limited: s.limited.Load()}
}

// ListenAndServe listens on the UDP address addr and serves until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp", addr)
	if err != nil {
		return fmt.Errorf("probe: listen %s: %w", addr, err)
	}
	return s.Serve(ctx, pc)
}

// Serve answers probe requests on pc until ctx ends; it closes pc.
func (s *Server) Serve(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	defer pc.Close()
	s.log.Info("probe endpoint listening", "addr", pc.LocalAddr().String())
	buf := make([]byte, PacketSize+1) // one more byte reveals oversized datagrams
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("probe: serve: %w", err)
			}
			// Transient errors (ICMP-induced ECONNREFUSED and the like).
			continue
		}
		if reply := s.handle(buf[:n]); reply != nil {
			pc.WriteTo(reply, from)
		}
	}
}

// handle decides on one datagram; it returns the reply or nil.
func (s *Server) handle(b []byte) []byte {
	if len(b) > PacketSize {
		s.oversized.Add(1)
		return nil
	}
	p, err := ParsePacket(b)
	if err != nil || p.Type != TypeRequest {
		s.garbage.Add(1)
		return nil
	}
	if !s.allow() {
		s.limited.Add(1)
		return nil
	}
	s.replied.Add(1)
	b[5] = TypeReply
	return b
}

func (s *Server) allow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	if !s.last.IsZero() {
		s.tokens += now.Sub(s.last).Seconds() * s.cfg.Rate
		if s.tokens > float64(s.cfg.Burst) {
			s.tokens = float64(s.cfg.Burst)
		}
	}
	s.last = now
	if s.tokens < 1 {
		return false
	}
	s.tokens--
	return true
}
