package probe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
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
	// Keys returns the overlay keys. When it returns any, only requests
	// tagged under one of them are answered (an outsider cannot use the
	// endpoint to reflect traffic) and the reply is tagged under the same
	// key; when it is nil or returns none, only untagged requests are.
	Keys func() []Key
	Now  func() time.Time // the rate limiter's clock; nil: time.Now
}

// ServerStats counts what the server did with datagrams.
type ServerStats struct {
	Replied   uint64 // echoed
	Oversized uint64 // longer than PacketSize: dropped
	Garbage   uint64 // undecodable or not a request: dropped
	Unauth    uint64 // tag missing, unknown key or wrong tag: dropped
	Limited   uint64 // over the rate: dropped
}

// Server is the UDP echo endpoint of a FEP.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	replied, oversized, garbage, unauth, limited atomic.Uint64

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
	return ServerStats{Replied: s.replied.Load(), Oversized: s.oversized.Load(), Garbage: s.garbage.Load(), Unauth: s.unauth.Load(), Limited: s.limited.Load()}
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

// Serve answers probe requests on pc until ctx ends; it closes pc. On a
// *net.UDPConn the receive time of a request is the kernel's
// (SO_TIMESTAMPNS), so the reply's turnaround excludes the time this
// process took to be scheduled.
func (s *Server) Serve(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	defer pc.Close()
	uc, _ := pc.(*net.UDPConn)
	kernel := uc != nil && enableRxTimestamps(uc)
	s.log.Info("probe endpoint listening", "addr", pc.LocalAddr().String(), "kernel_timestamps", kernel)
	buf := make([]byte, PacketSize+1) // one more byte reveals oversized datagrams
	oob := make([]byte, oobSize)
	for {
		var (
			n, oobn int
			from    net.Addr
			err     error
		)
		if kernel {
			var ap netip.AddrPort
			n, oobn, _, ap, err = uc.ReadMsgUDPAddrPort(buf, oob)
			from = net.UDPAddrFromAddrPort(ap)
		} else {
			n, from, err = pc.ReadFrom(buf)
		}
		rx := time.Now().UnixNano()
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
		if kernel {
			if k := rxTimestamp(oob[:oobn]); k != 0 {
				rx = k
			}
		}
		if reply := s.handle(buf[:n], rx); reply != nil {
			pc.WriteTo(reply, from)
		}
	}
}

// handle decides on one datagram received at rx (ns since the Unix epoch);
// it returns the reply, written over b, or nil.
func (s *Server) handle(b []byte, rx int64) []byte {
	if len(b) > PacketSize {
		s.oversized.Add(1)
		return nil
	}
	p, err := ParsePacket(b)
	if err != nil || p.Type != TypeRequest {
		s.garbage.Add(1)
		return nil
	}
	var keys []Key
	if s.cfg.Keys != nil {
		keys = s.cfg.Keys()
	}
	key, ok := Verify(b, keys)
	if !ok {
		s.unauth.Add(1)
		return nil
	}
	if !s.allow() {
		s.limited.Add(1)
		return nil
	}
	p.Type, p.RxNano, p.TxNano = TypeReply, rx, time.Now().UnixNano()
	out, err := p.Append(b[:0], key)
	if err != nil {
		s.unauth.Add(1)
		return nil
	}
	s.replied.Add(1)
	return out
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
