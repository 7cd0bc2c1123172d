package store

import (
	"context"
	"sync"
)

// Hub fans change notifications out to watchers in one process. A watcher
// that is slow sees the union of the changes it missed in one notification,
// never a blocked publisher. The zero Hub is ready to use.
type Hub struct {
	mu   sync.Mutex
	subs map[chan Change]struct{}
}

// Subscribe returns a channel that receives coalesced changes until ctx is
// done; it is then closed.
func (h *Hub) Subscribe(ctx context.Context) <-chan Change {
	ch := make(chan Change, 1)
	h.mu.Lock()
	if h.subs == nil {
		h.subs = make(map[chan Change]struct{})
	}
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		close(ch)
		h.mu.Unlock()
	})
	return ch
}

// Publish notifies every watcher of c.
func (h *Hub) Publish(c Change) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		SendMerged(ch, c)
	}
}

// SendMerged puts c into ch (capacity 1) without blocking: a change still
// pending in ch is merged into c.
func SendMerged(ch chan Change, c Change) {
	for {
		select {
		case ch <- c:
			return
		default:
		}
		select {
		case old := <-ch:
			c |= old
		default:
		}
	}
}
