package relay

// Stage: admin HTTP. /metrics, /healthz and (when enabled) pprof on the
// metrics listener.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// adminHTTP serves /metrics, /healthz and pprof.
type adminHTTP struct {
	srv *http.Server
	ln  net.Listener
}

// MetricsAddr returns the metrics listener's address, or nil.
func (s *Server) MetricsAddr() net.Addr {
	if s.admin.ln == nil {
		return nil
	}
	return s.admin.ln.Addr()
}

func (s *Server) newHTTPServer() *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.m.handler())
	mux.HandleFunc("/healthz", s.healthz)
	if s.cfg.Metrics.PProf {
		mux.HandleFunc("/debug/pprof/", servePProf)
	}
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// serveMetrics serves /metrics and /healthz until shutdown.
func (s *Server) serveMetrics(wg *sync.WaitGroup, fatal chan<- error) {
	defer wg.Done()
	if err := s.admin.srv.Serve(s.admin.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fatal <- fmt.Errorf("metrics: %w", err)
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}
