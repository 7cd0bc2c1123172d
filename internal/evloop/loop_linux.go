package evloop

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Loops is a set of event loops sharing listeners.
type Loops struct {
	cfg   Config
	h     Handler
	log   *slog.Logger
	loops []*loop
	wg    sync.WaitGroup
	flows atomic.Int64

	mu     sync.Mutex
	lnFDs  []int // evloop's duplicates of the listening sockets
	closed bool
}

// Start starts cfg.Loops loops serving h. log may be nil.
func Start(cfg Config, h Handler, log *slog.Logger) (*Loops, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ls := &Loops{cfg: cfg.withDefaults(), h: h, log: log}
	for i := 0; i < ls.cfg.Loops; i++ {
		l, err := newLoop(ls)
		if err != nil {
			ls.Close()
			return nil, err
		}
		ls.loops = append(ls.loops, l)
		ls.wg.Add(1)
		go l.run()
	}
	return ls, nil
}

// Listen makes every loop accept connections from the listening socket
// lfd (nonblocking). The loops use a duplicate of lfd: the caller keeps
// and eventually closes its own. tag is passed to Handler.Open.
func (ls *Loops) Listen(lfd int, tag any) error {
	fd, err := unix.FcntlInt(uintptr(lfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dup listener: %w", err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		unix.Close(fd)
		return errors.New("evloop: closed")
	}
	ls.lnFDs = append(ls.lnFDs, fd)
	var emu sync.Mutex
	var ferr error
	ls.each(func(l *loop) {
		l.lns = append(l.lns, lnEntry{fd: fd, tag: tag})
		if err := l.listenOn(len(l.lns) - 1); err != nil {
			emu.Lock()
			ferr = err
			emu.Unlock()
		}
	})
	return ferr
}

// ListenEach is Listen with one listening socket per loop: loop i accepts
// from fds[i] alone (len(fds) must be the number of loops). Meant for
// SO_REUSEPORT sockets bound to one address, among which the kernel spreads
// new connections, so each connection wakes one loop. A socket shared by
// every loop (Listen) wakes them all: EPOLLEXCLUSIVE only limits the wakeup
// to one epoll descriptor that has a thread waiting in it, and the loops'
// descriptors have none (the runtime's poller waits on them), so every loop
// takes the event and all but one find nothing to accept. The loops use
// duplicates of fds; the caller keeps and eventually closes its own.
func (ls *Loops) ListenEach(fds []int, tag any) error {
	if len(fds) != len(ls.loops) {
		return fmt.Errorf("evloop: %d listening sockets for %d loops", len(fds), len(ls.loops))
	}
	dups := make([]int, 0, len(fds))
	for _, lfd := range fds {
		fd, err := unix.FcntlInt(uintptr(lfd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, d := range dups {
				unix.Close(d)
			}
			return fmt.Errorf("dup listener: %w", err)
		}
		dups = append(dups, fd)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		for _, d := range dups {
			unix.Close(d)
		}
		return errors.New("evloop: closed")
	}
	ls.lnFDs = append(ls.lnFDs, dups...)
	own := make(map[*loop]int, len(dups))
	for i, l := range ls.loops {
		own[l] = dups[i]
	}
	var emu sync.Mutex
	var ferr error
	ls.each(func(l *loop) {
		l.lns = append(l.lns, lnEntry{fd: own[l], tag: tag})
		if err := l.listenOn(len(l.lns) - 1); err != nil {
			emu.Lock()
			ferr = err
			emu.Unlock()
		}
	})
	return ferr
}

// listenOn registers listener i of the loop for events.
func (l *loop) listenOn(i int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(-2 - i)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.lns[i].fd, &ev); err != nil {
		return fmt.Errorf("epoll add listener: %w", err)
	}
	l.lns[i].on = true
	return nil
}

// StopAccepting stops every loop from accepting and closes evloop's copies
// of the listening sockets. Open flows go on.
func (ls *Loops) StopAccepting() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.each(func(l *loop) {
		for i := range l.lns {
			unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, l.lns[i].fd, nil)
		}
		l.lns = nil
	})
	for _, fd := range ls.lnFDs {
		unix.Close(fd)
	}
	ls.lnFDs = nil
}

// ResetAll ends every open flow with a reset (Outcome Aborted).
func (ls *Loops) ResetAll() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.each(func(l *loop) { l.resetAll(Aborted) })
}

// Flows returns the number of flows open in the loops.
func (ls *Loops) Flows() int { return int(ls.flows.Load()) }

// Close stops accepting, resets flows still open (Aborted) and stops the
// loops. It waits for their threads to end.
func (ls *Loops) Close() {
	ls.StopAccepting()
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return
	}
	ls.closed = true
	ls.mu.Unlock()
	for _, l := range ls.loops {
		l.post(func() {
			l.resetAll(Aborted)
			l.stop = true
		})
	}
	ls.wg.Wait()
	for _, l := range ls.loops {
		l.ep.Close()
		unix.Close(l.evfd)
	}
}

// each runs fn on every loop's thread and waits for all of them; after
// Close it does nothing (the loops are gone). Callers hold ls.mu.
func (ls *Loops) each(fn func(l *loop)) {
	if ls.closed {
		return
	}
	var wg sync.WaitGroup
	for _, l := range ls.loops {
		wg.Add(1)
		l.post(func() {
			defer wg.Done()
			fn(l)
		})
	}
	wg.Wait()
}

type lnEntry struct {
	fd          int
	tag         any
	on          bool  // registered for events (off while paused)
	pausedUntil int64 // unix ns: accept paused after running out of descriptors
}

// Readiness bits of a socket, as last reported by epoll.
const (
	canRead  = 1 << iota // data, EOF or an error to read
	canWrite             // room to write (or an error)
	peerShut             // the peer's FIN arrived (EPOLLRDHUP)
)

// side indexes: the client's socket and the upstream socket; direction d
// reads from side d and writes to side 1-d.
const (
	down = 0
	up   = 1
)

// flow is one client connection and its upstream.
type flow struct {
	slot  int32
	gen   int32
	state any
	fd    [2]int
	conn  io.Closer // owns fd[up] when set
	ready [2]uint8
	d     [2]half
	// prefix: bytes at the start of d[down]'s buffer that are not client
	// bytes (a header), still to be written upstream.
	prefix     int
	connecting bool
	retry      bool
	written    bool // a byte reached the upstream socket
	handover   bool
	ended      bool // freed: the loop is done with it
	// fastOpen: the upstream is a Fast Open socket whose handshake is not
	// confirmed yet; sent bytes of d[down] (from off) were written to it
	// but are kept for a retry.
	fastOpen bool
	sent     int
	// waiting: no upstream yet, until the client's first bytes arrive or
	// waitUntil (unix ns) passes (Upstream.Wait).
	waiting   bool
	waitUntil int64
	// head: the wait is for a head (Upstream.Head); seen is how many
	// client bytes Dial saw when it last asked for more.
	head       bool
	seen       int
	connStart  int64
	st         Stats
	last       int64
	q          *queue
	prev, next *flow
}

// half is one direction of a flow.
type half struct {
	buf      []byte // nil while nothing is in flight
	off, end int    // pending bytes: buf[off:end]
	eof      bool   // the source reached EOF
	shut     bool   // the EOF was passed on (or the direction is done)
}

func (h *half) drained() bool { return h.off == h.end }
func (h *half) done() bool    { return h.eof && h.drained() && h.shut }

// queue is a list of flows in deadline order (oldest first).
type queue struct{ head, tail *flow }

// waitQueue holds the flows waiting for their client's first bytes for the
// same duration d, so it is in deadline order.
type waitQueue struct {
	d int64
	queue
}

func (q *queue) push(f *flow) {
	f.q, f.prev, f.next = q, q.tail, nil
	if q.tail != nil {
		q.tail.next = f
	} else {
		q.head = f
	}
	q.tail = f
}

func (q *queue) remove(f *flow) {
	if f.prev != nil {
		f.prev.next = f.next
	} else {
		q.head = f.next
	}
	if f.next != nil {
		f.next.prev = f.prev
	} else {
		q.tail = f.prev
	}
	f.q, f.prev, f.next = nil, nil, nil
}

type loop struct {
	ls   *Loops
	cfg  Config
	epfd int
	ep   *os.File        // owns epfd; registered with the runtime's poller
	eprc syscall.RawConn // of ep
	evfd int

	mu   sync.Mutex
	cmds []func()

	// Owned by the loop's thread.
	slots  []*flow
	gen    int32 // generation of the last flow made (events carry it)
	free   []int32
	nflows int
	lns    []lnEntry
	connq  queue // connecting upstreams, by start
	idleq  queue // open flows, by last progress
	// waitqs: flows waiting for the client's first bytes, one queue per
	// wait duration (a handful: early data, header, pool grant).
	waitqs []*waitQueue
	bufs   [][]byte
	sa     unix.RawSockaddrAny
	now    int64
	// deadline is ep's read deadline as last set (zero: none).
	deadline time.Time
	// Counters for tests: epoll_pwait calls on epfd, read deadlines set,
	// and wakeups (the loop parked in the runtime's poller and was woken).
	polls, deadlineSets, wakes int64
	stop                       bool
	paused                     bool
}

// maxFreeBufs bounds the buffers a loop keeps for reuse.
const maxFreeBufs = 256

func newLoop(ls *Loops) (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: -1}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, fmt.Errorf("epoll add eventfd: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, fmt.Errorf("epoll fd nonblocking: %w", err)
	}
	ep := os.NewFile(uintptr(epfd), "epoll")
	rc, err := ep.SyscallConn()
	if err != nil {
		ep.Close()
		unix.Close(evfd)
		return nil, fmt.Errorf("epoll fd: %w", err)
	}
	return &loop{ls: ls, cfg: ls.cfg, epfd: epfd, ep: ep, eprc: rc, evfd: evfd}, nil
}

// post runs fn on the loop's thread.
func (l *loop) post(fn func()) {
	l.mu.Lock()
	l.cmds = append(l.cmds, fn)
	l.mu.Unlock()
	var one = [8]byte{1}
	unix.Write(l.evfd, one[:])
}

func (l *loop) runCommands() {
	var b [8]byte
	rawRead(l.evfd, b[:])
	l.mu.Lock()
	cmds := l.cmds
	l.cmds = nil
	l.mu.Unlock()
	for _, fn := range cmds {
		fn()
	}
}

// pauseAccept is how long a listener rests after accept ran out of
// descriptors or memory.
const pauseAccept = int64(100 * time.Millisecond)

// timeout returns epoll_wait's timeout in ms: until the next connect or
// idle deadline (or paused listener), -1 if there is none.
func (l *loop) timeout() int {
	next := int64(-1)
	at := func(t int64) {
		if next < 0 || t < next {
			next = t
		}
	}
	if f := l.connq.head; f != nil {
		at(f.connStart + int64(l.cfg.ConnectTimeout))
	}
	for _, q := range l.waitqs {
		if f := q.head; f != nil {
			at(f.waitUntil)
		}
	}
	if f := l.idleq.head; f != nil && l.cfg.Idle > 0 {
		at(f.last + int64(l.cfg.Idle))
	}
	if l.paused {
		at(l.now + pauseAccept)
	}
	if next < 0 {
		return -1
	}
	now := time.Now().UnixNano()
	if next <= now {
		return 0
	}
	return int((next-now)/int64(time.Millisecond)) + 1
}

func (l *loop) run() {
	defer l.ls.wg.Done()
	// Not locked to its thread: the runtime's monitor preempts a
	// goroutine that has not been rescheduled for 10 ms, which a busy loop
	// never is; a locked one must then hand its P over and sleep until
	// another thread gives it back (two context switches and a futex
	// wake), an unlocked one just goes round the run queue.
	events := make([]unix.EpollEvent, 128)
	for !l.stop {
		n := l.wait(events)
		l.now = time.Now().UnixNano()
		for i := 0; i < n; i++ {
			ev := &events[i]
			switch {
			case ev.Fd >= 0:
				l.flowEvent(ev)
			case ev.Fd == -1:
				l.runCommands()
			default:
				l.accept(int(-2 - ev.Fd))
			}
		}
		l.sweep()
	}
}

// wait returns the loop's next events (none if a deadline came first). It
// never blocks a thread: the loop's epoll descriptor is itself registered
// with the runtime's poller, so an idle loop parks like any goroutine
// waiting for a socket, and a busy one takes ready events without a system
// call that could sleep. (A loop sleeping in epoll_wait would hold a P in a
// system call, which the runtime's monitor takes back and hands off when
// no P is idle, and polls for every 20 us while it does.) Events are taken
// inside the poller's callback only: a poll before it would be repeated
// there (the runtime forgets readiness it saw before the call), one
// epoll_pwait more per wait.
func (l *loop) wait(events []unix.EpollEvent) int {
	ms := l.timeout()
	if ms == 0 {
		return l.poll(events)
	}
	var need time.Time
	if ms > 0 {
		need = time.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	l.armDeadline(need, time.Now())
	n, calls := 0, 0
	err := l.eprc.Read(func(uintptr) bool {
		if calls++; calls > 1 {
			l.wakes++
		}
		n = l.poll(events)
		return n > 0
	})
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		// Not expected: keep serving commands, slowly, so Close still
		// ends the loop.
		l.ls.log.Error("wait for events", "err", err)
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

// armDeadline makes ep's read deadline no later than need (zero: none is
// needed), moving it only when it must: to an earlier time, or once the
// deadline set has passed. A deadline earlier than needed only wakes the
// loop to look again (sweep goes by each flow's own times). Setting the
// exact deadline on every wait would add, move or delete a runtime timer
// for nearly every connection (its connect deadline, then its idle one,
// then none), and each new earliest timer makes the runtime wake its
// network poller or start an idle P's thread to take it: a thread wakeup
// per connection that the connection never needed.
func (l *loop) armDeadline(need, now time.Time) {
	if cur := l.deadline; cur.IsZero() {
		if need.IsZero() {
			return
		}
	} else if cur.After(now) && (need.IsZero() || !need.Before(cur)) {
		return // pending, and not later than needed
	}
	l.ep.SetReadDeadline(need)
	l.deadline = need
	l.deadlineSets++
}

// poll takes the events ready now, without waiting.
func (l *loop) poll(events []unix.EpollEvent) int {
	l.polls++
	for {
		n, e := rawEpollWait(l.epfd, events)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0
		}
		return n
	}
}

// accept takes up to AcceptBatch connections from the loop's listener idx.
func (l *loop) accept(idx int) {
	if idx >= len(l.lns) || !l.lns[idx].on {
		return // stopped accepting earlier in this batch
	}
	ln := &l.lns[idx]
	for range l.cfg.AcceptBatch {
		fd, client, e := rawAccept(ln.fd, &l.sa)
		switch e {
		case 0:
		case unix.EAGAIN:
			return
		case unix.EINTR, unix.ECONNABORTED:
			continue
		case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM:
			// Level-triggered: the queue would wake the loop at once
			// again. Pause this listener briefly instead of spinning.
			l.ls.log.Warn("accept: out of resources, pausing 100 ms", "err", e)
			unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, ln.fd, nil)
			ln.on, ln.pausedUntil, l.paused = false, l.now+pauseAccept, true
			return
		default:
			l.ls.log.Warn("accept", "err", e)
			return
		}
		u, state, err := l.ls.h.Open(ln.tag, fd, client)
		if err != nil {
			if err != ErrTaken {
				ResetClose(fd)
			}
			continue
		}
		l.start(fd, u, state)
	}
}

// start begins relaying between the accepted fd and u.
func (l *loop) start(fd int, u Upstream, state any) {
	f := l.newFlow()
	f.state = state
	f.fd = [2]int{fd, -1}
	f.last = l.now
	l.nflows++
	l.ls.flows.Add(1)
	if u.Wait > 0 {
		l.waitFor(f, u)
		if err := l.register(f, down); err != nil {
			l.finish(f, Reset, err)
		}
		return
	}
	if err := l.register(f, down); err != nil {
		f.fd[up], f.conn = u.FD, u.Conn
		l.finish(f, Reset, err)
		return
	}
	if err := l.setUpstream(f, u); err != nil {
		l.finish(f, Reset, err)
	}
}

// waitFor makes f wait up to u.Wait for its client's first bytes (a new
// deadline).
func (l *loop) waitFor(f *flow, u Upstream) {
	if f.q != nil {
		f.q.remove(f)
	}
	f.waiting, f.head, f.seen = true, u.Head, 0
	d := int64(u.Wait)
	f.waitUntil = l.now + d
	i := slices.IndexFunc(l.waitqs, func(q *waitQueue) bool { return q.d == d })
	if i < 0 {
		i = len(l.waitqs)
		l.waitqs = append(l.waitqs, &waitQueue{d: d})
	}
	l.waitqs[i].push(f)
}

// dial asks the handler for the upstream of a waiting flow: client bytes
// arrived, the client half-closed, or (timedOut) the wait ran out.
func (l *loop) dial(f *flow, timedOut bool) {
	h := &f.d[down]
	for f.waiting {
		var first []byte
		if h.buf != nil {
			first = h.buf[h.off:h.end]
		}
		if f.head && len(first) == f.seen {
			// Nothing new for a head: it can only end here.
			switch {
			case timedOut:
				l.finish(f, Incomplete, os.ErrDeadlineExceeded)
			case h.eof && len(first) == 0:
				l.finish(f, Incomplete, io.EOF)
			case h.eof:
				l.finish(f, Incomplete, io.ErrUnexpectedEOF)
			}
			return
		}
		u, err := l.ls.h.Dial(f.state, first)
		switch {
		case err == nil:
		case f.head && errors.Is(err, ErrMore):
			f.seen = len(first)
			if h.buf != nil && h.end == len(h.buf) {
				l.finish(f, Incomplete, ErrHeadTooLarge)
				return
			}
			continue // ends the flow now if it timed out or closed
		case errors.Is(err, ErrTaken):
			l.take(f)
			return
		default:
			l.finish(f, ConnectFailed, err)
			return
		}
		if err := l.headDone(f, u); err != nil {
			l.finish(f, Reset, err)
			return
		}
		if u.Wait > 0 {
			l.waitFor(f, u)
			timedOut = false
			if h.end == h.off && !h.eof {
				return // nothing yet for the new wait
			}
			continue
		}
		f.q.remove(f)
		f.waiting, f.head = false, false
		l.useUpstream(f, u, nil)
		return
	}
}

// headDone drops the client bytes Dial consumed and writes its reply.
func (l *loop) headDone(f *flow, u Upstream) error {
	h := &f.d[down]
	if u.Consume > 0 {
		if u.Consume > h.end-h.off {
			return fmt.Errorf("evloop: consume %d bytes of %d read", u.Consume, h.end-h.off)
		}
		// Keep the rest at the buffer's start: a head that follows may
		// use all of it.
		n := copy(h.buf, h.buf[h.off+u.Consume:h.end])
		h.off, h.end = 0, n
	}
	for len(u.Reply) > 0 {
		n, e := rawWrite(f.fd[down], u.Reply)
		switch {
		case e == unix.EINTR:
			continue
		case e != 0:
			return fmt.Errorf("write reply: %w", e)
		case n < len(u.Reply):
			return fmt.Errorf("write reply: %d of %d bytes fit", n, len(u.Reply))
		}
		break
	}
	return nil
}

// take gives up a waiting flow the handler took (ErrTaken from Dial):
// Handover with the client's socket and every byte read, no upstream.
func (l *loop) take(f *flow) {
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, f.fd[down], nil)
	ho := Handover{Down: f.fd[down], Up: -1, Stats: f.st}
	if x := &f.d[down]; x.end > x.off {
		ho.ToUp = append([]byte(nil), x.buf[x.off:x.end]...)
	}
	state := f.state
	l.freeFlow(f)
	l.ls.h.Handover(state, ho)
}

// useUpstream installs the upstream the handler gave (Dial, Retry) and
// moves what it can, or fails the flow with the handler's error.
func (l *loop) useUpstream(f *flow, u Upstream, err error) {
	if err == nil {
		err = l.setUpstream(f, u)
	}
	if err != nil {
		l.finish(f, ConnectFailed, err)
		return
	}
	l.pump(f)
}

// setUpstream installs u as f's upstream, with its prefix ahead of the
// client bytes already read.
func (l *loop) setUpstream(f *flow, u Upstream) error {
	f.fd[up], f.conn, f.retry = u.FD, u.Conn, u.Retry
	f.ready[up] = 0
	f.fastOpen, f.sent = u.FastOpen && !u.Connected, 0
	h := &f.d[down]
	if len(u.Prefix) > 0 || f.prefix > 0 {
		client := []byte(nil)
		if h.buf != nil {
			client = h.buf[h.off+f.prefix : h.end]
		}
		var nb []byte
		if n := len(u.Prefix) + len(client); n <= l.cfg.BufSize {
			nb = l.getBuf()
		} else {
			nb = make([]byte, n)
		}
		copy(nb, u.Prefix)
		copy(nb[len(u.Prefix):], client)
		l.putBuf(h.buf)
		h.buf, h.off, h.end = nb, 0, len(u.Prefix)+len(client)
		f.prefix = len(u.Prefix)
	}
	if f.q != nil {
		f.q.remove(f)
	}
	f.connecting = !u.Connected
	if f.connecting {
		f.connStart = l.now
		l.connq.push(f)
	} else {
		f.last = l.now
		l.idleq.push(f)
	}
	return l.register(f, up)
}

func (l *loop) register(f *flow, side int) error {
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET,
		Fd:     f.slot,
		Pad:    f.gen<<1 | int32(side),
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, f.fd[side], &ev); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	return nil
}

func (l *loop) newFlow() *flow {
	var idx int32
	if n := len(l.free); n > 0 {
		idx = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		idx = int32(len(l.slots))
		l.slots = append(l.slots, nil)
	}
	// A new generation per flow: an event still queued for the slot's
	// previous flow (ended earlier in the same batch) must not reach this
	// one (a stale EPOLLERR would fail a healthy connect).
	l.gen = (l.gen + 1) & (1<<30 - 1)
	f := &flow{slot: idx, gen: l.gen}
	l.slots[idx] = f
	return f
}

func (l *loop) freeFlow(f *flow) {
	f.ended = true
	if f.q != nil {
		f.q.remove(f)
	}
	l.putBuf(f.d[0].buf)
	l.putBuf(f.d[1].buf)
	f.d[0].buf, f.d[1].buf = nil, nil
	l.slots[f.slot] = nil
	l.free = append(l.free, f.slot)
	l.nflows--
	l.ls.flows.Add(-1)
}

func (l *loop) getBuf() []byte {
	if n := len(l.bufs); n > 0 {
		b := l.bufs[n-1]
		l.bufs = l.bufs[:n-1]
		return b
	}
	return make([]byte, l.cfg.BufSize)
}

func (l *loop) putBuf(b []byte) {
	if b != nil && len(b) == l.cfg.BufSize && len(l.bufs) < maxFreeBufs {
		l.bufs = append(l.bufs, b)
	}
}

// flowEvent handles an epoll event of one of a flow's sockets.
func (l *loop) flowEvent(ev *unix.EpollEvent) {
	if int(ev.Fd) >= len(l.slots) {
		return
	}
	f := l.slots[ev.Fd]
	if f == nil || f.gen != ev.Pad>>1 {
		return // the flow ended earlier in this batch
	}
	side := int(ev.Pad & 1)
	e := ev.Events
	f.markReady(side, e)
	if side == up && f.connecting {
		if e&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
			err := socketError(f.fd[up])
			if err == nil {
				err = unix.ECONNREFUSED
			}
			l.upFailed(f, fmt.Errorf("connect: %w", err))
			return
		}
		switch {
		case f.fastOpen:
			// Writable at once (the SYN waits for the first write);
			// connected once the kernel says so.
			if f.written && handshakeDone(f.fd[up]) {
				l.connected(f)
			}
		case e&unix.EPOLLOUT == 0:
			return
		default:
			l.connected(f)
		}
	}
	l.pump(f)
	if f.waiting && !f.ended {
		if h := &f.d[down]; h.end-h.off > f.seen || h.eof {
			l.dial(f, false)
		}
	}
}

// connected marks f's upstream as connected: the bytes a Fast Open
// socket held for a retry are sent for good.
func (l *loop) connected(f *flow) {
	f.connecting = false
	f.st.Connect = time.Duration(l.now - f.connStart)
	l.connq.remove(f)
	f.last = l.now // idleq stays in order of last progress
	l.idleq.push(f)
	if !f.fastOpen {
		return
	}
	f.fastOpen = false
	h := &f.d[down]
	p := min(f.sent, f.prefix)
	f.prefix -= p
	f.st.Up += int64(f.sent - p)
	h.off += f.sent
	f.sent = 0
	if h.off == h.end {
		h.off, h.end = 0, 0
	}
}

// handshakeDone reports whether the TCP socket fd finished its handshake
// (ESTABLISHED or any state after it: the peer may have replied and
// closed already).
func handshakeDone(fd int) bool {
	ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && ti.State != tcpSynSent && ti.State != tcpClose
}

// tcp_info.tcpi_state values (include/net/tcp_states.h).
const (
	tcpSynSent = 2
	tcpClose   = 7
)

// unused reports whether the upstream has had none of the flow yet: no
// byte written to it for good (a Fast Open one holds them until its
// handshake) and none read from it (h is d[up]).
func (f *flow) unused(h *half) bool {
	return (!f.written || (f.fastOpen && f.connecting)) && f.st.Down == 0 && h.end == 0
}

// errFirstWrite marks an upstream that failed before any byte reached it:
// its first write failed, or reading it failed (a pooled connection the
// peer reset) before anything was written to it or read from it.
type errFirstWrite struct{ err error }

func (e errFirstWrite) Error() string { return "first write upstream: " + e.err.Error() }
func (e errFirstWrite) Unwrap() error { return e.err }

// pump moves bytes in both directions as far as the sockets allow.
func (l *loop) pump(f *flow) {
	moved := false
	for {
		progress := false
		for d := 0; d < 2; d++ {
			p, err := l.move(f, d)
			progress = progress || p
			if err != nil {
				var fw errFirstWrite
				if errors.As(err, &fw) && f.retry {
					l.upFailed(f, err)
					return
				}
				l.finish(f, Reset, err)
				return
			}
			if f.handover {
				l.handOver(f)
				return
			}
		}
		if !progress {
			break
		}
		moved = true
	}
	if f.d[0].done() && f.d[1].done() {
		l.finish(f, OK, nil)
		return
	}
	if moved && f.q == &l.idleq {
		f.last = l.now
		if f != l.idleq.tail {
			l.idleq.remove(f)
			l.idleq.push(f)
		}
	}
}

// move makes what progress it can in direction d (from side d to side
// 1-d) and reports whether it did any.
func (l *loop) move(f *flow, d int) (bool, error) {
	src, dst := d, 1-d
	h := &f.d[d]
	// The client's bytes wait until the upstream is connected (a Fast
	// Open upstream takes them at once but they stay in the buffer, from
	// off, until it is: tentative). Its EOF waits in any case.
	upPending := d == down && (f.connecting || f.waiting)
	tentative := d == down && f.fastOpen && f.connecting
	blocked := d == down && (f.waiting || (f.connecting && !f.fastOpen))
	progress := false
	for {
		from := h.off
		if tentative {
			from += f.sent
		}
		if h.end > from && !blocked && f.ready[dst]&canWrite != 0 {
			var n int
			var e unix.Errno
			if h.eof && !tentative && !f.fastOpen && !l.cfg.NoFINMerge {
				// The source ended: the FIN follows these bytes at once
				// (shutdown below, or the close that ends the flow), so
				// it can ride in their last segment.
				n, e = rawSendMore(f.fd[dst], h.buf[from:h.end])
			} else {
				n, e = rawWrite(f.fd[dst], h.buf[from:h.end])
			}
			switch e {
			case 0:
			case unix.EINTR:
				continue
			case unix.EAGAIN, unix.EINPROGRESS: // EINPROGRESS: a Fast Open SYN left without data
				f.ready[dst] &^= canWrite
				n = -1
				if e == unix.EINPROGRESS {
					f.written = true
				}
			default:
				err := fmt.Errorf("write: %w", e)
				if d == down && (!f.written || tentative) {
					return progress, errFirstWrite{err}
				}
				return progress, err
			}
			if n > 0 && tentative {
				f.written = true
				f.sent += n
				if handshakeDone(f.fd[dst]) {
					// No Fast Open after all (no client support, or
					// the handshake was quick): nothing to hold.
					l.connected(f)
					return true, nil
				}
				progress = true
				if h.off+f.sent < h.end {
					f.ready[dst] &^= canWrite
				}
				continue
			}
			if n > 0 {
				progress = true
				if d == down {
					f.written = true
					p := min(n, f.prefix)
					f.prefix -= p
					f.st.Up += int64(n - p)
				} else {
					f.st.Down += int64(n)
				}
				h.off += n
				if h.off == h.end {
					h.off, h.end = 0, 0
				} else {
					f.ready[dst] &^= canWrite // short write: the send buffer is full
				}
			}
		}
		if !h.eof && f.ready[src]&canRead != 0 && (h.buf == nil || h.end < len(h.buf)) {
			if h.buf == nil {
				h.buf = l.getBuf()
			}
			space := len(h.buf) - h.end
			n, e := rawRead(f.fd[src], h.buf[h.end:])
			switch e {
			case 0:
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				f.ready[src] &^= canRead
				if h.off == h.end { // an idle direction holds no buffer
					l.putBuf(h.buf)
					h.buf, h.off, h.end = nil, 0, 0
				}
				continue
			default:
				err := fmt.Errorf("read: %w", e)
				if d == up && f.unused(h) {
					return progress, errFirstWrite{err}
				}
				return progress, err
			}
			progress = true
			switch {
			case n == 0:
				if d == up && f.retry && f.unused(h) {
					// A stale pooled connection the peer closed
					// (FIN) before the flow used it.
					return progress, errFirstWrite{errors.New("upstream closed before use")}
				}
				h.eof = true
			case n < space:
				h.end += n
				// A short read emptied the queue: the next data brings
				// a new edge. After the peer's FIN nothing more comes.
				if f.ready[src]&peerShut != 0 {
					h.eof = true
				} else {
					f.ready[src] &^= canRead
				}
			default:
				h.end += n
				if l.cfg.Bulk && space == len(h.buf) && !f.connecting && !f.waiting && f.prefix == 0 && !f.d[0].eof && !f.d[1].eof {
					f.handover = true
					return progress, nil
				}
			}
			continue
		}
		break
	}
	if h.eof && h.drained() && !h.shut && !upPending {
		h.shut = true
		l.putBuf(h.buf)
		h.buf, h.off, h.end = nil, 0, 0
		// The direction that ends second leaves the FIN to the close
		// that follows at once.
		if !f.d[1-d].done() {
			if e := rawShutdownWrite(f.fd[dst]); e != 0 && e != unix.ENOTCONN {
				return true, fmt.Errorf("shutdown: %w", e)
			}
		}
		progress = true
	}
	if h.buf != nil && h.off == h.end && f.ready[src]&canRead == 0 {
		// Nothing in flight and nothing to read: an idle direction
		// holds no buffer (16 KiB per flow otherwise).
		l.putBuf(h.buf)
		h.buf, h.off, h.end = nil, 0, 0
	}
	return progress, nil
}

// upFailed handles an upstream that failed before any byte was written to
// it: another one if the handler has one, else the flow fails.
func (l *loop) upFailed(f *flow, cause error) {
	l.closeUp(f, true)
	if !f.retry {
		l.finish(f, ConnectFailed, cause)
		return
	}
	u, err := l.ls.h.Retry(f.state, cause)
	l.useUpstream(f, u, err)
}

// closeUp closes the upstream socket (with a reset if reset) and forgets it.
func (l *loop) closeUp(f *flow, reset bool) {
	fd := f.fd[up]
	if fd < 0 {
		return
	}
	if reset {
		setLingerZero(fd)
	}
	if f.conn != nil {
		f.conn.Close()
	} else {
		rawClose(fd)
	}
	f.fd[up], f.conn = -1, nil
}

// finish closes both sockets (resetting them unless o is OK) and reports
// the flow's end.
func (l *loop) finish(f *flow, o Outcome, err error) {
	reset := o != OK && !(o == Incomplete && err == io.EOF)
	if reset {
		setLingerZero(f.fd[down])
	}
	rawClose(f.fd[down])
	l.closeUp(f, reset)
	st, state := f.st, f.state
	l.freeFlow(f)
	l.ls.h.Done(state, o, st, err)
}

// handOver gives f's sockets and pending bytes to the handler.
func (l *loop) handOver(f *flow) {
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, f.fd[down], nil)
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, f.fd[up], nil)
	h := Handover{Down: f.fd[down], Up: f.fd[up], UpConn: f.conn, Stats: f.st}
	if x := &f.d[down]; x.end > x.off {
		h.ToUp = append([]byte(nil), x.buf[x.off:x.end]...)
	}
	if x := &f.d[up]; x.end > x.off {
		h.ToDown = append([]byte(nil), x.buf[x.off:x.end]...)
	}
	state := f.state
	l.freeFlow(f)
	l.ls.h.Handover(state, h)
}

// sweep ends flows past their connect or idle deadline and resumes
// paused listeners.
func (l *loop) sweep() {
	for _, q := range l.waitqs {
		for f := q.head; f != nil && l.now >= f.waitUntil; f = q.head {
			// Client bytes whose event is still queued are read first.
			if l.pollPending(f); f.ended || !f.waiting || f.q != &q.queue {
				continue
			}
			if h := &f.d[down]; h.end-h.off > f.seen || h.eof {
				l.dial(f, false)
				continue // a new wait, an upstream, or the same deadline once more with nothing new
			}
			l.dial(f, true)
		}
	}
	// A deadline is checked against the sockets themselves before it ends
	// a flow: after a stall of the loop (a loaded machine), the events
	// that show a flow's progress may still be queued behind a full batch
	// of other flows' events, and a flow must not be ended for the loop's
	// own delay.
	ct := int64(l.cfg.ConnectTimeout)
	for f := l.connq.head; f != nil && l.now-f.connStart >= ct; f = l.connq.head {
		if (!f.fastOpen || f.written) && handshakeDone(f.fd[up]) {
			// Connected, the event not taken yet (a Fast Open one:
			// a missed wakeup must not resend bytes the upstream has).
			l.connected(f)
			l.pump(f)
			continue
		}
		l.upFailed(f, fmt.Errorf("connect: %w", unix.ETIMEDOUT))
	}
	if idle := int64(l.cfg.Idle); idle > 0 {
		for f := l.idleq.head; f != nil && l.now-f.last >= idle; f = l.idleq.head {
			if l.pollPending(f) && !f.ended && f.q == &l.idleq && l.now-f.last < idle {
				continue // it moved: no longer the stalest
			}
			if !f.ended {
				l.finish(f, Idle, nil)
			}
		}
	}
	if l.paused {
		l.paused = false
		for i := range l.lns {
			ln := &l.lns[i]
			if ln.on {
				continue
			}
			if l.now < ln.pausedUntil {
				l.paused = true
				continue
			}
			if err := l.listenOn(i); err != nil {
				l.ls.log.Warn("resume accepting", "err", err)
			}
		}
	}
}

// pollPending asks the kernel whether f's sockets are ready now (events the
// loop may not have taken yet) and, if so, moves what it can. It reports
// whether it looked at any readiness; f may have ended or moved in its
// queue.
func (l *loop) pollPending(f *flow) bool {
	fds := [2]unix.PollFd{
		{Fd: int32(f.fd[down]), Events: unix.POLLIN | unix.POLLOUT | unix.POLLRDHUP},
		{Fd: int32(f.fd[up]), Events: unix.POLLIN | unix.POLLOUT | unix.POLLRDHUP},
	}
	n, err := unix.Poll(fds[:], 0)
	if err != nil || n <= 0 {
		return false
	}
	for side, p := range fds {
		// poll(2)'s POLL* bits have the values of epoll's EPOLL* ones.
		f.markReady(side, uint32(uint16(p.Revents)))
	}
	l.pump(f)
	return true
}

// markReady records the readiness epoll (or poll) reported for a side.
func (f *flow) markReady(side int, e uint32) {
	if e&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		f.ready[side] |= canRead
	}
	if e&unix.EPOLLRDHUP != 0 {
		f.ready[side] |= peerShut
	}
	if e&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		f.ready[side] |= canWrite
	}
}

// resetAll ends every flow of the loop with o.
func (l *loop) resetAll(o Outcome) {
	for _, f := range l.slots {
		if f != nil {
			l.finish(f, o, nil)
		}
	}
}
