package relay

// Stage: copy. A flow's bytes move between its two connections until both
// directions end (splice for bulk, a small buffer for the first bytes).

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// byteCounter counts relayed bytes: a role's counter (*metrics.Counter), or
// a flow's own (*flowBytes, size learning).
type byteCounter interface{ Add(float64) }

// pipe relays bytes between the two TCP connections of one flow: down is
// the connection towards the client, up the one towards the origin.
type pipe struct {
	down, up *net.TCPConn
	idle     time.Duration
	last     atomic.Int64 // unix nanoseconds of the last progress in either direction
	timer    atomic.Pointer[time.Timer]
	idled    atomic.Bool  // the idle timer ended the flow
	ended    atomic.Int32 // directions that reached EOF
	abortMu  sync.Once
	aborted  atomic.Bool
	upBytes  byteCounter
	dnBytes  byteCounter
	bufs     *sync.Pool // of *[]byte of smallCopy bytes; nil: always splice
	pipes    *pipePool  // splice pipes for bulk mode; nil: one per direction
	// abortOnEnd: both connections have SO_LINGER 0 (reset if the process
	// dies); a direction that ends normally clears it on its destination
	// before passing the EOF on (tproxy.go).
	abortOnEnd bool
	off        *offloader // nil: never offloaded (offload.go)
	pausing    atomic.Bool
	// bounded: the offload watcher bounded the buffers (offloader.bound);
	// saved holds what they were (a refused handover restores them).
	bounded bool
	saved   [2]legQueues
	log     func(string, ...any)
	copied  func() // if set: called when both directions ended, before the connections close (onpath.go)
}

// run copies both directions until both ended and returns the flow outcome.
// A clean EOF in one direction is passed on as a half-close; an error in
// either direction resets both connections so each peer learns promptly.
// With an idle timeout one timer per flow (not per-read deadlines) ends the
// flow when neither direction moved for the timeout.
func (p *pipe) run() outcome {
	if p.idle > 0 {
		p.last.Store(time.Now().UnixNano())
		p.timer.Store(time.AfterFunc(p.idle, p.checkIdle))
	}
	var watchWG sync.WaitGroup
	stopWatch := func() {}
	if p.off != nil {
		// The first sample before any copy: a flow that is due already (an
		// event loop relayed it past after_bytes before handing it over)
		// starts its drain bound now, or with offload.no_bound pauses
		// before its first read, every time, instead of whenever a watcher
		// goroutine happens to get there.
		var st watchState
		due, wait, ok := p.off.sample(p, &st)
		switch {
		case due:
			p.pause()
		case ok:
			ctx, cancel := context.WithCancel(context.Background())
			stopWatch = cancel
			watchWG.Add(1)
			go p.off.watch(ctx, p, &watchWG, wait, st)
		}
	}
	errc := make(chan error, 1)
	p.startUpstream(errc)
	errDown := p.copyHalf(p.down, p.up, p.dnBytes)
	errUp := <-errc
	if p.copied != nil {
		p.copied()
	}
	stopWatch()
	watchWG.Wait()
	if p.off != nil {
		errDown, errUp = p.off.afterCopies(p, errDown, errUp, p.log)
		if p.log != nil {
			p.log("flow copies ended", "down", errDown, "up", errUp)
		}
	}
	if t := p.timer.Load(); t != nil {
		t.Stop()
	}
	switch {
	case errors.Is(errDown, errOffloaded):
		return outcomeOffloaded
	case p.idled.Load():
		return outcomeIdle
	case errDown != nil || errUp != nil:
		return outcomeReset
	}
	p.down.Close()
	p.up.Close()
	return outcomeOK
}

// checkIdle runs when the idle timer fires: it re-arms the timer for the
// rest of the timeout after the last progress, or ends the flow.
func (p *pipe) checkIdle() {
	quiet := time.Since(time.Unix(0, p.last.Load()))
	if quiet >= p.idle && p.movable() {
		// Bytes wait that a copier can move now: it has not run (a
		// stalled process, the loops' twin: evloop's pollPending), the
		// flow is not idle.
		p.last.Store(time.Now().UnixNano())
		quiet = 0
	}
	if quiet < p.idle {
		if t := p.timer.Load(); t != nil {
			t.Reset(p.idle - quiet)
			return
		}
	}
	p.idled.Store(true)
	p.abort()
}

// startUpstream starts the client -> origin direction. It first reads what
// the client has queued without waiting: a client that already sent
// everything and half-closed (its request left with the handshake) needs
// no goroutine, its EOF is passed on here; otherwise copyUpstream runs,
// starting with the bytes read.
func (p *pipe) startUpstream(errc chan<- error) {
	if p.bufs == nil {
		go p.copyUpstream(errc, nil, 0)
		return
	}
	rc, err := p.down.SyscallConn()
	if err != nil {
		p.abort()
		errc <- err
		return
	}
	r := smallReader{bufs: p.bufs}
	r.fn = r.read
	r.nowait = true
	if err := rc.Read(r.fn); err != nil {
		r.err = err
	}
	switch {
	case p.pausedErr(r.err):
		// The offload watcher paused the flow before this first read (a
		// flow an event loop handed over may be due at once: its sockets
		// already acknowledged after_bytes). Nothing was read: the
		// direction is paused like any other (resetting the flow here cut
		// chained flows in the emulator).
		errc <- errPaused
	case r.err != nil:
		p.abort()
		errc <- r.err
	case r.eof:
		errc <- p.halfClose(p.up)
	default:
		go p.copyUpstream(errc, r.bp, r.n)
	}
}

// copyUpstream is the client -> origin direction, a named goroutine so
// stack dumps show what each flow goroutine does. bp holds n bytes already
// read from the client (nil: none).
func (p *pipe) copyUpstream(errc chan<- error, bp *[]byte, n int) {
	if bp != nil {
		_, err := p.up.Write((*bp)[:n])
		p.bufs.Put(bp)
		if err != nil {
			p.abort()
			errc <- err
			return
		}
		p.progress(p.upBytes, int64(n))
	}
	errc <- p.copyHalf(p.up, p.down, p.upBytes)
}

// copyHalf copies src to dst, then half-closes dst (CloseWrite passes the
// EOF on). On error it aborts the flow.
func (p *pipe) copyHalf(dst, src *net.TCPConn, bytes byteCounter) error {
	err := p.copyData(dst, src, bytes)
	if p.pausedErr(err) {
		return errPaused
	}
	if err != nil {
		if p.log != nil && !p.aborted.Load() {
			p.log("copy failed, resetting the flow", "err", err, "pausing", p.pausing.Load())
		}
		p.abort()
		return err
	}
	return p.halfClose(dst)
}

// halfClose passes an EOF on to dst. The direction that ends second
// leaves it to the close that follows at once (a FIN all the same, one
// syscall less).
func (p *pipe) halfClose(dst *net.TCPConn) error {
	if p.abortOnEnd {
		dst.SetLinger(-1)
	}
	if p.ended.Add(1) == 2 {
		return nil
	}
	if err := dst.CloseWrite(); err != nil && !p.aborted.Load() {
		p.abort()
		return err
	}
	return nil
}

// copyData moves src's bytes to dst until EOF.
//
// A flow starts in small mode: each wait for data is one read(2) into a
// pooled buffer, done inside the runtime poller's callback (the buffer is
// taken only once data is there, so an idle flow holds none), then one
// write. A read that fills the buffer switches the direction to bulk mode
// for good (spliceBulk: splice(2) through a pooled pipe, given back before
// each wait, so an idle bulk flow holds no pipe either).
func (p *pipe) copyData(dst, src *net.TCPConn, bytes byteCounter) error {
	rc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	r := smallReader{bufs: p.bufs}
	r.fn = r.read
	for bulk := p.bufs == nil; !bulk; {
		bp, nr, err := r.next(rc)
		if err != nil {
			return err
		}
		if nr == 0 {
			return nil // EOF
		}
		_, err = dst.Write((*bp)[:nr])
		bulk = nr == len(*bp)
		p.bufs.Put(bp)
		if err != nil {
			return err
		}
		p.progress(bytes, int64(nr))
	}
	return p.spliceBulk(dst, src, bytes)
}

// progress counts n relayed bytes and, with an idle timeout, notes the time.
func (p *pipe) progress(bytes byteCounter, n int64) {
	if n <= 0 {
		return
	}
	bytes.Add(float64(n))
	if p.idle > 0 {
		p.last.Store(time.Now().UnixNano())
	}
}

// smallReader reads whatever a socket has queued into a pooled buffer from
// inside the runtime poller's callback. fn is its read method, bound once
// per direction so waiting allocates nothing.
type smallReader struct {
	bufs   *sync.Pool
	fn     func(fd uintptr) bool
	nowait bool // do not wait for data: bp == nil && !eof means none queued
	bp     *[]byte
	n      int
	eof    bool
	err    error
}

// next waits until src has data or reached EOF and returns a pooled buffer
// holding n bytes (n == 0: EOF, no buffer). The caller puts the buffer back.
func (r *smallReader) next(rc syscall.RawConn) (*[]byte, int, error) {
	r.bp, r.n, r.eof, r.err = nil, 0, false, nil
	if err := rc.Read(r.fn); err != nil {
		if r.bp != nil {
			r.bufs.Put(r.bp)
		}
		return nil, 0, err
	}
	return r.bp, r.n, r.err
}

func (r *smallReader) read(fd uintptr) bool {
	b := r.bufs.Get().(*[]byte)
	for {
		n, err := unix.Read(int(fd), *b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			r.bufs.Put(b)
			return r.nowait // nothing yet: wait for readability
		case err != nil:
			r.bufs.Put(b)
			r.err = os.NewSyscallError("read", err)
		case n == 0:
			r.bufs.Put(b)
			r.eof = true
		default:
			r.bp, r.n = b, n
		}
		return true
	}
}

// smallCopy is the size of the pooled buffers of small mode.
const smallCopy = 16 << 10

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

// movable reports whether a direction of the flow has bytes queued at its
// source and room at its destination, i.e. a copy that has not run yet
// could move them now (a destination that does not drain, a stuck writer,
// is idle).
func (p *pipe) movable() bool {
	rd, err1 := p.down.SyscallConn()
	ru, err2 := p.up.SyscallConn()
	if err1 != nil || err2 != nil {
		return false
	}
	ok := false
	rd.Control(func(d uintptr) { // the fds stay open while Control runs
		ru.Control(func(u uintptr) {
			fds := []unix.PollFd{{Fd: int32(d), Events: unix.POLLOUT}, {Fd: int32(u), Events: unix.POLLOUT}}
			if n, err := unix.Poll(fds, 0); err != nil || n < 0 {
				return
			}
			var b [1]byte
			data := func(fd uintptr) bool {
				m, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
				return err == nil && m > 0
			}
			ok = fds[1].Revents&unix.POLLOUT != 0 && data(d) || fds[0].Revents&unix.POLLOUT != 0 && data(u)
		})
	})
	return ok
}

// deadlineReader reads c, whose read deadline is set, as if the deadline
// were checked against the bytes' arrival: a read that fails on its
// deadline while bytes are queued returns them. Go reports a deadline that
// passed while the process was not running (a stalled, loaded machine)
// without reading, even when the bytes came in time (3 of 20 reads in a
// process stopped across a 200 ms deadline, its bytes queued at 100 ms);
// the event loops check the sockets the same way before a deadline ends a
// flow (evloop: pollPending).
type deadlineReader struct{ c *net.TCPConn }

func (r deadlineReader) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		if m := readQueued(r.c, p); m > 0 {
			return m, nil
		}
	}
	return n, err
}

// readQueued reads the bytes already queued on c into p, without waiting
// and whatever c's deadline (0: none).
func readQueued(c *net.TCPConn, p []byte) int {
	rc, err := c.SyscallConn()
	if err != nil || len(p) == 0 {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) { // not Read: it fails at once past the deadline
		m, _, err := unix.Recvfrom(int(fd), p, unix.MSG_DONTWAIT)
		if err == nil && m > 0 {
			n = m
		}
	})
	return n
}

// peekQueued is waitReadable for a socket whose read deadline passed: the
// bytes queued now (0 and nil: EOF), or os.ErrDeadlineExceeded when none
// are (see deadlineReader).
func peekQueued(rc syscall.RawConn) (int, error) {
	n, err := 0, error(os.ErrDeadlineExceeded)
	rc.Control(func(fd uintptr) {
		var b [1]byte
		m, _, e := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if e == nil {
			n, err = m, nil
			if m > 0 {
				if q, e := unix.IoctlGetInt(int(fd), unix.SIOCINQ); e == nil && q > 0 {
					n = q
				}
			}
		}
	})
	return n, err
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

// relay moves the flow's bytes until both directions end; down is the
// accepted connection, up the dialed one (closed and untracked here). An
// InP flow that completed is recorded under its size-learning keys, with
// before bytes delivered to the client before this copy phase (by the
// event loop that handed the flow over).
func (s *Server) relay(role role, down, up *net.TCPConn, learn sizeKeys, before int64) {
	defer s.untrack(up)
	rm := s.m.roles[role]
	rm.active.Inc()
	defer rm.active.Dec()
	p := s.newPipe(rm, down, up)
	p.off = s.offload.Load()
	p.log = s.log.Debug
	var delivered *flowBytes
	if learn.base != "" && s.sizes != nil {
		delivered = &flowBytes{Counter: rm.down}
		delivered.n.Store(before)
		p.dnBytes = delivered
	}
	outcome := s.runPipe(p)
	if delivered != nil && outcome == outcomeOK {
		s.sizes.observe(learn, delivered.n.Load())
	}
	s.endFlow(role, outcome)
}

// newPipe is the copy of a flow between down and up, its bytes counted
// under its role's rm.
func (s *Server) newPipe(rm *roleMetrics, down, up *net.TCPConn) *pipe {
	return &pipe{down: down, up: up, idle: s.flows.idle, upBytes: rm.up, dnBytes: rm.down, bufs: &s.flows.bufs, pipes: s.flows.pipes}
}

// runPipe runs p to its outcome: aborted, whatever the copy saw, when a
// forced stop ended it.
func (s *Server) runPipe(p *pipe) outcome {
	o := p.run()
	if s.flows.forcing.Load() && o != outcomeOK {
		o = outcomeAborted
	}
	return o
}

func (s *Server) endFlow(r role, o outcome) {
	s.m.roles[r].flow(o).Inc()
}
