package emu

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// scheduler delivers every packet of a world at its time. It runs on one
// OS thread with a timer slack of 1 ns and sleeps in ppoll(2), whose
// timeout is an hrtimer: Go timers on this kernel wake 0.2-1 ms late, which
// would break RTT fidelity at 1 ms.
type scheduler struct {
	w   *World
	efd int // eventfd: wakes the scheduler when a packet becomes the head

	mu         sync.Mutex
	q          schedHeap
	seq        uint64
	sleepUntil int64 // deadline of the current sleep; MinInt64 while awake

	late lateCounters
}

// lateCounters count how late the scheduler hands packets to their
// destination: the time from a packet's due time to its delivery loop
// taking it (the delivery thread woke late or was busy).
type lateCounters struct {
	packets, over500us, over2ms, sumNs atomic.Uint64
}

func (c *lateCounters) add(ns int64) {
	c.packets.Add(1)
	if ns <= 0 {
		return
	}
	c.sumNs.Add(uint64(ns))
	if ns > int64(500*time.Microsecond) {
		c.over500us.Add(1)
		if ns > int64(2*time.Millisecond) {
			c.over2ms.Add(1)
		}
	}
}

// Lateness counts the packets a world delivered and how late (after their
// due time) its delivery threads took them: a measure of whether the
// emulator keeps up with its links (CPU contention shows here first). It
// does not see a packet waiting in a TUN queue before its reader reads it.
type Lateness struct {
	Packets   uint64 // packets taken for delivery
	Over500us uint64 // of them, taken more than 0.5 ms after their due time
	Over2ms   uint64 // more than 2 ms after
	SumNs     uint64 // total lateness, ns (mean = SumNs / Packets)
}

// Sub returns the counts of l since an earlier reading e.
func (l Lateness) Sub(e Lateness) Lateness {
	return Lateness{Packets: l.Packets - e.Packets, Over500us: l.Over500us - e.Over500us, Over2ms: l.Over2ms - e.Over2ms, SumNs: l.SumNs - e.SumNs}
}

type schedItem struct {
	at  int64 // delivery time, ns since World.base
	seq uint64
	p   *pipe
	buf []byte
}

type schedHeap []schedItem

func (h schedHeap) Len() int { return len(h) }
func (h schedHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h schedHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *schedHeap) Push(x any)   { *h = append(*h, x.(schedItem)) }
func (h *schedHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = schedItem{}
	*h = old[:len(old)-1]
	return it
}

func newScheduler(w *World) (*scheduler, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, errors.Join(errors.New("emu: eventfd"), err)
	}
	return &scheduler{w: w, efd: efd, sleepUntil: math.MinInt64}, nil
}

func (s *scheduler) push(p *pipe, buf []byte, at int64) {
	s.mu.Lock()
	s.seq++
	heap.Push(&s.q, schedItem{at: at, seq: s.seq, p: p, buf: buf})
	wake := at < s.sleepUntil
	if wake {
		s.sleepUntil = math.MinInt64 // one wake-up is enough
	}
	s.mu.Unlock()
	if wake {
		s.kick()
	}
}

func (s *scheduler) kick() {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	unix.Write(s.efd, b[:])
}

// run is the scheduler loop; it returns when the world closes.
func (s *scheduler) run(done <-chan struct{}, ready func()) {
	// The thread may get real-time priority: it is never unlocked, so it
	// exits with the goroutine instead of running other goroutines.
	runtime.LockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	s.w.setThreadPriority()
	ready()
	var batch []schedItem
	fds := []unix.PollFd{{Fd: int32(s.efd), Events: unix.POLLIN}}
	var drain [8]byte
	for {
		s.mu.Lock()
		now := s.w.now()
		for len(s.q) > 0 && s.q[0].at <= now+int64(slack) {
			it := heap.Pop(&s.q).(schedItem)
			s.late.add(now - it.at)
			batch = append(batch, it)
		}
		var next int64 = math.MaxInt64
		if len(batch) > 0 {
			s.sleepUntil = math.MinInt64
		} else {
			if len(s.q) > 0 {
				next = s.q[0].at
			}
			s.sleepUntil = next
		}
		s.mu.Unlock()
		if len(batch) > 0 {
			for _, it := range batch {
				it.p.deliver(it.buf)
			}
			clear(batch)
			batch = batch[:0]
			continue
		}
		select {
		case <-done:
			return
		default:
		}
		var ts *unix.Timespec
		if next != math.MaxInt64 {
			t := unix.NsecToTimespec(max(next-now, 0))
			ts = &t
		}
		n, err := unix.Ppoll(fds, ts, nil)
		if err == nil && n > 0 {
			unix.Read(s.efd, drain[:])
		}
	}
}

// close returns the queued buffers; the loop must have stopped.
func (s *scheduler) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range s.q {
		s.w.bufs.put(it.buf)
	}
	s.q = nil
	unix.Close(s.efd)
}
