package emu

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

const (
	bigBufSize   = vnetHdrLen + 65536 + 256
	smallBufSize = 2048
	// slack is how early a packet may be delivered to batch it with others.
	slack = 50 * time.Microsecond
	// maxPipeBytes bounds what one direction holds in flight on an
	// unlimited-rate link, so a runaway sender cannot exhaust memory.
	maxPipeBytes = 512 << 20
)

// bufPools recycles packet buffers of two sizes.
type bufPools struct {
	big, small sync.Pool
}

func newBufPools() *bufPools {
	p := &bufPools{}
	p.big.New = func() any { b := make([]byte, bigBufSize); return &b }
	p.small.New = func() any { b := make([]byte, smallBufSize); return &b }
	return p
}

func (p *bufPools) get(n int) []byte {
	if n <= smallBufSize {
		return (*p.small.Get().(*[]byte))[:n]
	}
	if n <= bigBufSize {
		return (*p.big.Get().(*[]byte))[:n]
	}
	return make([]byte, n)
}

func (p *bufPools) put(b []byte) {
	switch cap(b) {
	case smallBufSize:
		b = b[:cap(b)]
		p.small.Put(&b)
	case bigBufSize:
		b = b[:cap(b)]
		p.big.Put(&b)
	}
}

// packet is a buffer waiting in a pipe for its delivery time.
type packet struct {
	buf []byte
	at  int64 // delivery time, ns since World.base
	seq uint64
}

type pktHeap []packet

func (h pktHeap) Len() int { return len(h) }
func (h pktHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h pktHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pktHeap) Push(x any)   { *h = append(*h, x.(packet)) }
func (h *pktHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = packet{}
	*h = old[:len(old)-1]
	return p
}

// LinkStats counts what one direction of a pair did.
type LinkStats struct {
	Packets    uint64 // packets (segments) delivered
	Bytes      uint64 // IP bytes delivered
	LossDrops  uint64 // dropped by the loss setting
	QueueDrops uint64 // dropped because the queue was full
	WriteErrs  uint64 // failed writes to the destination device
}

// pipe is one direction of a pair: it applies the link's properties and
// delivers packets to the destination device at their time.
type pipe struct {
	w   *World
	dst *os.File

	packets, bytes, lossDrops, queueDrops, writeErrs atomic.Uint64

	mu        sync.Mutex
	cfg       Link
	rng       *rand.Rand
	busyUntil int64 // end of serialization of the last accepted packet
	lastAt    int64 // delivery time of the last accepted packet
	seq       uint64
	inFlight  int
	q         pktHeap
	running   bool
	wake      chan struct{}
}

func newPipe(w *World, dst *os.File, cfg Link, seed uint64) *pipe {
	return &pipe{
		w:    w,
		dst:  dst,
		cfg:  cfg,
		rng:  rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		wake: make(chan struct{}, 1),
	}
}

func (p *pipe) setLink(l Link) {
	p.mu.Lock()
	p.cfg = l
	p.mu.Unlock()
	p.signal()
}

func (p *pipe) link() Link {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

func (p *pipe) stats() LinkStats {
	return LinkStats{
		Packets:    p.packets.Load(),
		Bytes:      p.bytes.Load(),
		LossDrops:  p.lossDrops.Load(),
		QueueDrops: p.queueDrops.Load(),
		WriteErrs:  p.writeErrs.Load(),
	}
}

func (p *pipe) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// perPacket reports whether the link's properties must be applied to each
// segment rather than to GSO super-packets.
func (l Link) perPacket() bool { return l.LossPct > 0 || l.RateMbit > 0 }

// send accepts one packet read from the source device at time now. It takes
// ownership of buf.
func (p *pipe) send(now int64, buf []byte) {
	p.mu.Lock()
	if p.cfg.perPacket() && p.w.offload && isGSO(buf) {
		err := splitGSO(buf, p.w.bufs.get, func(seg []byte) { p.enqueueLocked(now, seg) })
		p.w.bufs.put(buf)
		if err != nil {
			p.writeErrs.Add(1)
		}
	} else {
		p.enqueueLocked(now, buf)
	}
	start := !p.running && len(p.q) > 0
	if start {
		p.running = true
	}
	p.mu.Unlock()
	if start {
		p.w.goPipe(p)
	}
}

func (p *pipe) enqueueLocked(now int64, buf []byte) {
	c := &p.cfg
	if c.LossPct > 0 && p.rng.Float64()*100 < c.LossPct {
		p.lossDrops.Add(1)
		p.w.bufs.put(buf)
		return
	}
	size := len(buf)
	if p.w.offload {
		size -= vnetHdrLen
	}
	depart := now
	if c.RateMbit > 0 {
		start := max(now, p.busyUntil)
		limit := int64(c.QueueMS * 1e6)
		if c.QueuePkts > 0 {
			limit = int64(float64(c.QueuePkts) * 1500 * 8 / c.RateMbit * 1e3)
		} else if limit == 0 {
			limit = DefaultQueueMS * 1e6
		}
		if start-now > limit {
			p.queueDrops.Add(1)
			p.w.bufs.put(buf)
			return
		}
		p.busyUntil = start + int64(float64(size)*8/c.RateMbit*1e3)
		depart = p.busyUntil
	} else if p.inFlight > maxPipeBytes {
		p.queueDrops.Add(1)
		p.w.bufs.put(buf)
		return
	}
	at := depart + int64(c.DelayMS*1e6)
	if c.JitterMS > 0 {
		at += int64((p.rng.Float64()*2 - 1) * c.JitterMS * 1e6)
		at = max(at, depart)
	}
	if !c.Reorder {
		at = max(at, p.lastAt)
	}
	p.lastAt = max(p.lastAt, at)
	p.seq++
	wasHead := len(p.q) == 0 || at < p.q[0].at
	heap.Push(&p.q, packet{buf: buf, at: at, seq: p.seq})
	p.inFlight += len(buf)
	if wasHead && p.running {
		p.signal()
	}
}

// run delivers the pipe's packets at their times until the world closes.
func (p *pipe) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var batch [][]byte
	for {
		p.mu.Lock()
		now := p.w.now()
		for len(p.q) > 0 && p.q[0].at <= now+int64(slack) {
			pk := heap.Pop(&p.q).(packet)
			p.inFlight -= len(pk.buf)
			batch = append(batch, pk.buf)
		}
		var wait int64 = -1
		if len(p.q) > 0 {
			wait = p.q[0].at - now
		}
		p.mu.Unlock()
		if len(batch) > 0 {
			p.deliver(batch)
			clear(batch)
			batch = batch[:0]
			continue
		}
		if wait < 0 {
			select {
			case <-p.wake:
				continue
			case <-p.w.done:
				return
			}
		}
		if !p.w.sleep(timer, wait, p.wake) {
			return
		}
	}
}

func (p *pipe) deliver(batch [][]byte) {
	hdr := 0
	if p.w.offload {
		hdr = vnetHdrLen
	}
	for _, b := range batch {
		if _, err := p.dst.Write(b); err != nil {
			p.writeErrs.Add(1)
		} else {
			p.packets.Add(1)
			p.bytes.Add(uint64(len(b) - hdr))
		}
		p.w.bufs.put(b)
	}
}

// drain returns all queued buffers to the pool; the pipe must be stopped.
func (p *pipe) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pk := range p.q {
		p.w.bufs.put(pk.buf)
	}
	p.q = nil
}

// timerCal calibrates Go timer lateness so that sleeps end close to their
// deadline: a timer is armed early by the average observed overshoot and the
// rest is spun with runtime.Gosched.
type timerCal struct {
	overshoot atomic.Int64 // EWMA, ns
}

const (
	maxEarly = int64(2 * time.Millisecond)
	spinMax  = int64(500 * time.Microsecond)
)

// sleep waits about d ns (woken early by wake or stopped by the world's
// close). It returns false when the world is closing.
func (w *World) sleep(t *time.Timer, d int64, wake <-chan struct{}) bool {
	early := min(w.cal.overshoot.Load()+int64(20*time.Microsecond), maxEarly)
	if d-early > 0 {
		target := w.now() + d - early
		t.Reset(time.Duration(d - early))
		select {
		case <-t.C:
			late := w.now() - target
			if late >= 0 {
				old := w.cal.overshoot.Load()
				w.cal.overshoot.Store(old + (min(late, maxEarly)-old)/16)
			}
			return true
		case <-wake:
			t.Stop()
			return true
		case <-w.done:
			t.Stop()
			return false
		}
	}
	// Spin the last fraction.
	end := w.now() + min(d, spinMax)
	for w.now() < end {
		select {
		case <-wake:
			return true
		case <-w.done:
			return false
		default:
		}
		runtime.Gosched()
	}
	return true
}

var _ = math.Inf
