package etcdhttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// maxResponse bounds a unary response body (a transaction reading many
// large tables can be big; etcd's own default request limit is 1.5 MiB).
const maxResponse = 1 << 30

// gRPC status codes that this package looks at.
const (
	codeNotFound    = 5
	codeOutOfRange  = 11
	codeUnavailable = 14
)

// Config configures New.
type Config struct {
	// Endpoints are etcd client URLs (http://host:port or https://host:port);
	// a bare host:port means https (the store holds the overlay secrets).
	Endpoints []string
	// TLS is used for https endpoints: RootCAs for etcd's CA, Certificates
	// for client certificate authentication. Nil uses the system roots.
	TLS *tls.Config
	// DialTimeout bounds connecting to one endpoint; default 5s.
	DialTimeout time.Duration
	// RequestTimeout bounds one unary request (over every endpoint tried)
	// and the wait for a watch to be created; default 30s. Streams, once
	// created, last until their context ends.
	RequestTimeout time.Duration
}

// Client talks to an etcd cluster through its JSON gateway. It is safe for
// concurrent use.
type Client struct {
	eps        []string
	tr         *http.Transport
	hc         *http.Client
	reqTimeout time.Duration
	next       atomic.Uint32 // index of the endpoint tried first
}

// Error is an error returned by etcd (through the gateway): a gRPC status
// code and etcd's message.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("etcd: status code %d", e.Code)
	}
	return e.Message
}

// IsCompacted reports whether err says that a requested revision has been
// compacted (or the compaction revision is not newer than the last one).
func IsCompacted(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == codeOutOfRange && strings.Contains(e.Message, "compacted")
}

// ErrLeaseNotFound is returned by KeepAliveOnce and Revoke for a lease that
// expired or never existed.
var ErrLeaseNotFound = errors.New("etcdhttp: lease not found")

// New returns a client for cfg. It does not contact etcd.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcdhttp: no endpoints")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	eps := make([]string, 0, len(cfg.Endpoints))
	for _, ep := range cfg.Endpoints {
		ep = strings.TrimRight(strings.TrimSpace(ep), "/")
		switch {
		case ep == "":
			return nil, errors.New("etcdhttp: empty endpoint")
		case strings.HasPrefix(ep, "http://"), strings.HasPrefix(ep, "https://"):
		case strings.Contains(ep, "://"):
			return nil, fmt.Errorf("etcdhttp: endpoint %q: scheme must be http or https", ep)
		default:
			// The store holds the overlay secrets: without a scheme,
			// https (plain http only when asked for by name).
			ep = "https://" + ep
		}
		if strings.HasPrefix(ep, "http://") && cfg.TLS != nil && len(cfg.TLS.Certificates) > 0 {
			return nil, fmt.Errorf("etcdhttp: endpoint %q: client certificate given for a plain http endpoint", ep)
		}
		eps = append(eps, ep)
	}
	d := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil, // etcd is never reached through an HTTP proxy
		DialContext:           d.DialContext,
		TLSClientConfig:       cfg.TLS,
		TLSHandshakeTimeout:   cfg.DialTimeout,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // watches answer only when created; bounded by contexts instead
	}
	return &Client{eps: eps, tr: tr, hc: &http.Client{Transport: tr}, reqTimeout: cfg.RequestTimeout}, nil
}

// TLSConfig builds a TLS configuration from PEM files: caFile (etcd's CA;
// empty for the system roots) and, both or neither, a client certificate
// and key.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("etcd CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA %s: no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("etcd client certificate: give both the certificate and the key")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Endpoints returns the normalized endpoint URLs.
func (c *Client) Endpoints() []string { return append([]string(nil), c.eps...) }

// Close closes idle connections. Streams end with their contexts.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// notSent reports whether err happened before the request could reach a
// server (so it is safe to send it elsewhere).
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// call sends one unary request in JSON and decodes the answer into out.
// A request that was not sent, or any failed request when idempotent,
// moves on to the next endpoint.
func (c *Client) call(ctx context.Context, path string, in, out any, idempotent bool) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("etcd %s: encode request: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.reqTimeout)
	defer cancel()
	resp, err := c.open(ctx, path, body, idempotent)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("etcd %s: read response: %w", path, err)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("etcd %s: decode response: %w", path, err)
	}
	return nil
}

// open POSTs body to path on the first endpoint that takes it and returns
// the response if its status is 200 (the caller closes its body). A non-200
// status is returned as *Error.
func (c *Client) open(ctx context.Context, path string, body []byte, idempotent bool) (*http.Response, error) {
	start := int(c.next.Load())
	var errs []error
	for i := range c.eps {
		idx := (start + i) % len(c.eps)
		resp, err := c.post(ctx, c.eps[idx]+path, body, idempotent)
		if err == nil {
			if resp.StatusCode == http.StatusOK {
				c.next.Store(uint32(idx))
				return resp, nil
			}
			err = readError(resp)
			var ee *Error
			if !errors.As(err, &ee) || ee.Code != codeUnavailable || !idempotent {
				return nil, fmt.Errorf("etcd %s %s: %w", c.eps[idx], path, err)
			}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("etcd %s %s: %w", c.eps[idx], path, ctx.Err())
		}
		errs = append(errs, fmt.Errorf("%s: %w", c.eps[idx], err))
		c.next.Store(uint32((idx + 1) % len(c.eps))) // next call starts elsewhere
		if !idempotent && !notSent(err) {
			return nil, fmt.Errorf("etcd %s: %w", path, errors.Join(errs...))
		}
	}
	return nil, fmt.Errorf("etcd %s: every endpoint failed: %w", path, errors.Join(errs...))
}

func (c *Client) post(ctx context.Context, url string, body []byte, idempotent bool) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	// Like clientv3.WithRequireLeader: a member cut off from the leader
	// fails the request instead of serving stale data or a silent watch.
	req.Header.Set("Grpc-Metadata-Hasleader", "true")
	if idempotent {
		// A nil Idempotency-Key is not sent but lets net/http resend the
		// request on a fresh connection when a pooled one turns out to be
		// closed by the server (as it does for GET).
		req.Header["Idempotency-Key"] = nil
	}
	return c.hc.Do(req)
}

// readError turns a non-200 gateway response into an *Error (closing its body).
func readError(resp *http.Response) error {
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e Error
	if json.Unmarshal(data, &e) == nil && (e.Code != 0 || e.Message != "") {
		return &e
	}
	msg := strings.TrimSpace(string(data))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	return fmt.Errorf("HTTP status %s: %q", resp.Status, msg)
}

// frame is one message of a gateway stream: a result or an error.
type frame[T any] struct {
	Result *T     `json:"result"`
	Error  *Error `json:"error"`
}

// decodeFrame reads the next stream message from dec.
func decodeFrame[T any](dec *json.Decoder) (*T, error) {
	var f frame[T]
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if f.Error != nil {
		return nil, f.Error
	}
	if f.Result == nil {
		return nil, errors.New("stream message with neither result nor error")
	}
	return f.Result, nil
}
