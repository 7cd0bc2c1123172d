package origin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
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
	// Rate caps the body bytes per second of all responses together (a
	// source's bottleneck); 0 means no cap. SetRate changes it later.
	Rate int64
	// Modified is the Last-Modified time of every object; zero means
	// DefaultModified. Mirrors of one object must agree on it.
	Modified time.Time
	// HeaderTimeout bounds the wait for a request's header, including the
	// wait of a new connection for its first request; 0 means
	// DefaultHeaderTimeout.
	HeaderTimeout time.Duration
}

// DefaultHeaderTimeout is Config.HeaderTimeout's default: nginx's
// client_header_timeout. A request router keeps pre-established
// connections to its surrogates for up to router.Config.PoolMaxIdle (20 s)
// before their first request; a shorter timeout here closed them while
// the router took one, and a handed-off session then got the surrogate's
// reset (its FIN had crossed the request).
const DefaultHeaderTimeout = 60 * time.Second

// DefaultModified is the Last-Modified time of objects when Config.Modified
// is zero.
var DefaultModified = time.Date(2020, 7, 19, 0, 0, 0, 0, time.UTC)

// Server serves dynamic objects. It is an http.Handler; Serve runs it on a
// listener.
type Server struct {
	cfg Config
	log *slog.Logger

	requests atomic.Int64
	bytes    atomic.Int64

	silentUntil atomic.Int64 // unix nanoseconds; no byte is sent before
	rate        atomic.Int64 // bytes per second; 0: unlimited

	paceMu   sync.Mutex
	paceNext time.Time // when the bytes paced so far have all left
}

// New returns a Server. A nil log discards.
func New(cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = DefaultMaxSize
	}
	if cfg.Modified.IsZero() {
		cfg.Modified = DefaultModified
	}
	s := &Server{cfg: cfg, log: log}
	s.rate.Store(max(cfg.Rate, 0))
	return s
}

// Silence makes the server send nothing for d from now: responses in flight
// stop between chunks and new requests wait before their header, as a source
// that stops answering and comes back (seed 003's failure scenario). A later
// call replaces an earlier one; d <= 0 ends a silence.
func (s *Server) Silence(d time.Duration) {
	s.silentUntil.Store(time.Now().Add(max(d, 0)).UnixNano())
}

// SetRate caps the body bytes per second of all responses together; 0 lifts
// the cap.
func (s *Server) SetRate(bytesPerSec int64) { s.rate.Store(max(bytesPerSec, 0)) }

// ETag returns the entity tag of the object of seed and size: objects with
// equal tags have equal bytes, on every server.
func ETag(seed uint64, size int64) string {
	return fmt.Sprintf(`"%x-%x"`, seed, size)
}

// waitTurn blocks until the silence is over and the rate allows n more
// bytes, or ctx is done.
func (s *Server) waitTurn(ctx context.Context, n int) error {
	for {
		until := time.Unix(0, s.silentUntil.Load())
		d := time.Until(until)
		if d <= 0 {
			break
		}
		if err := sleepCtx(ctx, d); err != nil {
			return err
		}
	}
	rate := s.rate.Load()
	if rate <= 0 {
		return nil
	}
	// A shared virtual clock: each chunk leaves when the chunks before it
	// have, at the capped rate. Idle time is not banked beyond one chunk.
	s.paceMu.Lock()
	now := time.Now()
	start := s.paceNext
	if start.Before(now) {
		start = now
	}
	s.paceNext = start.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
	s.paceMu.Unlock()
	if d := time.Until(start); d > 0 {
		return sleepCtx(ctx, d)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Stats reports the requests answered and body bytes written so far.
func (s *Server) Stats() (requests, bytes int64) { return s.requests.Load(), s.bytes.Load() }

// ServeHTTP answers GET /obj?size=N[&seed=S][&think=DURATION] with N bytes of
// the seed's stream. A response carries Content-Length, Cache-Control:
// no-store, X-Mosto-Seed, an ETag (ETag), Last-Modified and Accept-Ranges.
// A single byte range (Range: bytes=a-b, a-, -n) gets 206 with Content-Range
// unless an If-Range names another version; a range beyond the object gets
// 416 with Content-Range: bytes */N; several ranges get the whole object.
// Bad parameters get 400, other paths 404.
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
	if err := s.waitTurn(r.Context(), 0); err != nil {
		return
	}
	h := w.Header()
	etag := ETag(seed, size)
	modified := s.cfg.Modified.UTC().Format(http.TimeFormat)
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Mosto-Seed", strconv.FormatUint(seed, 10))
	h.Set("ETag", etag)
	h.Set("Last-Modified", modified)
	h.Set("Accept-Ranges", "bytes")
	off, n, status := int64(0), size, http.StatusOK
	if rv := r.Header.Get("Range"); rv != "" && ifRangeMatches(r.Header.Get("If-Range"), etag, modified) {
		o, k, err := parseRange(rv, size)
		switch {
		case errors.Is(err, errUnsatisfiable):
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			http.Error(w, "range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
			return
		case err == nil:
			off, n, status = o, k, http.StatusPartialContent
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, off+n-1, size))
		}
	}
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(status)
	s.requests.Add(1)
	if r.Method == http.MethodHead {
		return
	}
	sent, err := s.writeBody(r.Context(), w, BodyAt(seed, off, n))
	s.bytes.Add(sent)
	if err != nil {
		s.log.Debug("origin: response cut", "size", size, "off", off, "len", n, "sent", sent, "err", err)
	}
}

// ifRangeMatches reports whether a Range may be honoured under the If-Range
// value v (empty: no condition): it must be the strong ETag or the exact
// Last-Modified date.
func ifRangeMatches(v, etag, modified string) bool {
	v = strings.TrimSpace(v)
	return v == "" || v == etag || v == modified
}

// chunk is the body write size: the unit of pacing and of silence.
const chunk = 16 << 10

// writeBody copies body to w in chunks, each after waitTurn.
func (s *Server) writeBody(ctx context.Context, w io.Writer, body io.Reader) (int64, error) {
	buf := make([]byte, chunk)
	var sent int64
	for {
		k, rerr := io.ReadFull(body, buf)
		if k > 0 {
			if err := s.waitTurn(ctx, k); err != nil {
				return sent, err
			}
			m, err := w.Write(buf[:k])
			sent += int64(m)
			if err != nil {
				return sent, err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return sent, nil
		}
		if rerr != nil {
			return sent, rerr
		}
	}
}

// Serve answers requests on ln until ctx is done, then shuts down (waiting at
// most 2 s for responses in flight) and returns nil. ln is closed on return.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: cmp.Or(s.cfg.HeaderTimeout, DefaultHeaderTimeout),
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
