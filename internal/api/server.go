package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors a Backend or Joiner wraps to choose the HTTP status.
var (
	ErrInvalid   = errors.New("invalid request")    // 400
	ErrForbidden = errors.New("forbidden")          // 403
	ErrNotFound  = errors.New("not found")          // 404
	ErrNoJoin    = errors.New("joins are disabled") // 501
	ErrTooMany   = errors.New("too many requests")  // 429
)

// AdminIdentity is the client-certificate common name allowed to act for any
// FEP (register, delete, report on behalf of others).
const AdminIdentity = "admin"

// EncodedTable is a table already encoded as JSON (and, lazily, gzip), shared
// by every watcher of the same version so that 1000 watchers cost one encoding.
type EncodedTable struct {
	Version uint64
	JSON    func() []byte // the api.Table as JSON; cheap after its first call
	Gzip    func() []byte // the same gzip-compressed; nil: not available
}

// Backend answers the API requests; the controller implements it. Errors
// wrapping ErrInvalid, ErrForbidden or ErrNotFound become 400, 403 and 404;
// any other error is a 500 (a store failure, not bad input).
type Backend interface {
	RegisterFEP(ctx context.Context, f FEP) error
	DeleteFEP(ctx context.Context, id string) error
	FEPs(ctx context.Context) ([]FEP, error)
	Targets(ctx context.Context, id string) ([]Target, error)
	// DestTargets returns the destinations FEP id must measure.
	DestTargets(ctx context.Context, id string) ([]DestTarget, error)
	Report(ctx context.Context, r Report) (ReportResult, error)
	// WaitTable blocks until the table of lop has a version > since and
	// returns the newest one, or returns ctx.Err(). ErrNotFound: no such LoP.
	// epoch is the store epoch of the caller's table ("" none): a caller of
	// another epoch gets the current table at once.
	WaitTable(ctx context.Context, lop string, since uint64, epoch string) (*EncodedTable, error)
	Matrix(ctx context.Context) (Matrix, error)
	Health(ctx context.Context) Health
	// RegisterDestination adds or replaces the destination d.ID.
	RegisterDestination(ctx context.Context, d Destination) error
	// DeleteDestination removes a destination (ErrNotFound: none).
	DeleteDestination(ctx context.Context, id string) error
	// Destinations lists the destinations with their current EgP, by id.
	Destinations(ctx context.Context) ([]DestinationStatus, error)
}

// Joiner checks a join token and signs the FEP's certificate request
// (internal/pki implements it). registered says the FEP id is already
// registered: then only a token bound to that id may join it (a reusable or
// unbound token never takes over a registered id). Its errors are answered
// 403, or 400 when they wrap ErrInvalid.
type Joiner interface {
	Join(ctx context.Context, token string, f FEP, csrPEM []byte, registered bool) (JoinResponse, error)
}

// CertChecker is implemented by a Backend that tracks which client
// certificate may act for each FEP (the controller): CheckCert returns an
// error wrapping ErrForbidden when the certificate with this serial (hex)
// may not act for FEP id, because it was revoked (its FEP was deleted, or
// re-joined with a new key). The API calls it on every request made with a
// FEP certificate.
type CertChecker interface {
	CheckCert(ctx context.Context, id, serial string) error
}

// ServerConfig configures NewHandler.
type ServerConfig struct {
	Backend Backend
	Joiner  Joiner // nil: /v1/join answers 501
	// RequireClientCert refuses (401) every request except /v1/join,
	// /healthz and the OpenAPI document without a verified client
	// certificate. Use it with a tls.Config whose ClientAuth is
	// tls.VerifyClientCertIfGiven.
	RequireClientCert bool
	// Identity names the caller; nil means the common name of the verified
	// TLS client certificate. ok=false means anonymous (plain HTTP).
	Identity func(r *http.Request) (id string, ok bool)
	Metrics  http.Handler // served at /metrics; nil: 404
	Log      *slog.Logger
	Now      func() time.Time // nil: time.Now
	// RequestTimeout bounds every request's work (its context), plus the
	// wait of a table long-poll; a client's TimeoutHeader bounds it
	// further. 0: DefaultRequestTimeout.
	RequestTimeout time.Duration
}

// DefaultRequestTimeout is ServerConfig.RequestTimeout's default.
const DefaultRequestTimeout = 30 * time.Second

// TimeoutHeader carries how long the client still waits for the answer (a
// Go duration, Client sets it from its context's deadline): the server
// stops working on a request its client gave up on.
const TimeoutHeader = "Mosto-Timeout"

// requestBudget returns how long the server works on r: RequestTimeout
// (plus a long-poll's wait), at most the client's TimeoutHeader.
func (s *server) requestBudget(r *http.Request) time.Duration {
	d := s.cfg.RequestTimeout
	if d <= 0 {
		d = DefaultRequestTimeout
	}
	if w := r.URL.Query().Get("wait"); w != "" {
		if _, wait, err := ParseWatch("0", w); err == nil {
			d += wait
		}
	}
	if v := r.Header.Get(TimeoutHeader); v != "" {
		if c, err := time.ParseDuration(v); err == nil && c > 0 && c < d {
			d = c
		}
	}
	return d
}

type server struct {
	cfg    ServerConfig
	log    *slog.Logger
	certs  CertChecker // nil: the Backend does not track certificates
	joinMu sync.Mutex  // one join at a time: "is the id registered" stays true until it registers
}

// NewHandler returns the HTTP handler of the controller API.
func NewHandler(cfg ServerConfig) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Identity == nil {
		cfg.Identity = tlsIdentity
	}
	s := &server{cfg: cfg, log: cfg.Log}
	s.certs, _ = cfg.Backend.(CertChecker)
	mux := http.NewServeMux()
	route := func(method, path string, h http.HandlerFunc, public bool) {
		mux.Handle(method+" "+path, s.guard(h, public))
	}
	route("POST", PathJoin, s.join, true)
	route("GET", PathFEPs, s.listFEPs, false)
	route("POST", PathFEPs, s.registerFEP, false)
	route("DELETE", PathFEPs+"/{id}", s.deleteFEP, false)
	route("GET", PathFEPs+"/{id}/targets", s.targets, false)
	route("POST", PathReports, s.report, false)
	route("GET", PathTables+"{lop}", s.table, false)
	route("GET", PathMatrix, s.matrix, false)
	route("GET", PathPaths, s.paths, false)
	route("GET", PathDestinations, s.listDestinations, false)
	route("POST", PathDestinations, s.registerDestination, false)
	route("DELETE", PathDestinations+"/{id}", s.deleteDestination, false)
	route("GET", PathHealth, s.health, true)
	route("GET", PathOpenAPI, s.openapi, true)
	if cfg.Metrics != nil {
		mux.Handle("GET "+PathMetrics, s.guard(cfg.Metrics.ServeHTTP, false))
	}
	for _, p := range []string{PathJoin, PathFEPs, PathFEPs + "/{id}", PathFEPs + "/{id}/targets", PathReports,
		PathTables + "{lop}", PathMatrix, PathPaths, PathHealth, PathOpenAPI, PathDestinations, PathDestinations + "/{id}"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed on %s", r.Method, r.URL.Path))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no such path %s", r.URL.Path))
	})
	return mux
}

func tlsIdentity(r *http.Request) (string, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", false
	}
	return r.TLS.VerifiedChains[0][0].Subject.CommonName, true
}

type sourceKey struct{}

// WithSource returns ctx carrying the address a FEP registers from (the
// API sets it for a join and for a FEP registering itself, never for the
// admin), so that the Backend can check the FEP's hop address against it.
func WithSource(ctx context.Context, ip netip.Addr) context.Context {
	return context.WithValue(ctx, sourceKey{}, ip)
}

// Source returns the address set by WithSource.
func Source(ctx context.Context) (netip.Addr, bool) {
	ip, ok := ctx.Value(sourceKey{}).(netip.Addr)
	return ip, ok
}

func remoteIP(r *http.Request) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// CertSerial returns the serial number (lowercase hex) of the verified
// client certificate of r, or "" when there is none.
func CertSerial(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return ""
	}
	return r.TLS.VerifiedChains[0][0].SerialNumber.Text(16)
}

func (s *server) guard(h http.HandlerFunc, public bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.requestBudget(r))
		defer cancel()
		r = r.WithContext(ctx)
		if !public && s.cfg.RequireClientCert {
			if _, ok := s.cfg.Identity(r); !ok {
				writeError(w, http.StatusUnauthorized, errors.New("a client certificate signed by the controller CA is required"))
				return
			}
		}
		if s.certs != nil {
			// Every request made with a FEP certificate, public paths
			// included: a revoked certificate does nothing at all.
			if who, ok := s.cfg.Identity(r); ok && who != AdminIdentity {
				if serial := CertSerial(r); serial != "" {
					if err := s.certs.CheckCert(r.Context(), who, serial); err != nil {
						s.fail(w, r, err)
						return
					}
				}
			}
		}
		h(w, r)
	})
}

// mayActFor reports whether the caller may act for FEP id: anonymous callers
// (no TLS) may, as may the admin and the FEP itself.
func (s *server) mayActFor(r *http.Request, id string) error {
	who, ok := s.cfg.Identity(r)
	if !ok || who == AdminIdentity || who == id {
		return nil
	}
	return fmt.Errorf("%w: certificate of %q may not act for fep %q", ErrForbidden, who, id)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("encode response: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, code int, err error) {
	b, _ := json.Marshal(Error{Error: err.Error()})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// fail answers err with the status its sentinel asks for.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, ErrForbidden):
		code = http.StatusForbidden
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, ErrNoJoin):
		code = http.StatusNotImplemented
	case errors.Is(err, ErrTooMany):
		code = http.StatusTooManyRequests
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() != nil:
		code = http.StatusServiceUnavailable
		err = fmt.Errorf("request timed out (the server's per-request timeout or the client's %s): %w", TimeoutHeader, err)
	}
	if code == http.StatusInternalServerError {
		s.log.Warn("api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, code, err)
}

// DecodeJSON decodes one JSON value of type T from r strictly: unknown fields,
// trailing data and bodies over MaxBodyBytes are errors wrapping ErrInvalid.
func DecodeJSON[T any](r io.Reader) (T, error) {
	var v T
	dec := json.NewDecoder(io.LimitReader(r, MaxBodyBytes+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		var zero T
		if errors.Is(err, io.EOF) {
			return zero, fmt.Errorf("%w: empty body", ErrInvalid)
		}
		return zero, fmt.Errorf("%w: decode body: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var zero T
		return zero, fmt.Errorf("%w: trailing data after the JSON body", ErrInvalid)
	}
	return v, nil
}

func decodeBody[T any](w http.ResponseWriter, r *http.Request) (T, error) {
	if r.ContentLength > MaxBodyBytes {
		var zero T
		return zero, errTooLarge
	}
	return DecodeJSON[T](http.MaxBytesReader(w, r.Body, MaxBodyBytes))
}

var errTooLarge = fmt.Errorf("%w: body larger than %d bytes", ErrInvalid, MaxBodyBytes)

func (s *server) badBody(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	if errors.Is(err, errTooLarge) || errors.As(err, &mbe) || strings.Contains(err.Error(), "request body too large") {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", MaxBodyBytes))
		return
	}
	writeError(w, http.StatusBadRequest, err)
}

// validBody decodes r's body into a T and validates it; a bad body is
// answered (400, or 413 when too large) and ok is false.
func validBody[T interface{ Validate() error }](s *server, w http.ResponseWriter, r *http.Request) (v T, ok bool) {
	v, err := decodeBody[T](w, r)
	if err != nil {
		s.badBody(w, err)
		return v, false
	}
	if err := v.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return v, false
	}
	return v, true
}

// writeList answers items wrapped by wrap (an empty list, never null), or
// err.
func writeList[T, L any](s *server, w http.ResponseWriter, r *http.Request, items []T, err error, wrap func([]T) L) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if items == nil {
		items = []T{}
	}
	writeJSON(w, http.StatusOK, wrap(items))
}

func (s *server) join(w http.ResponseWriter, r *http.Request) {
	req, ok := validBody[JoinRequest](s, w, r)
	if !ok {
		return
	}
	if s.cfg.Joiner == nil {
		s.fail(w, r, fmt.Errorf("%w: this controller has no CA", ErrNoJoin))
		return
	}
	// Joins are rare: one at a time, so that two joins of one new id with
	// a reusable token cannot both see it unregistered.
	s.joinMu.Lock()
	defer s.joinMu.Unlock()
	feps, err := s.cfg.Backend.FEPs(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	registered := slices.ContainsFunc(feps, func(f FEP) bool { return f.ID == req.FEP.ID })
	resp, err := s.cfg.Joiner.Join(r.Context(), req.Token, req.FEP, []byte(req.CSRPEM), registered)
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			writeError(w, http.StatusBadRequest, err)
		} else {
			s.log.Warn("join refused", "fep", req.FEP.ID, "registered", registered, "err", err)
			writeError(w, http.StatusForbidden, fmt.Errorf("join refused: %w", err))
		}
		return
	}
	// The FEP record names the certificate that may act for it; a re-join
	// retires the one it replaces.
	req.FEP.CertSerial = ""
	if block, _ := pem.Decode([]byte(resp.CertPEM)); block != nil {
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			req.FEP.CertSerial = c.SerialNumber.Text(16)
		}
	}
	rctx := r.Context()
	if ip, ok := remoteIP(r); ok {
		rctx = WithSource(rctx, ip)
	}
	if err := s.cfg.Backend.RegisterFEP(rctx, req.FEP); err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("fep joined", "fep", req.FEP.ID, "hop_addr", req.FEP.HopAddr)
	writeJSON(w, http.StatusOK, resp)
}

func (s *server) listFEPs(w http.ResponseWriter, r *http.Request) {
	feps, err := s.cfg.Backend.FEPs(r.Context())
	writeList(s, w, r, feps, err, func(l []FEP) FEPList { return FEPList{FEPs: l} })
}

func (s *server) registerFEP(w http.ResponseWriter, r *http.Request) {
	f, ok := validBody[FEP](s, w, r)
	if !ok {
		return
	}
	if err := s.mayActFor(r, f.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	// The certificate serial is the controller's to set: the FEP's own
	// certificate when it registers itself, else the one on record.
	f.CertSerial = ""
	rctx := r.Context()
	if who, ok := s.cfg.Identity(r); ok && who == f.ID {
		f.CertSerial = CertSerial(r)
		if ip, ok := remoteIP(r); ok {
			rctx = WithSource(rctx, ip)
		}
	}
	if err := s.cfg.Backend.RegisterFEP(rctx, f); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, f)
}

func (s *server) pathID(w http.ResponseWriter, r *http.Request, name string) (string, bool) {
	id := r.PathValue(name)
	if err := ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("%s: %w", name, err))
		return "", false
	}
	return id, true
}

// deleteByID answers a DELETE of the object named by the path's id: the
// caller must pass may, del removes it (204 No Content).
func (s *server) deleteByID(w http.ResponseWriter, r *http.Request, may func(*http.Request, string) error, del func(context.Context, string) error) {
	id, ok := s.pathID(w, r, "id")
	if !ok {
		return
	}
	if err := may(r, id); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := del(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) deleteFEP(w http.ResponseWriter, r *http.Request) {
	s.deleteByID(w, r, s.mayActFor, s.cfg.Backend.DeleteFEP)
}

func (s *server) targets(w http.ResponseWriter, r *http.Request) {
	id, ok := s.pathID(w, r, "id")
	if !ok {
		return
	}
	if err := s.mayActFor(r, id); err != nil {
		s.fail(w, r, err)
		return
	}
	t, err := s.cfg.Backend.Targets(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if t == nil {
		t = []Target{}
	}
	d, err := s.cfg.Backend.DestTargets(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, Targets{FEP: id, Targets: t, Destinations: d})
}

func (s *server) report(w http.ResponseWriter, r *http.Request) {
	rep, err := decodeBody[Report](w, r)
	if err != nil {
		s.badBody(w, err)
		return
	}
	now := s.cfg.Now()
	if err := rep.Validate(now); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if err := s.mayActFor(r, rep.FEP); err != nil {
		s.fail(w, r, err)
		return
	}
	for i := range rep.Samples {
		if rep.Samples[i].At.IsZero() {
			rep.Samples[i].At = now
		}
	}
	for i := range rep.Destinations {
		if rep.Destinations[i].At.IsZero() {
			rep.Destinations[i].At = now
		}
	}
	res, err := s.cfg.Backend.Report(r.Context(), rep)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// ParseWatch parses the since and wait query parameters of a table request.
func ParseWatch(since, wait string) (uint64, time.Duration, error) {
	var v uint64
	if since != "" {
		var err error
		v, err = strconv.ParseUint(since, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("since %q: want a non-negative integer version", since)
		}
	}
	var d time.Duration
	if wait != "" {
		var err error
		d, err = time.ParseDuration(wait)
		if err != nil {
			// Accept a bare number of seconds too.
			n, nerr := strconv.ParseUint(wait, 10, 32)
			if nerr != nil {
				return 0, 0, fmt.Errorf("wait %q: want a duration such as 30s", wait)
			}
			d = time.Duration(n) * time.Second
		}
		if d < 0 || d > MaxWait {
			return 0, 0, fmt.Errorf("wait %q: want 0..%s", wait, MaxWait)
		}
	}
	return v, d, nil
}

func (s *server) table(w http.ResponseWriter, r *http.Request) {
	lop, ok := s.pathID(w, r, "lop")
	if !ok {
		return
	}
	// A table carries the overlay keys: only its LoP (and the admin)
	// reads it.
	if err := s.mayActFor(r, lop); err != nil {
		s.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	since, wait, err := ParseWatch(q.Get("since"), q.Get("wait"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	epoch := q.Get("epoch")
	if len(epoch) > 64 || !isHex(epoch) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("epoch %q: want at most 64 hex digits", epoch))
		return
	}
	// The Backend waits at least a moment even for wait=0, so an immediate
	// poll sees a table that is already there.
	ctx, cancel := context.WithTimeout(r.Context(), max(wait, time.Millisecond))
	defer cancel()
	t, err := s.cfg.Backend.WaitTable(ctx, lop, since, epoch)
	if err != nil {
		// A LoP the backend did not find is a 404 even when the lookup
		// outlasted the wait (a slow store under load).
		if ctx.Err() != nil && r.Context().Err() == nil && !errors.Is(err, ErrNotFound) {
			w.Header().Set(VersionHeader, strconv.FormatUint(since, 10))
			w.WriteHeader(http.StatusNotModified)
			return
		}
		if r.Context().Err() != nil {
			// The client went away, the request's budget ran out
			// (requestBudget), or the server is shutting down (its
			// base context ended): never an empty 200.
			writeError(w, http.StatusServiceUnavailable, fmt.Errorf("request ended: %w", context.Cause(r.Context())))
			return
		}
		s.fail(w, r, err)
		return
	}
	h := w.Header()
	h.Set(VersionHeader, strconv.FormatUint(t.Version, 10))
	h.Set("Content-Type", "application/json")
	h.Set("Vary", "Accept-Encoding")
	var body []byte
	if t.Gzip != nil && acceptsGzip(r) {
		body = t.Gzip()
		h.Set("Content-Encoding", "gzip")
	} else {
		body = t.JSON()
	}
	if len(body) == 0 {
		s.fail(w, r, fmt.Errorf("table %s version %d: empty encoding", lop, t.Version))
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

func isHex(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.TrimSpace(enc) == "gzip" && strings.ReplaceAll(q, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// GzipBytes compresses b at gzip.BestSpeed; a helper for Backends building
// EncodedTable.Gzip.
func GzipBytes(b []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func (s *server) matrix(w http.ResponseWriter, r *http.Request) {
	m, err := s.cfg.Backend.Matrix(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// mayAdmin reports whether the caller may change the overlay's
// configuration: anonymous callers (no TLS) and the admin may, FEPs may not.
func (s *server) mayAdmin(r *http.Request) error {
	who, ok := s.cfg.Identity(r)
	if !ok || who == AdminIdentity {
		return nil
	}
	return fmt.Errorf("%w: certificate of %q may not change destinations (admin only)", ErrForbidden, who)
}

func (s *server) listDestinations(w http.ResponseWriter, r *http.Request) {
	ds, err := s.cfg.Backend.Destinations(r.Context())
	writeList(s, w, r, ds, err, func(l []DestinationStatus) DestinationList { return DestinationList{Destinations: l} })
}

func (s *server) registerDestination(w http.ResponseWriter, r *http.Request) {
	d, ok := validBody[Destination](s, w, r)
	if !ok {
		return
	}
	if err := s.mayAdmin(r); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.cfg.Backend.RegisterDestination(r.Context(), d); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (s *server) deleteDestination(w http.ResponseWriter, r *http.Request) {
	s.deleteByID(w, r, func(r *http.Request, _ string) error { return s.mayAdmin(r) }, s.cfg.Backend.DeleteDestination)
}

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.cfg.Backend.Health(r.Context()))
}

func (s *server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Write(OpenAPI)
}
