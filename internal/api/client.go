package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls the controller API. The zero HTTP field means
// http.DefaultClient; for mutual TLS give it a client whose transport carries
// the FEP certificate.
type Client struct {
	BaseURL string // e.g. https://controller:7443
	HTTP    *http.Client
}

// StatusError is a non-2xx answer of the controller.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("controller answered %d: %s", e.Code, e.Message)
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	setTimeout(req)
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return readStatusError(resp)
	}
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func readStatusError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e Error
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(b))
	}
	return &StatusError{Code: resp.StatusCode, Message: e.Error}
}

// Join presents a join token and a CSR and returns the signed certificate.
func (c *Client) Join(ctx context.Context, req JoinRequest) (JoinResponse, error) {
	var out JoinResponse
	err := c.do(ctx, http.MethodPost, PathJoin, req, &out)
	return out, err
}

// RegisterFEP registers or updates f.
func (c *Client) RegisterFEP(ctx context.Context, f FEP) error {
	return c.do(ctx, http.MethodPost, PathFEPs, f, nil)
}

// DeleteFEP unregisters the FEP id.
func (c *Client) DeleteFEP(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, PathFEPs+"/"+url.PathEscape(id), nil, nil)
}

// FEPs lists the registered FEPs.
func (c *Client) FEPs(ctx context.Context) ([]FEP, error) {
	var out FEPList
	err := c.do(ctx, http.MethodGet, PathFEPs, nil, &out)
	return out.FEPs, err
}

// Targets returns the peers FEP id must measure.
func (c *Client) Targets(ctx context.Context, id string) ([]Target, error) {
	var out Targets
	err := c.do(ctx, http.MethodGet, PathFEPs+"/"+url.PathEscape(id)+"/targets", nil, &out)
	return out.Targets, err
}

// Report sends RTT samples.
func (c *Client) Report(ctx context.Context, r Report) (ReportResult, error) {
	var out ReportResult
	err := c.do(ctx, http.MethodPost, PathReports, r, &out)
	return out, err
}

// TargetsAndDestinations returns the peers and the destinations FEP id
// must measure.
func (c *Client) TargetsAndDestinations(ctx context.Context, id string) (Targets, error) {
	var out Targets
	err := c.do(ctx, http.MethodGet, PathFEPs+"/"+url.PathEscape(id)+"/targets", nil, &out)
	return out, err
}

// RegisterDestination registers or updates d.
func (c *Client) RegisterDestination(ctx context.Context, d Destination) error {
	return c.do(ctx, http.MethodPost, PathDestinations, d, nil)
}

// DeleteDestination removes the destination id.
func (c *Client) DeleteDestination(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, PathDestinations+"/"+url.PathEscape(id), nil, nil)
}

// Destinations lists the destinations with their current EgP.
func (c *Client) Destinations(ctx context.Context) ([]DestinationStatus, error) {
	var out DestinationList
	err := c.do(ctx, http.MethodGet, PathDestinations, nil, &out)
	return out.Destinations, err
}

// Matrix returns the current RTT matrix.
func (c *Client) Matrix(ctx context.Context) (Matrix, error) {
	var out Matrix
	err := c.do(ctx, http.MethodGet, PathMatrix, nil, &out)
	return out, err
}

// Health returns the controller's health and role.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var out Health
	err := c.do(ctx, http.MethodGet, PathHealth, nil, &out)
	return out, err
}

// Table asks for the table of lop newer than since, waiting up to wait. It
// returns nil and no error when no newer version came within wait (304).
func (c *Client) Table(ctx context.Context, lop string, since uint64, wait time.Duration) (*Table, error) {
	return c.TableEpoch(ctx, lop, since, "", wait)
}

// TableEpoch is Table for a proxy whose table is of the given store epoch
// (empty: none): a controller of another epoch answers at once with its
// table, whatever since says.
func (c *Client) TableEpoch(ctx context.Context, lop string, since uint64, epoch string, wait time.Duration) (*Table, error) {
	q := url.Values{}
	q.Set("since", strconv.FormatUint(since, 10))
	if epoch != "" {
		q.Set("epoch", epoch)
	}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	path := PathTables + url.PathEscape(lop) + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.BaseURL, "/")+path, nil)
	if err != nil {
		return nil, fmt.Errorf("get table %s: %w", lop, err)
	}
	setTimeout(req)
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("get table %s: %w", lop, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified:
		return nil, nil
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("get table %s: %w", lop, readStatusError(resp))
	}
	var t Table
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil {
		return nil, fmt.Errorf("get table %s: decode: %w", lop, err)
	}
	if t.Version <= since && (epoch == "" || t.Epoch == epoch) {
		return nil, fmt.Errorf("get table %s: controller sent version %d, not newer than %d", lop, t.Version, since)
	}
	return &t, nil
}

// WatchTable long-polls the table of lop from version since and calls fn with
// every newer table, until ctx is done (it then returns ctx.Err()). Errors
// are retried after backoff; onErr (may be nil) sees them.
func (c *Client) WatchTable(ctx context.Context, lop string, since uint64, fn func(*Table), onErr func(error)) error {
	backoff := 100 * time.Millisecond
	for {
		t, err := c.Table(ctx, lop, since, DefaultWaitPoll)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if onErr != nil {
				onErr(err)
			}
			var se *StatusError
			if errors.As(err, &se) && se.Code == http.StatusNotFound {
				backoff = 5 * time.Second
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 10*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if t != nil {
			since = t.Version
			fn(t)
		}
	}
}

// setTimeout tells the server how long the client still waits (its
// context's deadline), so the server stops working when the client gives up.
func setTimeout(req *http.Request) {
	if dl, ok := req.Context().Deadline(); ok {
		if d := time.Until(dl); d > 0 {
			req.Header.Set(TimeoutHeader, d.Round(time.Millisecond).String())
		}
	}
}
