package cli

import (
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/mosto-net/mosto/internal/dashboard"
)

// uiFlags are the flags of the controller's dashboard listener.
type uiFlags struct {
	listen, authFile *string
	poll             *time.Duration
}

func addUIFlags(fs *flag.FlagSet) uiFlags {
	return uiFlags{
		listen:   fs.String("ui-listen", "", "serve the read-only dashboard (/ui/) and its state (/ui/state, for `mosto status`) on this address (empty: none)"),
		authFile: fs.String("ui-auth-file", "", "file with one line USER:PASSWORD: the dashboard asks for it (HTTP basic auth); required unless --ui-listen is a loopback address"),
		poll:     fs.Duration("ui-poll", time.Second, "the dashboard rereads the controller's state this often (and at every report)"),
	}
}

// basicAuth reads a USER:PASSWORD file.
func readBasicAuth(path string) (user, pass string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("--ui-auth-file: %w", err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	user, pass, ok := strings.Cut(strings.TrimSpace(line), ":")
	if !ok || user == "" || len(pass) < 8 {
		return "", "", fmt.Errorf("--ui-auth-file %s: want one line USER:PASSWORD with a password of at least 8 characters", path)
	}
	return user, pass, nil
}

func requireBasicAuth(h http.Handler, user, pass string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user))&subtle.ConstantTimeCompare([]byte(p), []byte(pass)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="mosto dashboard", charset="UTF-8"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// isLoopback reports whether addr (host:port) only listens on loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// uiServer is the running dashboard listener.
type uiServer struct {
	srv  *http.Server
	done chan struct{}
}

// startUI checks the flags, listens, and serves the dashboard of src until
// stop is called. It returns nil, nil when --ui-listen is empty.
func startUI(ctx context.Context, f uiFlags, src dashboard.Source, store string, log *slog.Logger) (*uiServer, error) {
	if *f.listen == "" {
		if *f.authFile != "" {
			return nil, usageErrorf("--ui-auth-file without --ui-listen")
		}
		return nil, nil
	}
	var user, pass string
	if *f.authFile != "" {
		var err error
		if user, pass, err = readBasicAuth(*f.authFile); err != nil {
			return nil, err
		}
	} else if !isLoopback(*f.listen) {
		return nil, usageErrorf("--ui-listen %s is not a loopback address: give --ui-auth-file", *f.listen)
	}
	d, err := dashboard.New(dashboard.Config{Source: src, Poll: *f.poll, Store: store, Log: log})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", *f.listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", *f.listen, err)
	}
	h := d.Handler()
	if user != "" {
		h = requireBasicAuth(h, user, pass)
	}
	u := &uiServer{done: make(chan struct{}), srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}}
	runCtx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(u.done)
		dd := make(chan struct{})
		go func() { defer close(dd); d.Run(runCtx) }()
		if err := u.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("dashboard listener stopped", "err", err)
		}
		cancel()
		<-dd
	}()
	log.Info("dashboard serving", "url", "http://"+ln.Addr().String()+"/ui/", "auth", user != "")
	return u, nil
}

// stop closes the listener and the streams, and waits.
func (u *uiServer) stop() {
	if u == nil {
		return
	}
	u.srv.Close() // SSE streams never end by themselves: no graceful wait
	<-u.done
}
