package emu

import (
	"encoding/binary"
	"math/rand/v2"

	"golang.org/x/sys/unix"
	"sync"
	"sync/atomic"
	"time"
)

const (
	bigBufSize   = vnetHdrLen + 65536 + 256
	smallBufSize = 2048
	// slack is how early a packet may be delivered to batch it with others.
	slack = 50 * time.Microsecond
	// chunkTime is the longest serialization time of one piece of a GSO
	// super-packet on a rate-limited link.
	chunkTime = 250 * time.Microsecond
	// forwardCost is subtracted from every one-way delay: it is about what
	// reading a packet, scheduling and writing it costs on an idle machine
	// (a zero-delay link measures 0.1-0.2 ms RTT).
	forwardCost = int64(50 * time.Microsecond)
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

// LinkStats counts what one direction of a pair did.
type LinkStats struct {
	Packets    uint64 // packets (segments) delivered
	Bytes      uint64 // IP bytes delivered
	LossDrops  uint64 // dropped by the loss setting
	QueueDrops uint64 // dropped because the queue was full
	WriteErrs  uint64 // failed writes to the destination device
	// Backlog is how long the rate-limited queue needs to drain now: the
	// queueing delay a packet accepted now would see (0: empty, or the
	// link has no rate).
	Backlog time.Duration
}

// pipe is one direction of a pair: it applies the link's properties and
// schedules each packet's delivery to the destination device.
type pipe struct {
	w     *World
	dst   int        // destination TUN descriptor
	sched *scheduler // delivers to dst

	packets, bytes, lossDrops, queueDrops, writeErrs atomic.Uint64
	inFlight                                         atomic.Int64
	held                                             atomic.Int64 // packets (buffers) scheduled, not yet delivered

	mu        sync.Mutex
	cfg       Link
	rng       *rand.Rand
	busyUntil int64 // end of serialization of the last accepted packet
	lastAt    int64 // delivery time of the last accepted packet
}

func newPipe(w *World, dst int, sched *scheduler, cfg Link, seed uint64) *pipe {
	return &pipe{
		w:     w,
		dst:   dst,
		sched: sched,
		cfg:   cfg,
		rng:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

func (p *pipe) setLink(l Link) {
	p.mu.Lock()
	p.cfg = l
	p.mu.Unlock()
}

func (p *pipe) stats() LinkStats {
	p.mu.Lock()
	backlog := time.Duration(max(p.busyUntil-p.w.now(), 0))
	p.mu.Unlock()
	return LinkStats{
		Backlog:    backlog,
		Packets:    p.packets.Load(),
		Bytes:      p.bytes.Load(),
		LossDrops:  p.lossDrops.Load(),
		QueueDrops: p.queueDrops.Load(),
		WriteErrs:  p.writeErrs.Load(),
	}
}

// perPacket reports whether the link's properties must be applied to each
// segment rather than to GSO super-packets.
func (l Link) perPacket() bool { return l.LossPct > 0 || l.RateMbit > 0 }

// send accepts one packet read from the source device at time now. It takes
// ownership of buf.
func (p *pipe) send(now int64, buf []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.perPacket() && p.w.offload && isGSO(buf) {
		if p.cfg.JitterGSO {
			p.sendWholeLocked(now, buf)
			return
		}
		// Loss needs single segments. A rate limit only needs pieces short
		// enough to serialize in about chunkTime, so that fast links keep
		// most of the GSO savings.
		segs := 1
		if p.cfg.LossPct == 0 {
			gsoSize := int(buf[4]) | int(buf[5])<<8
			segs = int(p.cfg.RateMbit * 1e6 / 8 * chunkTime.Seconds() / float64(max(gsoSize, 1)))
		}
		err := splitGSO(buf, segs, p.w.bufs.get, func(seg []byte) { p.enqueueLocked(now, seg) })
		p.w.bufs.put(buf)
		if err != nil {
			p.writeErrs.Add(1)
		}
		return
	}
	p.enqueueLocked(now, buf)
}

// sendWholeLocked handles a GSO super-packet on a JitterGSO link: loss is
// drawn per segment; when no segment is lost the super-packet goes on whole
// (one serialization, one jitter draw, delivered as one GSO packet, so a
// forwarding host passes it on whole too, as netem and veth treat an skb);
// otherwise the surviving segments go on one by one with the same jitter.
func (p *pipe) sendWholeLocked(now int64, buf []byte) {
	jit := p.drawJitterLocked()
	n := gsoSegments(buf)
	var lost []bool
	if p.cfg.LossPct > 0 {
		for i := range n {
			if p.rng.Float64()*100 < p.cfg.LossPct {
				if lost == nil {
					lost = make([]bool, n)
				}
				lost[i] = true
			}
		}
	}
	if lost == nil {
		p.enqueueWithLocked(now, buf, jit)
		return
	}
	i := 0
	err := splitGSO(buf, 1, p.w.bufs.get, func(seg []byte) {
		if i < len(lost) && lost[i] {
			p.lossDrops.Add(1)
			p.w.bufs.put(seg)
		} else {
			p.enqueueWithLocked(now, seg, jit)
		}
		i++
	})
	p.w.bufs.put(buf)
	if err != nil {
		p.writeErrs.Add(1)
	}
}

// drawJitterLocked returns one jitter draw in ns, uniform in [-J, +J].
func (p *pipe) drawJitterLocked() int64 {
	if p.cfg.JitterMS <= 0 {
		return 0
	}
	return int64((p.rng.Float64()*2 - 1) * p.cfg.JitterMS * 1e6)
}

// gsoSegments returns how many wire segments the GSO packet buf carries.
func gsoSegments(buf []byte) int {
	if _, segs, ok := gsoGeometry(buf); ok {
		return segs
	}
	return 1
}

func (p *pipe) enqueueLocked(now int64, buf []byte) {
	c := &p.cfg
	if c.LossPct > 0 && p.rng.Float64()*100 < c.LossPct {
		p.lossDrops.Add(1)
		p.w.bufs.put(buf)
		return
	}
	p.enqueueWithLocked(now, buf, p.drawJitterLocked())
}

// enqueueWithLocked queues buf (past the loss draw) with jitter jit ns.
func (p *pipe) enqueueWithLocked(now int64, buf []byte, jit int64) {
	c := &p.cfg
	if c.LimitPkts > 0 && p.held.Load() >= int64(c.LimitPkts) {
		// netem's limit: what the link holds, queued or delayed.
		p.queueDrops.Add(1)
		p.w.bufs.put(buf)
		return
	}
	size := wireBytes(buf, p.w.offload)
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
	} else if p.inFlight.Load() > maxPipeBytes {
		p.queueDrops.Add(1)
		p.w.bufs.put(buf)
		return
	}
	at := depart + max(int64(c.DelayMS*1e6)-forwardCost, 0)
	if jit != 0 {
		at = max(at+jit, depart)
	}
	if !c.Reorder {
		at = max(at, p.lastAt)
	}
	p.lastAt = max(p.lastAt, at)
	p.inFlight.Add(int64(len(buf)))
	p.held.Add(1)
	p.sched.push(p, buf, at)
}

func (p *pipe) deliver(b []byte) {
	if _, err := unix.Write(p.dst, b); err != nil {
		p.writeErrs.Add(1)
	} else {
		p.packets.Add(1)
		n := len(b)
		if p.w.offload {
			n -= vnetHdrLen
		}
		p.bytes.Add(uint64(n))
	}
	p.inFlight.Add(-int64(len(b)))
	p.held.Add(-1)
	p.w.bufs.put(b)
}

// wireBytes returns the bytes buf occupies on the wire: its IP packet, plus
// the headers of every segment after the first when it is a GSO packet.
func wireBytes(buf []byte, offload bool) int {
	if !offload {
		return len(buf)
	}
	n := len(buf) - vnetHdrLen
	if hdrLen, segs, ok := gsoGeometry(buf); ok {
		return n + (segs-1)*hdrLen
	}
	return n
}

// gsoGeometry returns the IP + TCP header length and the segment count of
// a GSO packet (virtio header + IP packet); ok is false for anything else.
func gsoGeometry(buf []byte) (hdrLen, segs int, ok bool) {
	if !isGSO(buf) {
		return 0, 0, false
	}
	n := len(buf) - vnetHdrLen
	// The virtio hdr_len is only a hint (the linear part of the skb), so
	// read the real IP + TCP header length.
	pkt := buf[vnetHdrLen:]
	if len(pkt) < 20 {
		return 0, 0, false
	}
	ipHL := 40
	if pkt[0]>>4 == 4 {
		ipHL = int(pkt[0]&0x0f) * 4
	}
	if len(pkt) < ipHL+20 {
		return 0, 0, false
	}
	hdrLen = ipHL + int(pkt[ipHL+12]>>4)*4
	gsoSize := int(binary.LittleEndian.Uint16(buf[4:6]))
	if gsoSize == 0 || hdrLen >= n {
		return 0, 0, false
	}
	return hdrLen, (n - hdrLen + gsoSize - 1) / gsoSize, true
}
