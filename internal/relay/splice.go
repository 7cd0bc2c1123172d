package relay

// Stage: copy, bulk mode. A direction that outgrew the small buffers moves
// its bytes socket -> pipe -> socket with splice(2), called from inside the
// runtime poller's callbacks.

import (
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// splicePipeSize is the capacity asked for each splice pipe (F_SETPIPE_SZ,
// the default /proc/sys/fs/pipe-max-size); the kernel's default is 64 KiB.
const splicePipeSize = 1 << 20

// spliceFlags: never sleep in the kernel (the sockets are non-blocking
// anyway; the pipe must not block either), move pages where possible.
const spliceFlags = unix.SPLICE_F_NONBLOCK | unix.SPLICE_F_MOVE

// splicePipe is a pipe that carries a bulk direction's bytes; n of them
// are in it.
type splicePipe struct {
	r, w int
	n    int
}

func newSplicePipe() (*splicePipe, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	// A smaller pipe (pipe-max-size lowered, or the user's pipe quota
	// reached) still works, with more splices per byte.
	unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, splicePipeSize)
	return &splicePipe{r: fds[0], w: fds[1]}, nil
}

func (sp *splicePipe) close() {
	unix.Close(sp.r)
	unix.Close(sp.w)
}

// pipePoolSize is how many empty splice pipes a daemon keeps for its bulk
// directions (each two fds and a 1 MiB pipe's ring of 256 slots).
const pipePoolSize = 16

// pipePool keeps a few empty splice pipes for the bulk directions of all
// flows: a direction holds one only while it moves bytes and gives it back
// before it waits for more, so an idle bulk flow holds no pipe.
type pipePool struct{ free chan *splicePipe }

func newPipePool(n int) *pipePool { return &pipePool{free: make(chan *splicePipe, n)} }

// get returns an empty pipe (pp may be nil: a new pipe).
func (pp *pipePool) get() (*splicePipe, error) {
	if pp != nil {
		select {
		case sp := <-pp.free:
			return sp, nil
		default:
		}
	}
	return newSplicePipe()
}

// put takes back an empty pipe, or closes it when the pool is full.
func (pp *pipePool) put(sp *splicePipe) {
	if pp != nil && sp.n == 0 {
		select {
		case pp.free <- sp:
			return
		default:
		}
	}
	sp.close()
}

// drain closes every pooled pipe.
func (pp *pipePool) drain() {
	for {
		select {
		case sp := <-pp.free:
			sp.close()
		default:
			return
		}
	}
}

// splicer moves one bulk direction's bytes from src to dst. Its fill and
// pump methods are bound once, so waiting allocates nothing.
//
// The splices are raw system calls: each is non-blocking and returns
// after at most a pipe's worth of bytes, and a raw call does not hand the
// P to the runtime and back (entersyscall/exitsyscall) or wake sysmon,
// which a bulk flow that alternates between the poller and splice
// otherwise keeps at its 20 us tick (profile: about 7% of the relay's
// CPU in sysmon's usleep, issue 18).
type splicer struct {
	pool   *pipePool
	sp     *splicePipe
	eof    bool
	err    error
	fillFn func(fd uintptr) bool
	pumpFn func(fd uintptr) bool
}

// fill splices what src has queued into the pipe. Called from the poller
// (RawConn.Read): it returns false to wait for readability, having given
// the empty pipe back first.
func (s *splicer) fill(fd uintptr) bool {
	if s.sp == nil {
		sp, err := s.pool.get()
		if err != nil {
			s.err = err
			return true
		}
		s.sp = sp
	}
	for {
		n, _, e := s.call(fd, uintptr(s.sp.w), splicePipeSize)
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			if s.sp.n > 0 {
				return true // bytes from an earlier call: pump them first
			}
			s.pool.put(s.sp)
			s.sp = nil
			return false
		case e != 0:
			s.err = os.NewSyscallError("splice", e)
		case n == 0:
			s.eof = true
		default:
			s.sp.n += int(n)
		}
		return true
	}
}

// call is one splice of up to n bytes from in to out.
func (s *splicer) call(in, out, n uintptr) (uintptr, uintptr, unix.Errno) {
	return unix.RawSyscall6(unix.SYS_SPLICE, in, 0, out, 0, n, spliceFlags)
}

// pump splices the pipe's bytes to dst. Called from the poller
// (RawConn.Write): it returns false to wait for writability.
func (s *splicer) pump(fd uintptr) bool {
	for s.sp.n > 0 {
		n, _, e := s.call(uintptr(s.sp.r), fd, uintptr(s.sp.n))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return false
		case e != 0:
			s.err = os.NewSyscallError("splice", e)
			return true
		case n == 0:
			// Never with bytes in the pipe; do not spin if it happens.
			s.err = io.ErrNoProgress
			return true
		}
		s.sp.n -= int(n)
	}
	return true
}

// spliceBulk moves src's bytes to dst until EOF. Bytes taken from src are
// always passed on before it returns: an error reading src (a deadline
// that paused the flow for an offload handover) waits for the pipe's bytes
// to reach dst, so the handover finds them in dst's send queue.
func (p *pipe) spliceBulk(dst, src *net.TCPConn, bytes byteCounter) error {
	rc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	wc, err := dst.SyscallConn()
	if err != nil {
		return err
	}
	s := &splicer{pool: p.pipes}
	s.fillFn, s.pumpFn = s.fill, s.pump
	defer func() {
		if s.sp != nil {
			s.pool.put(s.sp)
		}
	}()
	for {
		rerr := rc.Read(s.fillFn)
		if s.sp != nil && s.sp.n > 0 {
			n := s.sp.n
			werr := wc.Write(s.pumpFn)
			p.progress(bytes, int64(n-s.sp.n))
			if werr == nil {
				werr = s.err
			}
			if werr != nil {
				s.sp.close() // bytes may be left in it
				s.sp = nil
				return werr
			}
		}
		switch {
		case rerr != nil:
			return rerr
		case s.err != nil:
			return s.err
		case s.eof:
			return nil
		}
	}
}
