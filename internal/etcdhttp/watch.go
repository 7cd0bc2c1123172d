package etcdhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Event types.
const (
	EventPut    = "PUT" // the gateway omits it: an empty Type is a put
	EventDelete = "DELETE"
)

// Event is one change seen by a watch.
type Event struct {
	Type   string    `json:"type,omitempty"`
	Kv     KeyValue  `json:"kv"`
	PrevKv *KeyValue `json:"prev_kv,omitempty"`
}

// IsDelete reports whether e deleted its key.
func (e Event) IsDelete() bool { return e.Type == EventDelete }

// WatchRequest starts a watch on the key Key, or the keys in [Key,
// RangeEnd), from StartRevision (0: from now).
type WatchRequest struct {
	Key           []byte `json:"key,omitempty"`
	RangeEnd      []byte `json:"range_end,omitempty"`
	StartRevision int64  `json:"start_revision,string,omitempty"`
	PrevKV        bool   `json:"prev_kv,omitempty"`
}

// WatchResponse is one message of a watch stream.
type WatchResponse struct {
	Header          ResponseHeader `json:"header"`
	WatchID         int64          `json:"watch_id,string,omitempty"`
	Created         bool           `json:"created,omitempty"`
	Canceled        bool           `json:"canceled,omitempty"`
	CompactRevision int64          `json:"compact_revision,string,omitempty"`
	CancelReason    string         `json:"cancel_reason,omitempty"`
	Events          []Event        `json:"events,omitempty"`
}

// ErrWatchCanceled is returned (wrapped) by Watch and Recv when etcd
// cancels a watch; CompactedError says if it was for compaction.
var ErrWatchCanceled = errors.New("etcdhttp: watch canceled")

// CompactedError is returned when a watch starts at a compacted revision.
type CompactedError struct{ CompactRevision int64 }

func (e *CompactedError) Error() string {
	return fmt.Sprintf("etcd watch: revision compacted (oldest kept %d)", e.CompactRevision)
}

func (e *CompactedError) Unwrap() error { return ErrWatchCanceled }

// Watcher reads one watch stream. Recv must be called from one goroutine
// at a time; Close may be called from any.
type Watcher struct {
	resp   *http.Response
	dec    *json.Decoder
	cancel context.CancelFunc
}

// Watch starts a watch and waits until etcd has created it (so changes
// after Watch returns are seen). The watch ends when ctx ends, on Close or
// on a stream error.
func (c *Client) Watch(ctx context.Context, r WatchRequest) (*Watcher, error) {
	body, err := json.Marshal(struct {
		Create WatchRequest `json:"create_request"`
	}{r})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	// Bound the wait for creation; once created, the stream lives on.
	timer := time.AfterFunc(c.reqTimeout, cancel)
	resp, err := c.open(wctx, "/v3/watch", body, true)
	if err != nil {
		timer.Stop()
		cancel()
		return nil, err
	}
	w := &Watcher{resp: resp, dec: json.NewDecoder(resp.Body), cancel: cancel}
	first, err := w.recv()
	if !timer.Stop() && err == nil {
		err = context.DeadlineExceeded
	}
	if err == nil && !first.Created {
		err = errors.New("etcd watch: first message does not confirm creation")
	}
	if err != nil {
		w.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("etcd watch %q: %w", r.Key, err)
	}
	return w, nil
}

// Recv returns the next message with events (or a progress notification).
// It returns an error when the stream ends, etcd cancels the watch
// (*CompactedError for compaction) or the context ends.
func (w *Watcher) Recv() (*WatchResponse, error) {
	for {
		r, err := w.recv()
		if err != nil {
			return nil, err
		}
		if r.Created {
			continue
		}
		return r, nil
	}
}

func (w *Watcher) recv() (*WatchResponse, error) {
	r, err := decodeFrame[WatchResponse](w.dec)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("etcd watch: stream ended: %w", io.ErrUnexpectedEOF)
		}
		return nil, err
	}
	if r.Canceled {
		if r.CompactRevision > 0 {
			return nil, &CompactedError{CompactRevision: r.CompactRevision}
		}
		return nil, fmt.Errorf("%w: %s", ErrWatchCanceled, r.CancelReason)
	}
	return r, nil
}

// Close ends the watch.
func (w *Watcher) Close() {
	w.cancel()
	w.resp.Body.Close()
}

func asError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
