package origin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// DefaultMaxSize bounds the size a request may ask for.
const DefaultMaxSize = 1 << 30

// Config configures a Server. The zero value is valid.
type Config struct {
	Seed    uint64        // stream seed used when a request has no seed parameter
	Think   time.Duration // delay before each response's header
	MaxSize int64         // largest object served; 0 means DefaultMaxSize
}

// Server serves dynamic objects. It is an http.Handler; Serve runs it on a
// listener.
type Server struct {
	cfg Config
	log *slog.Logger

	requests atomic.Int64
	bytes    atomic.Int64
}

// New returns a Server. A nil log discards.
func New(cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = DefaultMaxSize
	}
	return &Server{cfg: cfg, log: log}
}

// Stats reports the requests answered and body bytes written so far.
func (s *Server) Stats() (requests, bytes int64) { return s.requests.Load(), s.bytes.Load() }

// ServeHTTP answers GET /obj?size=N[&seed=S][&think=DURATION] with N bytes of
// the seed's stream. A response carries Content-Length, Cache-Control:
// no-store and X-Mosto-Seed. Bad parameters get 400, other paths 404.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/obj" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q := r.URL.Query()
	size, err := strconv.ParseInt(q.Get("size"), 10, 64)
	if err != nil || size < 0 || size > s.cfg.MaxSize {
		http.Error(w, fmt.Sprintf("size must be an integer number of bytes in [0, %d]", s.cfg.MaxSize), http.StatusBadRequest)
		return
	}
	seed := s.cfg.Seed
	if v := q.Get("seed"); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			http.Error(w, "seed must be an unsigned integer", http.StatusBadRequest)
			return
		}
	}
	think := s.cfg.Think
	if v := q.Get("think"); v != "" {
		if think, err = time.ParseDuration(v); err != nil || think < 0 || think > time.Minute {
			http.Error(w, "think must be a duration in [0, 1m]", http.StatusBadRequest)
			return
		}
	}
	if think > 0 {
		t := time.NewTimer(think)
		select {
		case <-r.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Mosto-Seed", strconv.FormatUint(seed, 10))
	w.WriteHeader(http.StatusOK)
	s.requests.Add(1)
	if r.Method == http.MethodHead {
		return
	}
	buf := make([]byte, 64<<10)
	n, err := io.CopyBuffer(onlyWriter{w}, Body(seed, size), buf)
	s.bytes.Add(n)
	if err != nil {
		s.log.Debug("origin: response cut", "size", size, "sent", n, "err", err)
	}
}

// onlyWriter hides ReadFrom so CopyBuffer uses our 64 KB buffer.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

// Serve answers requests on ln until ctx is done, then shuts down (waiting at
// most 2 s for responses in flight) and returns nil. ln is closed on return.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.log.Info("origin serving", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("origin serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = hs.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("origin serve %s: %w", ln.Addr(), serr)
	}
	return err
}
