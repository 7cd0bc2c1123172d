//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Handover brings a relayed pair to its quiescent point and joins it. The
// caller has stopped copying between a and b (every byte it read was
// written to the other leg) and does not touch them again unless an error
// is returned.
//
// How: the relay stops consuming what it receives, so each sender can fill
// at most the window the relay already offered and then stops (zero
// window). Meanwhile every received byte is peeked (MSG_PEEK, SO_PEEK_OFF:
// nothing is consumed, so no window opens) and written to the other leg.
// When both receive queues are fully forwarded, each sender has stopped
// (window exhausted, or no data for two RTTs), and both send queues are
// acknowledged, the pair is joined; the join's window probes then reopen
// the senders' windows end to end.
//
// On error the peeked bytes are still in the receive queues and were also
// written to the other leg: Handover then consumes exactly those bytes, so
// the caller can resume copying without duplicating anything.
func (s *Splicer) Handover(ctx context.Context, a, b *net.TCPConn) (*Splice, error) {
	sp, err := s.handover(ctx, a, b)
	if err != nil {
		return nil, s.count(err)
	}
	s.joined.Add(1)
	return sp, nil
}

type leg struct {
	c   *net.TCPConn
	fd  int
	fwd int // bytes peeked from c and written to the other leg
	buf []byte
	eof bool // the FIN was forwarded
	// rcvbuf is the receive buffer before capRcvbuf (0: not changed).
	rcvbuf int
}

// capRcvbuf makes the sender into l stop soon after the handover starts.
// The relay stops consuming, but the kernel goes on offering window while
// the receive buffer has room (the offered window is min(free space,
// clamp) past each new byte), so a sender kept sending until it filled an
// autotuned buffer of megabytes: 0.7-0.9 s of a 200 Mbit/s flow in
// Fig. 3, rate-limited all the while, which decayed BBR's bandwidth
// estimate and CUBIC's window (RFC 2861) before the join. So the buffer is
// cut to what it holds plus room for the window already offered (at
// least 64 KB) with its per-packet overhead (the queue's own bytes per
// payload byte, 2 when unknown) and half again as a margin, so nothing in
// that window is dropped, when that is smaller. How long the sender still
// sends is then bounded by the window the relay offered at the pause: the
// relay's drain bound clamps it to about one RTT of the flow first.
func (l *leg) capRcvbuf() {
	rmem, rcvbuf, ok := meminfo(l.fd)
	if !ok {
		return
	}
	st, err := readState(l.fd, false)
	if err != nil || st.RcvWnd < 0 {
		return
	}
	// Bytes per byte of payload in the buffer: what the queue shows (1.4 on
	// the emulator's TUN devices), 2 when it holds too little to tell.
	ratio := 2.0
	if st.InQ > 64<<10 && rmem > st.InQ {
		ratio = float64(rmem) / float64(st.InQ)
	}
	want := rmem + int(1.5*ratio*float64(max(int(st.RcvWnd), 64<<10)))
	if want >= rcvbuf {
		return
	}
	// The kernel doubles the value (its bookkeeping overhead).
	if unix.SetsockoptInt(l.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, want/2) == nil {
		l.rcvbuf = rcvbuf
	}
}

// meminfo reads a socket's receive memory and buffer size (SO_MEMINFO).
func meminfo(fd int) (rmem, rcvbuf int, ok bool) {
	var mem [9]uint32 // SK_MEMINFO_*
	n := uint32(len(mem) * 4)
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&n)), 0); e != 0 || n < 8 {
		return 0, 0, false
	}
	return int(mem[0]), int(mem[1]), true
}

// restoreRcvbuf undoes capRcvbuf (a refused handover). The buffer stays
// locked at that size: the kernel stops autotuning a buffer once set.
func (l *leg) restoreRcvbuf() {
	if l.rcvbuf > 0 {
		unix.SetsockoptInt(l.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, l.rcvbuf/2)
		l.rcvbuf = 0
	}
}

func (s *Splicer) handover(ctx context.Context, a, b *net.TCPConn) (*Splice, error) {
	legs := [2]*leg{{c: a, buf: make([]byte, 256<<10)}, {c: b, buf: make([]byte, 256<<10)}}
	for _, l := range legs {
		fd, err := connFD(l.c)
		if err != nil {
			return nil, refuse(ReasonSocket, "%v", err)
		}
		l.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
			return nil, refuse(ReasonSocket, "SO_PEEK_OFF: %v", err)
		}
	}
	// The legs' states at the start: the freeze's keys and scales.
	var st0 [2]SockState
	// near[i]: with Freeze, leg i's sender may send at most about one RTT
	// of leg i more before its frozen edge (nearBytes[i]): the join is
	// tried from then on, while its last bytes are still on the way (they
	// arrive translated), so its window update from the join reaches it
	// about when it would have stopped.
	var nearBytes [2]uint64
	var paces []drainPace // Config.DrainPace: given back on a refusal
	var pre []*preDrain   // Config.PreDrain
	if s.cfg.Freeze {
		for i, l := range legs {
			st, err := readState(l.fd, false)
			if err != nil {
				return nil, err
			}
			st0[i] = st
			if err := s.freeze(st); err != nil {
				return nil, err
			}
			defer s.thaw(st)
		}
		for i := range legs {
			// The flow's rate (the other leg's delivery) x leg i's RTT.
			nearBytes[i] = uint64(float64(st0[1-i].DeliveryRate) * st0[i].MinRTT.Seconds())
		}
		if s.cfg.PreDrain > 0 {
			for i, l := range legs {
				out := st0[1-i]
				rate := float64(paceRate(legs[1-i].fd, out))
				bdp := rate * st0[i].MinRTT.Seconds()
				backlog := out.Unsent + st0[i].InQ
				// Only a leg whose sender feeds the flow (the relay has
				// data toward the other leg's receiver). A backlog already
				// below the target gets its short frozen edge at once.
				if bdp <= 0 || out.OutQ+st0[i].InQ < 64<<10 {
					continue
				}
				pd := &preDrain{key: freezeKey(st0[i]), in: i, outFD: legs[1-i].fd, inFD: l.fd,
					target: int(s.cfg.PreDrain * bdp), wscale: st0[i].RcvWScale, start: time.Now(),
					max: preDrainMaxRounds * st0[i].MinRTT, run: uint32(min(max(preDrainRun*bdp, preDrainMinRun), 1<<30))}
				pd.win = preDrainWindow(rate, s.cfg.DrainPace, max(backlog-pd.target, 0), st0[i])
				pre = append(pre, pd)
				s.log.Debug("handover: pre-drain", "leg", i, "backlog", backlog, "target", pd.target, "win", pd.win, "max", pd.max)
				s.stepPreDrain(pd, 0) // the hold, before the relay's next packet
			}
		}
		if s.cfg.DrainPace > 0 {
			for i, l := range legs {
				// Only a leg that carries the flow: the relay has data
				// toward its receiver.
				if st0[i].OutQ < 64<<10 {
					continue
				}
				rate := paceRate(l.fd, st0[i])
				if p, ok := startDrainPace(l.fd, rate, s.cfg.DrainPace); ok {
					paces = append(paces, p)
					s.log.Debug("handover: drain pace", "leg", i, "rate", rate, "cap", uint64(float64(rate)*s.cfg.DrainPace), "outq", st0[i].OutQ, "srtt", st0[i].RTT, "min_rtt", st0[i].MinRTT)
				}
			}
		}
	} else if !s.cfg.NoRcvbufCap {
		for _, l := range legs {
			l.capRcvbuf()
		}
	}
	consume := func() {
		// Give back a consistent pair of sockets: drop the peeked bytes
		// (already written to the other leg), stop peeking, and give the
		// receive buffers back.
		for _, p := range paces {
			p.stop()
		}
		for _, l := range legs {
			l.restoreRcvbuf()
			unix.SetsockoptInt(l.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, -1)
			for l.fwd > 0 {
				n, _, err := unix.Recvfrom(l.fd, l.buf[:min(l.fwd, len(l.buf))], unix.MSG_DONTWAIT|unix.MSG_TRUNC)
				if err != nil || n <= 0 {
					break
				}
				l.fwd -= n
			}
		}
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	t0 := time.Now()
	var ph Phases
	var lastWhy time.Time
	for {
		quiet := true
		for i, l := range legs {
			other := legs[1-i]
			for {
				if l.eof {
					break
				}
				n, _, err := unix.Recvfrom(l.fd, l.buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
				if errors.Is(err, unix.EAGAIN) {
					break
				}
				if err == nil && n == 0 { // FIN: forward it
					if err := other.c.CloseWrite(); err != nil {
						consume()
						return nil, fmt.Errorf("xlate: handover forward FIN: %w", err)
					}
					l.eof = true
					quiet = false
					break
				}
				if err != nil {
					consume()
					return nil, fmt.Errorf("xlate: handover peek: %w", err)
				}
				// Never block on the other leg: its peer may itself be
				// waiting for us to drain the opposite direction (an echo
				// whose replies fill our receive queue), so a blocking write
				// here deadlocked both directions. Write what fits and peek
				// the rest again on the next round.
				k, err := unix.SendmsgN(other.fd, l.buf[:n], nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
				if err != nil && !errors.Is(err, unix.EAGAIN) {
					consume()
					return nil, fmt.Errorf("xlate: handover write: %w", err)
				}
				k = max(k, 0)
				l.fwd += k
				if k > 0 && preDraining(pre, i) {
					// A held sender: consume what was forwarded, so the
					// relay's own window keeps moving and the program's
					// edge is what holds it (see preDrain).
					m, _, err := unix.Recvfrom(l.fd, l.buf[:k], unix.MSG_DONTWAIT|unix.MSG_TRUNC)
					if err == nil && m > 0 {
						l.fwd -= m
					}
				}
				if k > 0 {
					quiet = false
				}
				if k < n {
					// The peek offset moved past bytes not written: move it
					// back to the first byte not forwarded.
					if err := unix.SetsockoptInt(l.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, l.fwd); err != nil {
						consume()
						return nil, fmt.Errorf("xlate: handover: SO_PEEK_OFF: %w", err)
					}
					quiet = false // bytes wait to be forwarded: not quiescent
					break
				}
			}
		}
		if legs[0].eof && legs[1].eof {
			// Both directions ended while draining: nothing left to join.
			consume()
			return nil, ErrEnded
		}
		var near [2]bool
		var left [2]uint32
		var draining [2]bool
		for _, p := range pre {
			if !s.stepPreDrain(p, legs[p.in].fwd) {
				draining[p.in] = true
			} else if p.took > 0 {
				s.log.Debug("handover: pre-drain done", "leg", p.in, "took", p.took)
				ph.PreDrain = max(ph.PreDrain, p.took)
				p.took = -1
			}
		}
		if s.cfg.Freeze {
			for i := range legs {
				if draining[i] {
					continue
				}
				latched, reached, l := s.frozenState(st0[i])
				near[i] = reached || latched && uint64(l) <= nearBytes[i]
				left[i] = l
			}
		}
		if quiet || near[0] || near[1] {
			st := [2]SockState{}
			ok := true
			why := "a leg busy or closing"
			for i, l := range legs {
				var err error
				st[i], err = readForwarded(l.fd, false, l.fwd)
				var re *RefusedError
				switch {
				case errors.As(err, &re) && re.Reason == ReasonBusy:
					ok = false
				case errors.As(err, &re) && re.Reason == ReasonState:
					// A leg is closing: keep draining until both EOFs are
					// forwarded (ErrEnded above) or a peek fails (reset).
					ok = false
				case err != nil:
					consume()
					return nil, err
				}
			}
			allStopped := ok
			var tail [2]bool
			for i := range legs {
				if !ok {
					break
				}
				in, out := st[i], st[1-i]
				// The sender into leg i has stopped: its window is used up, or
				// it sent nothing for two RTTs of this leg.
				stopped := legs[i].eof || in.RcvWnd == 0 || in.LastDataRecv > max(2*in.RTT, 2*time.Millisecond)
				if near[i] {
					// Frozen: every byte up to the edge arrived, or the
					// last of them are under way.
					stopped = true
				}
				allStopped = allStopped && stopped
				if in.InQ != 0 || !stopped {
					ok = false
					why = fmt.Sprintf("leg %d: inq %d, stopped %v", i, in.InQ, stopped)
				}
				if out.OutQ != 0 || out.Unacked != 0 {
					// The out-leg still delivers what it was given: join
					// now if that lasts about as long as the stopped
					// sender needs to resume through the join (an early
					// join, see tailReady), else wait for it.
					// Only a receiver that sends no data of its own can keep
					// the tail's socket going: the program passes it pure
					// ACKs only (a segment with data would make it
					// acknowledge bytes of the joined flow), so the tail of a
					// leg whose peer sends (an upload's return direction,
					// stopped only by the relay's window) would wait for
					// its ACKs until tailWait.
					idle := out.LastDataRecv > max(2*out.RTT, 2*time.Millisecond)
					if !s.cfg.Tail || legs[1-i].eof || !idle || !tailReady(in, out, left[i]) {
						ok = false
						why = fmt.Sprintf("leg %d: out-leg unsent %d, outq %d, rate %d B/s, idle %v; in min RTT %v", i, out.Unsent, out.OutQ, out.DeliveryRate, idle, in.MinRTT)
					}
					tail[1-i] = true
				}
			}
			if allStopped && ph.Stopped == 0 {
				ph.Stopped = time.Since(t0)
			}
			if !ok && (near[0] || near[1]) && time.Since(lastWhy) >= 10*time.Millisecond && s.log.Enabled(ctx, slog.LevelDebug) {
				lastWhy = time.Now()
				s.log.Debug("handover: near the frozen edge, not joined yet", "after", time.Since(t0), "why", why)
			}
			if ok {
				if ph.Quiet == 0 {
					ph.Quiet = time.Since(t0)
				}
				ph.Attempts++
				// Both senders stopped: the buffers' size back, so the join's
				// window probes carry the reopened windows.
				for i, l := range legs {
					if s.log.Enabled(ctx, slog.LevelDebug) {
						rmem, rcvbuf, _ := meminfo(l.fd)
						s.log.Debug("handover: quiescent", "leg", i, "rmem", rmem, "rcvbuf", rcvbuf, "inq", st[i].InQ,
							"fwd", l.fwd, "rcv_wnd", st[i].RcvWnd, "capped", l.rcvbuf > 0)
					}
					l.restoreRcvbuf()
				}
				sp, err := s.lockedJoin(a, b, legs[0].fwd, legs[1].fwd, tail)
				if err == nil {
					ph.Joined = time.Since(t0)
					ph.Tail = s.finishTails(sp)
					sp.Phases = ph
					return sp, nil
				}
				s.log.Debug("handover: join refused at the quiescent point", "err", err)
				var re *RefusedError
				if !errors.As(err, &re) || (re.Reason != ReasonBusy && re.Reason != ReasonRaced && re.Reason != ReasonState && re.Reason != ReasonOOO) {
					consume()
					return nil, err
				}
				if !s.cfg.Freeze && !s.cfg.NoRcvbufCap {
					for _, l := range legs {
						l.capRcvbuf()
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			consume()
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// Phases says where a handover's time went, from its start: until both
// senders had stopped (window used up, FIN or idle), until the quiescent
// point (everything forwarded and acknowledged) and until the join; Attempts
// counts joins tried at the quiescent point (a raced one is retried).
// Tail is the time from the join until the relay sockets that still
// delivered their tails (an early join) had them acknowledged.
type Phases struct {
	Stopped, Quiet, Joined time.Duration
	Attempts               int
	Tail                   time.Duration
	// PreDrain is how long the longest pre-drain held its sender
	// (Config.PreDrain).
	PreDrain time.Duration
}

func (s *Splicer) lockedJoin(a, b *net.TCPConn, fwdA, fwdB int, tail [2]bool) (*Splice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.join(a, b, fwdA, fwdB, tail)
}

// tailReady says whether a join may leave the out-leg's socket delivering
// what it holds (an early join): in is the leg whose sender has stopped,
// out the leg the relay forwards it to. After the join the stopped sender
// resumes one in-leg RTT later at the relay (the window probe to it, its
// data back), translated onto the out-leg; what the out-leg has not sent
// yet should last that long at its delivery rate, and not much longer:
// what is left then shares the out-leg's path with the resumed sender. A
// queue that is shorter already is joined at once (its gap is what is left
// of the in-leg RTT). Before session 11 the handover waited for the queue
// to be sent and acknowledged, which left the receiver about one joined
// RTT with nothing arriving (Fig. 3).
//
// left is what the stopped sender may still send before its frozen edge
// (Config.Freeze: it has not stopped yet, the join comes while its last
// bytes are under way): those bytes join the tail on the out-leg's path.
// Without counting them, a join near the edge put the tail and the resumed
// sender's data onto that path at once: twice its rate for the tail's
// length, losses, one RTO (Fig. 3, session 12).
func tailReady(in, out SockState, left uint32) bool {
	if out.DeliveryRate == 0 || in.MinRTT == 0 {
		return false
	}
	drain := time.Duration(float64(uint64(out.Unsent)+uint64(left)) / float64(out.DeliveryRate) * float64(time.Second))
	return drain <= in.MinRTT+in.MinRTT/8
}

// tailWait bounds how long Handover waits for a tail to be acknowledged;
// the flow is joined already, the wait only keeps the socket that
// retransmits the tail.
const tailWait = 30 * time.Second

// finishTails waits until every tail socket of sp has its send queue
// acknowledged (the program passes it the peer's ACKs), then closes it in
// repair mode (silently), and returns how long that took. A socket whose
// tail is not acknowledged within tailWait, or that fails, is closed the
// same way.
func (s *Splicer) finishTails(sp *Splice) time.Duration {
	if len(sp.tails) == 0 {
		return 0
	}
	t0 := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for _, c := range sp.tails {
		fd, err := connFD(c)
		for err == nil && time.Since(t0) < tailWait {
			n, e := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
			if e != nil || n == 0 {
				break
			}
			<-tick.C
		}
		if err == nil {
			if n, _ := unix.IoctlGetInt(fd, unix.SIOCOUTQ); n != 0 {
				s.log.Warn("xlate: a tail was not acknowledged; closing its socket", "outq", n, "after", time.Since(t0))
			}
			setRepair(fd, 1)
		}
		c.Close()
	}
	sp.tails = nil
	return time.Since(t0)
}

// connFD returns the descriptor of c; it stays valid while c is open.
func connFD(c *net.TCPConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var fd int
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return 0, err
	}
	return fd, nil
}
