package proxybench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// sink is the origin of every measurement: it reads each connection to
// EOF, answers with the 8-byte big-endian count of bytes it read, and
// closes. It counts connections that delivered at least one byte, so the
// idle-flow test knows when every flow is established end to end.
type sink struct {
	ln      net.Listener
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	started atomic.Int64 // connections whose first byte arrived
	closed  bool
}

func newSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	s := &sink{ln: ln, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func (s *sink) addr() string { return s.ln.Addr().String() }

func (s *sink) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *sink) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	buf := make([]byte, 4<<10) // small: the idle-flow test holds thousands
	var n int64
	for {
		k, err := c.Read(buf)
		if k > 0 && n == 0 {
			s.started.Add(1)
		}
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return
		}
		if n > 1<<20 && len(buf) < 1<<20 {
			buf = make([]byte, 1<<20) // bulk flow: fewer, larger reads
		}
	}
	var ack [8]byte
	binary.BigEndian.PutUint64(ack[:], uint64(n))
	c.Write(ack[:])
}

// close stops accepting, closes every open connection and waits for all
// goroutines.
func (s *sink) close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	s.wg.Wait()
}

// transfer sends n bytes to addr, half-closes, and waits for the sink's
// count. It returns the time from dial to the acknowledgement.
func transfer(ctx context.Context, addr string, n int64, buf []byte) (time.Duration, error) {
	start := time.Now()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	for left := n; left > 0; {
		b := buf
		if int64(len(b)) > left {
			b = b[:left]
		}
		k, err := c.Write(b)
		left -= int64(k)
		if err != nil {
			return 0, fmt.Errorf("write to %s: %w", addr, err)
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, fmt.Errorf("close write: %w", err)
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return 0, fmt.Errorf("read count from %s: %w", addr, err)
	}
	if got := int64(binary.BigEndian.Uint64(ack[:])); got != n {
		return 0, fmt.Errorf("sink read %d bytes; sent %d", got, n)
	}
	return time.Since(start), nil
}

// connRate runs parallel clients that each repeat: dial, send payload,
// half-close, read the count, close; for d. It returns completed and failed
// connection counts.
func connRate(ctx context.Context, addr string, parallel, payload int, d time.Duration) (ok, failed int64, sample error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var okN, failN atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	msg := make([]byte, payload)
	for i := 0; i < parallel; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			shortClient(ctx, addr, msg, &okN, &failN, &firstErr)
		}()
	}
	wg.Wait()
	sample, _ = firstErr.Load().(error)
	return okN.Load(), failN.Load(), sample
}

func shortClient(ctx context.Context, addr string, msg []byte, ok, failed *atomic.Int64, firstErr *atomic.Value) {
	// The dial's socket deadline can fire before ctx is marked done, so
	// the end of the test is judged by the clock, not by ctx.Err alone.
	end, _ := ctx.Deadline()
	for ctx.Err() == nil && time.Now().Before(end) {
		if err := shortConn(ctx, addr, msg); err != nil {
			if ctx.Err() == nil && time.Now().Before(end) {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			continue
		}
		ok.Add(1)
	}
}

func shortConn(ctx context.Context, addr string, msg []byte) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl.Add(5 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint64(ack[:]) != uint64(len(msg)) {
		return errors.New("short count")
	}
	return nil
}

// openIdle opens n connections to addr, each sending one byte and then
// staying open, and waits until the sink has seen the first byte of every
// one of them (so each flow is established through the relay). The caller
// closes the returned connections.
func openIdle(ctx context.Context, addr string, n int, s *sink, timeout time.Duration) ([]net.Conn, error) {
	base := s.started.Load()
	conns := make([]net.Conn, 0, n)
	var d net.Dialer
	for i := 0; i < n; i++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return conns, fmt.Errorf("idle flow %d: dial: %w", i, err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte{1}); err != nil {
			return conns, fmt.Errorf("idle flow %d: write: %w", i, err)
		}
	}
	deadline := time.Now().Add(timeout)
	for s.started.Load()-base < int64(n) {
		if time.Now().After(deadline) {
			return conns, fmt.Errorf("only %d of %d idle flows reached the sink in %v", s.started.Load()-base, n, timeout)
		}
		select {
		case <-ctx.Done():
			return conns, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return conns, nil
}
