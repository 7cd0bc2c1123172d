package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

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
	bufs     *sync.Pool // of *[]byte of smallCopy bytes; nil: always splice
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

// copyData moves src's bytes to dst until EOF. It waits for data without
// holding a splice pipe (an idle flow costs its two sockets, no pipe fds),
// then splices exactly the queued bytes with io.CopyN between the two
// *net.TCPConn. With an idle timeout, deadlines are renewed on progress
// and the flow ends when neither direction moved for the timeout.
func (p *pipe) copyData(dst, src *net.TCPConn, bytes prometheus.Counter) error {
	rc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	for {
		if p.idle > 0 {
			deadline := time.Now().Add(p.idle)
			src.SetReadDeadline(deadline)
			dst.SetWriteDeadline(deadline)
		}
		avail, err := waitReadable(rc)
		var n int64
		switch {
		case err != nil:
		case avail == 0:
			return nil // EOF
		case avail < smallCopy && p.bufs != nil:
			n, err = p.copySmall(dst, src, avail)
		default:
			n, err = io.CopyN(dst, src, int64(avail))
		}
		if n > 0 {
			bytes.Add(float64(n))
			if p.idle > 0 {
				p.last.Store(time.Now().UnixNano())
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return nil
		case p.idle > 0 && errors.Is(err, os.ErrDeadlineExceeded) && !p.aborted.Load():
			if n > 0 || time.Since(time.Unix(0, p.last.Load())) < p.idle {
				continue
			}
			return errIdle
		default:
			return err
		}
	}
}

// smallCopy is the queued-byte count below which read+write through a
// pooled buffer replaces splice: the same two syscalls, without taking a
// pipe (and without creating one when the pool is empty).
const smallCopy = 16 << 10

// copySmall moves avail queued bytes from src to dst through a pooled buffer.
func (p *pipe) copySmall(dst, src *net.TCPConn, avail int) (int64, error) {
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	nr, err := src.Read((*bp)[:avail])
	if nr > 0 {
		nw, werr := dst.Write((*bp)[:nr])
		if werr != nil {
			return int64(nw), werr
		}
	}
	return int64(nr), err
}

// waitReadable blocks (in the runtime poller, honouring the read deadline)
// until the socket has queued bytes or reached EOF, and returns the number
// of queued bytes, 0 meaning EOF.
func waitReadable(rc syscall.RawConn) (int, error) {
	var avail int
	var serr error
	err := rc.Read(func(fd uintptr) bool {
		n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil {
			serr = err
			return true
		}
		if n > 0 {
			avail = n
			return true
		}
		var b [1]byte
		m, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			return false // nothing yet: wait for readability
		case err != nil:
			serr = os.NewSyscallError("recvfrom", err)
		default:
			avail = m // 0: EOF; >0: data arrived after the ioctl
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	return avail, serr
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
