package etcdhttp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// LeaseGrantResponse answers Grant.
type LeaseGrantResponse struct {
	Header ResponseHeader `json:"header"`
	ID     int64          `json:"ID,string,omitempty"`
	TTL    int64          `json:"TTL,string,omitempty"`
	Error  string         `json:"error,omitempty"`
}

type leaseIDRequest struct {
	ID int64 `json:"ID,string"`
}

// Grant creates a lease of ttl (rounded up to whole seconds, at least 1s).
func (c *Client) Grant(ctx context.Context, ttl time.Duration) (int64, error) {
	secs := max(1, int64((ttl+time.Second-1)/time.Second))
	var out LeaseGrantResponse
	in := struct {
		TTL int64 `json:"TTL,string"`
	}{secs}
	if err := c.call(ctx, "/v3/lease/grant", in, &out, false); err != nil {
		return 0, err
	}
	if out.Error != "" {
		return 0, fmt.Errorf("etcd lease grant: %s", out.Error)
	}
	if out.ID == 0 {
		return 0, fmt.Errorf("etcd lease grant: no lease id in the answer")
	}
	return out.ID, nil
}

// KeepAliveOnce renews lease id once and returns its new TTL, or
// ErrLeaseNotFound if it expired.
func (c *Client) KeepAliveOnce(ctx context.Context, id int64) (time.Duration, error) {
	body, err := json.Marshal(leaseIDRequest{id})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.reqTimeout)
	defer cancel()
	resp, err := c.open(ctx, "/v3/lease/keepalive", body, true)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	out, err := decodeFrame[LeaseGrantResponse](json.NewDecoder(io.LimitReader(resp.Body, 1<<20)))
	if err != nil {
		return 0, fmt.Errorf("etcd lease keepalive %x: %w", id, err)
	}
	if out.TTL <= 0 {
		return 0, fmt.Errorf("etcd lease keepalive %x: %w", id, ErrLeaseNotFound)
	}
	return time.Duration(out.TTL) * time.Second, nil
}

// Revoke ends lease id and deletes the keys attached to it.
func (c *Client) Revoke(ctx context.Context, id int64) error {
	var out struct {
		Header ResponseHeader `json:"header"`
	}
	err := c.call(ctx, "/v3/lease/revoke", leaseIDRequest{id}, &out, true)
	if e, ok := asError(err); ok && e.Code == codeNotFound {
		return fmt.Errorf("etcd lease revoke %x: %w", id, ErrLeaseNotFound)
	}
	return err
}
