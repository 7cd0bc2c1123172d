//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"context"
	"log/slog"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// A preDrain empties most of the relay's backlog toward a receiver before
// the sender into the other leg reaches its frozen edge (Config.PreDrain).
//
// Why (Fig. 3, sessions 14-15): a split relay whose legs run at the same
// rate keeps whatever its in-leg's sender pushed in excess during its
// startup (3-6 MB, up to 250 ms of the flow at 100 ms RTT) in its
// out-leg's send buffer for the whole flow: both legs then move at one
// rate and the backlog never drains. At a frozen handover the sender
// reached its edge and waited, stopped, until that backlog was down to
// about one in-leg RTT (tailReady): 100-200 ms, long enough for BBR to sit
// in its 1.25x ProbeBW phase (it ends only once inflight reaches 1.25 BDP),
// whose first joined round, sent without feedback, then overflowed its own
// link.
//
// How: the program offers the sender at most win past each ACK the relay
// sends (freeze.hold: a window that slides with what arrives, no edge
// latched), and the handover consumes what it forwards from that leg (so
// the relay's own window keeps moving and the program's is what holds the
// sender), while the out-leg drains the backlog at its full (paced) rate.
// Once the backlog is down to target, the edge is frozen run bytes past
// the relay's last ACK (a few in-leg BDPs, not the relay's whole window:
// the sender's BBR leaves the gain phase the hold left it in, and what
// the out-leg's drain pace adds to the backlog stays small), the handover
// stops consuming, and the sender reaches its edge with little backlog
// left, so the join comes before it stops. A backlog below target at the
// start gets the short edge at once.
type preDrain struct {
	key    xlateTuple
	in     int // the leg whose sender is held
	outFD  int // the relay's socket toward the receiver
	inFD   int
	target int    // backlog (bytes) at which the sender gets its edge back
	win    uint32 // the window the sender is held to
	max    time.Duration
	run    uint32 // the frozen edge's distance at the end (0: the relay's window)
	wscale uint8  // the relay's window scale on the in-leg
	held   bool
	start  time.Time
	took   time.Duration
	done   bool
	logged time.Time
}

// backlog is what the relay still holds toward the receiver: the out-leg's
// unsent bytes and the in-leg's bytes not yet forwarded (fwd of them were).
func (p *preDrain) backlog(fwd int) int {
	unsent, err := unix.IoctlGetInt(p.outFD, unix.SIOCOUTQNSD)
	if err != nil {
		return 0
	}
	inq, err := unix.IoctlGetInt(p.inFD, unix.SIOCINQ)
	if err != nil {
		return unsent
	}
	return unsent + max(inq-fwd, 0)
}

// stepPreDrain starts the hold (the program offers the sender at most
// win past each ACK the relay sends) or, once the backlog is down to the
// target, ends it: the program then latches the edge the relay's next
// packet offers (its window, reopened by what the pre-drain consumed), the
// freeze proper, and the handover stops consuming. It reports whether the
// pre-drain is over.
func (s *Splicer) stepPreDrain(p *preDrain, fwd int) bool {
	if p.done {
		return true
	}
	if !p.held {
		v := xlateFreeze{Wscale: p.wscale, Hold: p.win}
		if s.objs.Freezes.Update(&p.key, &v, ebpf.UpdateAny) != nil {
			p.done = true
			return true
		}
		p.held = true
	}
	backlog := p.backlog(fwd)
	var v xlateFreeze
	s.objs.Freezes.Lookup(&p.key, &v)
	// (The edge is placed from the relay's last ACK: wait for one, unless
	// the hold has lasted its most.)
	if backlog <= p.target && v.Ack != 0 || time.Since(p.start) > p.max {
		if v.Ack != 0 && p.run > 0 {
			// The edge: run bytes past what the relay acknowledged.
			s.objs.Freezes.Update(&p.key, &xlateFreeze{Wscale: p.wscale, Set: 1, Ack: v.Ack, Edge: v.Ack + p.run}, ebpf.UpdateAny)
		} else {
			s.objs.Freezes.Update(&p.key, &xlateFreeze{Wscale: p.wscale}, ebpf.UpdateAny)
		}
		p.done, p.took = true, time.Since(p.start)
		return true
	}
	if time.Since(p.logged) >= 10*time.Millisecond && s.log.Enabled(context.Background(), slog.LevelDebug) {
		p.logged = time.Now()
		s.log.Debug("handover: pre-drain", "ack", v.Ack, "backlog", backlog, "clamped", v.Clamped)
	}
	return false
}

// preDraining says whether leg i's sender is still held by a pre-drain.
func preDraining(pre []*preDrain, i int) bool {
	for _, p := range pre {
		if p.in == i && !p.done {
			return true
		}
	}
	return false
}

// preDrainRounds is how many in-leg RTTs a pre-drain aims to take, and
// preDrainMaxRounds how many it may take at most: BBR's bandwidth filter
// keeps the largest sample of the last 10 rounds, and a held sender's
// samples are small, so a longer hold would make it forget its rate
// (a sender stopped outright keeps its filters, which is why the handover
// ends with a freeze, not with a hold). A backlog that is not drained by
// then is left to the freeze, as without a pre-drain.
const (
	preDrainRounds    = 4
	preDrainMaxRounds = 8
)

// preDrainRun is how far past the relay's ACK the edge is frozen when a
// pre-drain ends, in in-leg BDPs: the sender then runs about that many
// in-leg RTTs at its rate (BBR leaves the gain phase the hold left it
// in), and what the relay's out-leg pace adds to its backlog meanwhile
// stays small.
const preDrainRun = 4

// preDrainMinRun is the least distance of that edge (bytes): on a short
// path (a veth: a BDP of a few KB) an edge of a few segments would close
// the sender's window in the program's scale steps.
const preDrainMinRun = 256 << 10

// preDrainWindow is the window a pre-drain holds the sender to: what lets
// the out-leg (delivering rate bytes/s, paced at pace of it when pace > 0)
// drain excess bytes in preDrainRounds in-leg RTTs, at most a quarter of
// the in-leg's BDP, at least an eighth of it (and four segments): the
// relay's ACKs, which carry the window back when the hold ends, then come
// every few segments, not once per RTT (with a window of four segments
// the released sender's data came back up to two in-leg RTTs later and
// the backlog ran out meanwhile: 0.88 of the rate for 100 ms in Fig. 3);
// and never more than the window field carries with the relay's scale.
func preDrainWindow(rate, pace float64, excess int, in SockState) uint32 {
	if pace <= 0 || pace > 1 {
		pace = 1
	}
	rtt := in.MinRTT.Seconds()
	r := pace*rate - float64(excess)/(preDrainRounds*rtt)
	mss := float64(max(in.AdvMSS, 536))
	w := max(min(r*rtt, rate*rtt/4), rate*rtt/8, 4*mss)
	return uint32(min(w, float64(uint32(0xffff)<<in.RcvWScale)))
}
