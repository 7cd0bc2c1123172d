package transfer

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
)

// DialFunc opens a TCP connection; it lets a Client start from a network
// namespace (for example the emulator's Dial).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Client fetches objects from one first hop. It is not safe for concurrent
// use: one Client measures one sequence of transfers.
type Client struct {
	// Addr is the host:port the client connects to.
	Addr string
	// Host is sent as the Host header; empty means Addr.
	Host string
	// Dial opens connections; nil means a net.Dialer.
	Dial DialFunc
	// Reuse keeps the connection open between fetches (warm client side);
	// otherwise every fetch opens and closes its own connection (cold).
	Reuse bool
	// Header adds request headers.
	Header http.Header
	// MarkAt, when positive, makes a fetch record in Result.Mark when the
	// body's first MarkAt bytes had arrived (a rate over the rest of the
	// body is then (Size - MarkAt) / (Total - Mark)).
	MarkAt int64

	conn net.Conn
	br   *bufio.Reader
	tr   *timedReader
	sums sumCache
}

// Result is the measurement of one fetch.
type Result struct {
	Size      int64         // bytes of body received
	Reused    bool          // the connection was kept from an earlier fetch
	Connect   time.Duration // time to open the connection; 0 when reused
	FirstByte time.Duration // from the start of the fetch to the first response byte
	Total     time.Duration // from the start of the fetch to the last body byte
	Mark      time.Duration // from the start to the body's Client.MarkAt-th byte; 0: not reached or not asked
	Header    http.Header   // response header
}

// Object fetches GET /obj?size=N&seed=S and checks the body against the
// origin's stream for that seed; a short or corrupted body is an error.
func (c *Client) Object(ctx context.Context, size int64, seed uint64) (Result, error) {
	want := c.sums.get(seed, size)
	target := "/obj?size=" + strconv.FormatInt(size, 10) + "&seed=" + strconv.FormatUint(seed, 10)
	res, sum, err := c.get(ctx, target)
	if err != nil {
		return res, err
	}
	if res.Size != size {
		return res, fmt.Errorf("fetch %s via %s: got %d bytes; want %d", target, c.Addr, res.Size, size)
	}
	if sum != want {
		return res, fmt.Errorf("fetch %s via %s: body differs from the origin's stream (sha256 mismatch)", target, c.Addr)
	}
	return res, nil
}

// Get fetches target (an origin-form request target such as "/obj?size=10")
// and discards the body, returning the measurement. A non-200 status is an
// error.
func (c *Client) Get(ctx context.Context, target string) (Result, error) {
	res, _, err := c.get(ctx, target)
	return res, err
}

// Close closes a kept connection.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn, c.br, c.tr = nil, nil, nil
	return err
}

func (c *Client) get(ctx context.Context, target string) (res Result, sum [32]byte, err error) {
	start := time.Now()
	if c.conn == nil || !c.Reuse {
		if err := c.Close(); err != nil {
			return res, sum, fmt.Errorf("close previous connection to %s: %w", c.Addr, err)
		}
		dial := c.Dial
		if dial == nil {
			var d net.Dialer
			dial = d.DialContext
		}
		conn, err := dial(ctx, "tcp", c.Addr)
		if err != nil {
			return res, sum, fmt.Errorf("dial %s: %w", c.Addr, err)
		}
		res.Connect = time.Since(start)
		c.conn = conn
		c.tr = &timedReader{r: conn}
		c.br = bufio.NewReaderSize(c.tr, 64<<10)
	} else {
		res.Reused = true
	}
	conn := c.conn
	ok := false
	defer func() {
		if !ok || !c.Reuse {
			c.Close()
		}
	}()
	// Cancel blocking I/O when ctx ends.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	conn.SetDeadline(time.Time{})

	host := c.Host
	if host == "" {
		host = c.Addr
	}
	req := "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: mosto-transfer\r\nAccept: */*\r\n"
	for k, vs := range c.Header {
		for _, v := range vs {
			req += k + ": " + v + "\r\n"
		}
	}
	if !c.Reuse {
		req += "Connection: close\r\n"
	}
	req += "\r\n"
	c.tr.first = time.Time{}
	if _, err := io.WriteString(conn, req); err != nil {
		return res, sum, c.ioErr(ctx, "send request", err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return res, sum, c.ioErr(ctx, "read response header", err)
	}
	res.FirstByte = c.tr.first.Sub(start)
	res.Header = resp.Header
	h := &markWriter{w: sha256.New(), at: c.MarkAt}
	n, err := io.CopyBuffer(h, resp.Body, make([]byte, 64<<10))
	res.Total = time.Since(start)
	if !h.mark.IsZero() {
		res.Mark = h.mark.Sub(start)
	}
	res.Size = n
	resp.Body.Close()
	if err != nil {
		return res, sum, c.ioErr(ctx, "read body", err)
	}
	if resp.StatusCode != http.StatusOK {
		return res, sum, fmt.Errorf("fetch %s via %s: status %s", target, c.Addr, resp.Status)
	}
	if resp.Close {
		c.Close()
	}
	h.w.Sum(sum[:0])
	ok = true
	return res, sum, nil
}

func (c *Client) ioErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s via %s: %w", what, c.Addr, ctx.Err())
	}
	return fmt.Errorf("%s via %s: %w", what, c.Addr, err)
}

// markWriter passes writes to w and records when the bytes written reached
// at (at > 0).
type markWriter struct {
	w    hash.Hash
	at   int64
	n    int64
	mark time.Time
}

func (m *markWriter) Write(p []byte) (int, error) {
	m.n += int64(len(p))
	if m.at > 0 && m.mark.IsZero() && m.n >= m.at {
		m.mark = time.Now()
	}
	return m.w.Write(p)
}

// timedReader records when the first byte after a reset arrived.
type timedReader struct {
	r     io.Reader
	first time.Time
}

func (t *timedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 && t.first.IsZero() {
		t.first = time.Now()
	}
	return n, err
}

// sumCache memoizes origin.Sum, which costs a pass over the object.
type sumCache struct {
	mu sync.Mutex
	m  map[[2]uint64][32]byte
}

func (s *sumCache) get(seed uint64, size int64) [32]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]uint64{seed, uint64(size)}
	if v, ok := s.m[k]; ok {
		return v
	}
	if s.m == nil {
		s.m = make(map[[2]uint64][32]byte)
	}
	v := origin.Sum(seed, size)
	s.m[k] = v
	return v
}
