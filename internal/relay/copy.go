package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// spliceChunk bounds one io.CopyN call when an idle timeout is set, so the
// deadlines are renewed while data flows. Each call still splices.
const spliceChunk = 4 << 20

var errIdle = errors.New("relay: idle timeout")

// pipe relays bytes between the two TCP connections of one flow: down is
// the connection towards the client, up the one towards the origin.
type pipe struct {
	down, up *net.TCPConn
	idle     time.Duration
	last     atomic.Int64 // unix nanoseconds of the last progress in either direction
	abortMu  sync.Once
	aborted  atomic.Bool
	upBytes  prometheus.Counter
	dnBytes  prometheus.Counter
}

// run copies both directions until both ended and returns the flow outcome.
// A clean EOF in one direction is passed on as a half-close; an error in
// either direction resets both connections so each peer learns promptly.
func (p *pipe) run() string {
	p.last.Store(time.Now().UnixNano())
	errc := make(chan error, 1)
	go p.copyUpstream(errc)
	errDown := p.copyHalf(p.down, p.up, p.dnBytes)
	errUp := <-errc
	switch {
	case errors.Is(errDown, errIdle) || errors.Is(errUp, errIdle):
		return outcomeIdle
	case errDown != nil || errUp != nil:
		return outcomeReset
	}
	p.down.Close()
	p.up.Close()
	return outcomeOK
}

// copyUpstream is the client -> origin direction, a named goroutine so
// stack dumps show what each flow goroutine does.
func (p *pipe) copyUpstream(errc chan<- error) {
	errc <- p.copyHalf(p.up, p.down, p.upBytes)
}

// copyHalf copies src to dst (spliced), then half-closes: CloseWrite on dst
// passes the EOF on, CloseRead on src. On error it aborts the flow.
func (p *pipe) copyHalf(dst, src *net.TCPConn, bytes prometheus.Counter) error {
	err := p.copyData(dst, src, bytes)
	if err != nil {
		p.abort()
		return err
	}
	if err := dst.CloseWrite(); err != nil && !p.aborted.Load() {
		p.abort()
		return err
	}
	src.CloseRead()
	return nil
}

func (p *pipe) copyData(dst, src *net.TCPConn, bytes prometheus.Counter) error {
	if p.idle <= 0 {
		n, err := io.Copy(dst, src)
		bytes.Add(float64(n))
		return err
	}
	for {
		deadline := time.Now().Add(p.idle)
		src.SetReadDeadline(deadline)
		dst.SetWriteDeadline(deadline)
		n, err := io.CopyN(dst, src, spliceChunk)
		if n > 0 {
			bytes.Add(float64(n))
			p.last.Store(time.Now().UnixNano())
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded) && !p.aborted.Load():
			if n > 0 || time.Since(time.Unix(0, p.last.Load())) < p.idle {
				continue
			}
			return errIdle
		default:
			return err
		}
	}
}

// abort resets both connections (SO_LINGER 0 + close sends RST), which also
// ends the other direction's copy.
func (p *pipe) abort() {
	p.abortMu.Do(func() {
		p.aborted.Store(true)
		resetClose(p.down)
		resetClose(p.up)
	})
}

// resetClose closes c with an RST instead of a FIN.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}
