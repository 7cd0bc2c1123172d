//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/xlate"
	"golang.org/x/sys/unix"
)

// XlateJoiner hands sessions off with internal/xlate on this host (the
// router's host translates both directions; see docs/router.md for the
// placement). Join, as the seed's controller does, installs the
// translation before the request leaves, so the surrogate's first answer
// already finds it:
//
//  1. freezes both connections (TCP_REPAIR): the client leg has nothing
//     unread or unacknowledged, the pooled surrogate leg has carried
//     nothing; reads their sequence numbers, and installs the two entries
//     as if the client's bytes were already sent to the surrogate
//     (xlate.Pair on the states with the surrogate leg's snd_nxt + the
//     pending bytes);
//  2. closes the client leg in repair mode (no FIN, no RST) and sends the
//     pending bytes on the surrogate leg, which leaves repair mode: the
//     kernel transmits them and retransmits them if they are lost. The
//     surrogate's ACKs and answer are translated to the client, so the
//     router's socket never sees them. Once the surrogate has answered
//     (or after Linger for a request of several segments) the leg is
//     silenced: closed in repair mode, its 4-tuple held by an empty
//     repair-mode socket while the join lives so its port is not reused
//     (retire).
//
// A refusal leaves both connections working (the router then proxies the
// session).
type XlateJoiner struct {
	Splicer *xlate.Splicer
	// Linger keeps the surrogate leg alive after the join to retransmit
	// the request; 0 means 3 s.
	Linger time.Duration
	// Ifindex, when set, is the device both directions leave from (the
	// caller runs outside the router's network namespace, where xlate's
	// route lookup would look); 0: from the routing table.
	Ifindex int
	// Placer, when set, moves the surrogate -> client direction of a join
	// to the surrogate's host (surrogate-side placement, docs/router.md):
	// a surrogate whose agent is connected gets that entry before the
	// request leaves, and the router's own copy is installed Remote (it
	// drops what still reaches it) until the agent refuses it or is lost,
	// when the router translates it again. nil: the router's host
	// translates both directions.
	Placer Placer
	// Triangle, when set, chooses per session whether a connected agent
	// gets the answer's direction (Picker.Triangle: only when surrogate ->
	// client is shorter than through the router).
	Triangle func(client, surrogate netip.Addr) bool
	// PlaceTimeout: a placed join whose client has not acknowledged, this
	// long after the request left, a byte of the answer that did not cross
	// the router (the proof that the surrogate's packets reach it) is taken
	// back: the agent's entry is removed and the router translates the
	// answer (a network that drops the surrogate's packets with the
	// router's source address, or an agent that failed silently). When no
	// byte of the answer crossed the router either, the surrogate is then
	// not placed on for PlaceBackoff. 0 means 1 s and 30 s.
	PlaceTimeout, PlaceBackoff time.Duration

	routes    routeCache
	suspendMu sync.Mutex
	suspended map[netip.Addr]time.Time // surrogate -> until

	wg            sync.WaitGroup
	silent        atomic.Int64
	reserveFailed atomic.Int64
	joins         atomic.Int64
	preparedJoins atomic.Int64
	placed        atomic.Int64
	released      atomic.Int64
	timeouts      atomic.Int64
	phase         [4]atomic.Int64 // ns summed over joins: read, install, verify, send
}

// JoinTimes are the summed durations of the join's phases over Joins
// completed joins (docs/router.md, "Where the handoff's time goes").
type JoinTimes struct {
	Joins int64
	// Prepared: joins whose surrogate leg was read when pooled (Prepare).
	Prepared int64
	// Read: the client leg's state, both legs into TCP_REPAIR and their
	// sequence numbers. Install: xlate.Pair and the map updates (with
	// xlate's route lookups unless Ifindex is set). Verify: the re-read
	// and the surrogate leg out of repair mode. Send: the client leg's
	// silent close and the request's write to the surrogate leg.
	Read, Install, Verify, Send time.Duration
}

// Placement counts the joins whose response direction was placed on the
// surrogate's host, and those of them released back to the router's host
// (refused, not sent, or the agent lost).
func (j *XlateJoiner) Placement() (placed, released int64) {
	return j.placed.Load(), j.released.Load()
}

// isSuspended reports whether placements on surrogate are suspended
// after a timeout (PlaceTimeout).
func (j *XlateJoiner) isSuspended(surrogate netip.Addr) bool {
	j.suspendMu.Lock()
	defer j.suspendMu.Unlock()
	until, ok := j.suspended[surrogate]
	return ok && time.Now().Before(until)
}

// takeBack ends a placement not proven within PlaceTimeout: the agent
// removes its entry (the surrogate's retransmissions then reach the
// router), the router's copy translates alone, and, with suspend, the
// surrogate gets no placement for PlaceBackoff.
func (j *XlateJoiner) takeBack(sin xlate.Tuple, suspend bool) {
	sur := sin.Src.Addr()
	j.Placer.Unplace(sur, sin)
	j.release(sin)
	j.timeouts.Add(1)
	if !suspend {
		return
	}
	backoff := j.PlaceBackoff
	if backoff == 0 {
		backoff = 30 * time.Second
	}
	j.suspendMu.Lock()
	defer j.suspendMu.Unlock()
	if j.suspended == nil {
		j.suspended = map[netip.Addr]time.Time{}
	}
	j.suspended[sur] = time.Now().Add(backoff)
}

// PlaceTimeouts counts placements taken back (PlaceTimeout).
func (j *XlateJoiner) PlaceTimeouts() int64 { return j.timeouts.Load() }

// release makes the router's host translate the response direction of a
// join that was placed on the surrogate's host.
func (j *XlateJoiner) release(in xlate.Tuple) {
	j.released.Add(1)
	j.Splicer.Release(in)
}

// Times returns the join's phase times so far.
func (j *XlateJoiner) Times() JoinTimes {
	return JoinTimes{Joins: j.joins.Load(), Prepared: j.preparedJoins.Load(), Read: time.Duration(j.phase[0].Load()), Install: time.Duration(j.phase[1].Load()),
		Verify: time.Duration(j.phase[2].Load()), Send: time.Duration(j.phase[3].Load())}
}

// ReserveFailed counts surrogate legs whose 4-tuple could not be held
// after the join (a new connection could then reuse the local port).
func (j *XlateJoiner) ReserveFailed() int { return int(j.reserveFailed.Load()) }

// reserveIn is reserve in the network namespace nsfd (-1: the calling
// thread's).
func reserveIn(nsfd int, local, remote netip.AddrPort) (int, error) {
	if nsfd < 0 {
		return -1, errors.New("no network namespace")
	}
	var want, cur unix.Stat_t
	if err := unix.Fstat(nsfd, &want); err != nil {
		return -1, err
	}
	runtime.LockOSThread()
	if err := unix.Stat("/proc/thread-self/ns/net", &cur); err == nil && cur.Ino == want.Ino && cur.Dev == want.Dev {
		runtime.UnlockOSThread()
		return reserve(local, remote)
	}
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	defer unix.Close(orig)
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, err
	}
	fd, err := reserve(local, remote)
	if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread() // else the thread stays locked and exits with the goroutine
	}
	return fd, err
}

// reserve opens a socket in TCP_REPAIR mode bound to local and connected
// to remote (no SYN is sent): it holds the 4-tuple without sending.
func reserve(local, remote netip.AddrPort) (int, error) {
	fam := unix.AF_INET
	var la, ra unix.Sockaddr = &unix.SockaddrInet4{Addr: local.Addr().Unmap().As4(), Port: int(local.Port())},
		&unix.SockaddrInet4{Addr: remote.Addr().Unmap().As4(), Port: int(remote.Port())}
	if !local.Addr().Unmap().Is4() {
		fam = unix.AF_INET6
		la = &unix.SockaddrInet6{Addr: local.Addr().As16(), Port: int(local.Port())}
		ra = &unix.SockaddrInet6{Addr: remote.Addr().As16(), Port: int(remote.Port())}
	}
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, err
	}
	err = setRepair(fd, 1)
	if err == nil {
		err = unix.Bind(fd, la)
	}
	if err == nil {
		err = unix.Connect(fd, ra)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Silent is the number of handed-off sessions whose surrogate leg is held
// silent now (in TCP_REPAIR mode: a killed router closes it without a FIN).
func (j *XlateJoiner) Silent() int { return int(j.silent.Load()) }

// TCP_REPAIR_QUEUE values (linux/tcp.h).
const (
	tcpRecvQueue = 1
	tcpSendQueue = 2
)

// ErrJoinRefused marks a join that did not happen; both connections work.
var ErrJoinRefused = errors.New("router: join refused")

// preparedLeg is a pooled surrogate leg's state read by Prepare.
type preparedLeg struct{ st xlate.SockState }

// Prepare implements Preparer: the pooled surrogate leg's sequence numbers
// and options, read once in TCP_REPAIR mode when the pool makes it, so the
// join freezes and reads only the client leg. The leg's state cannot move
// while it is pooled: the router writes nothing on it and the pool's
// liveness check (no data, no EOF) runs when the leg is taken.
func (j *XlateJoiner) Prepare(surrogate *net.TCPConn) (any, error) {
	rc, err := surrogate.SyscallConn()
	if err != nil {
		return nil, err
	}
	var st xlate.SockState
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = setRepair(int(fd), 1); serr != nil {
			return
		}
		st, serr = frozenState(int(fd))
		if err := setRepair(int(fd), unix.TCP_REPAIR_OFF_NO_WP); serr == nil {
			serr = err
		}
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	return &preparedLeg{st}, nil
}

// Join implements Joiner.
func (j *XlateJoiner) Join(ctx context.Context, client, surrogate *net.TCPConn, prepared any, pending []byte, headLen int) (int, error) {
	n := len(pending)
	if n == 0 {
		return 0, fmt.Errorf("%w: nothing to send", ErrJoinRefused)
	}
	var ph phases
	ph.start()
	sent := 0
	// No separate pre-read of the client leg: xlate.Pair refuses a leg
	// with unread or unacknowledged bytes (every syscall here delays the
	// request; docs/router.md, "Where the handoff's time goes").
	var joinErr error
	var sin xlate.Tuple
	var pl *placement
	prep, _ := prepared.(*preparedLeg)
	if err := control2(client, surrogate, func(cfd, sfd int) {
		sin, pl, joinErr = j.freezeAndInstall(cfd, sfd, prep, n-sent, &ph)
	}); err != nil {
		return sent, fmt.Errorf("%w: %v", ErrJoinRefused, err)
	}
	if joinErr != nil {
		return sent, joinErr
	}
	// The request leaves first; the client leg (in repair mode: no FIN, no
	// RST) is closed after it, off the path to the first byte.
	_, err := surrogate.Write(pending[sent:])
	ph.mark(3)
	client.Close()
	if err == nil && prep != nil {
		j.preparedJoins.Add(1)
	}
	if err != nil {
		// The entries are in place; the session is lost (the client sees a
		// reset from the surrogate or times out).
		surrogate.Close()
		return -1, fmt.Errorf("router: send the request after the join: %w", err)
	}
	j.joins.Add(1)
	for i, d := range ph.d {
		j.phase[i].Add(int64(d))
	}
	linger := j.Linger
	if linger == 0 {
		linger = 3 * time.Second
	}
	oneSegment := n <= mss(surrogate)
	j.wg.Go(func() {
		j.retire(ctx, surrogate, sin, pl, linger, oneSegment)
		if pl != nil {
			j.Placer.Unplace(sin.Src.Addr(), sin)
		}
	})
	return n, nil
}

// placement is a join whose surrogate -> client direction was placed on
// the surrogate's host: what retire needs to watch it.
type placement struct {
	cin xlate.Tuple // the client -> surrogate entry's In
	// ackAdd moves the client's ACKs (cin's AckHi) into the surrogate's
	// sequence space, where start is the answer's first byte.
	ackAdd, start uint32
	// released: the agent refused the entry or was lost, and this host
	// translates the direction again (nothing left to watch).
	released atomic.Bool
}

// after reports whether sequence number a is after b (wrap-safe).
func after(a, b uint32) bool { return int32(a-b) > 0 }

// placedState is what a placed join's two entries on this host show, in
// the surrogate's sequence space: acked, the client's highest ACK (the
// client -> surrogate entry), and crossed, the end of the answer that
// reached this host (sent before the agent's install, or after a take
// back) and was translated here.
type placedState struct {
	acked, crossed uint32
	dataHere       bool // answer bytes, a FIN or a RST crossed this host
	ok             bool // both entries are installed
}

func (j *XlateJoiner) placedState(sin xlate.Tuple, pl *placement) placedState {
	c, okc := j.Splicer.Entry(pl.cin)
	s, oks := j.Splicer.Entry(sin)
	if !okc || !oks || !c.Marks || !s.Marks {
		return placedState{}
	}
	return placedState{acked: c.AckHi + pl.ackAdd, crossed: s.SeqHi, dataHere: s.Bytes > 0 || s.FIN || s.RST, ok: true}
}

// mss is a connection's maximum segment size (536 when unknown).
func mss(c *net.TCPConn) int {
	v := 536
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if m, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG); err == nil && m > 0 {
				v = m
			}
		})
	}
	return v
}

// answerPoll is how often a lingering surrogate leg checks whether the
// surrogate has answered.
const answerPoll = 5 * time.Millisecond

// retire keeps the surrogate leg alive (it retransmits the bytes sent after
// the install if they are lost) for linger, or until the surrogate has
// answered when the request went in one segment (its answer's data then
// proves the whole request arrived); then silent in TCP_REPAIR mode until
// the join is gone, so its local port is not reused by a new pooled
// connection whose packets would match the join's entry.
//
// Leaving the live state early matters when the router is killed: the
// kernel closes a live socket with a FIN, which the surrogate would take
// as the client's half-close, while a socket in repair mode closes
// silently (handed-off sessions survive a killed router with pinned
// translation; docs/router.md).
//
// in is the surrogate -> client direction's entry. With pl (surrogate-side
// placement) the answer does not cross this host: the client's ACKs show
// it, and retire also watches the placement until it is proven (the client
// acknowledged a byte of the answer that did not cross this host) or taken
// back (PlaceTimeout). An ACK of the client alone proves nothing: the
// answer's first segments may have crossed this host (sent before the
// agent's install) while the network drops the rest.
func (j *XlateJoiner) retire(ctx context.Context, c *net.TCPConn, in xlate.Tuple, pl *placement, linger time.Duration, oneSegment bool) {
	defer c.Close()
	t := time.NewTimer(linger)
	defer t.Stop()
	var poll <-chan time.Time
	if oneSegment || pl != nil {
		tk := time.NewTicker(answerPoll)
		defer tk.Stop()
		poll = tk.C
	}
	placeTimeout := j.PlaceTimeout
	if placeTimeout == 0 {
		placeTimeout = time.Second
	}
	placedAt := time.Now()
	watching := pl != nil
	answered, lingered, gone := false, false, false
	for (!lingered && !answered && !gone) || (watching && !gone) {
		select {
		case <-t.C:
			lingered = true
			continue
		case <-ctx.Done():
		case <-poll:
		}
		if ctx.Err() != nil {
			break
		}
		if watching && pl.released.Load() {
			watching = false
		}
		if watching {
			ps := j.placedState(in, pl)
			switch {
			case !ps.ok:
				gone = true
				continue
			case after(ps.acked, ps.crossed):
				watching = false // proven: the surrogate's packets reach the client
			case time.Since(placedAt) > placeTimeout:
				// Suspend the surrogate only when nothing at all reached
				// the client: answer bytes that crossed this host and were
				// acknowledged show a lost race, not a filtering network.
				j.takeBack(in, ps.crossed == pl.start)
				watching = false
			}
			if oneSegment && (after(ps.acked, pl.start) || ps.dataHere) {
				answered = true
			}
			continue
		}
		if !oneSegment || answered {
			continue
		}
		st, ok := j.Splicer.Entry(in)
		if !ok {
			gone = true
		} else if st.Bytes > 0 || st.FIN || st.RST {
			answered = true
		}
	}
	silenced := false
	var local, remote netip.AddrPort
	nsfd := -1
	if rc, err := c.SyscallConn(); err == nil {
		local, remote = c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
		rc.Control(func(fd uintptr) {
			silenced = setRepair(int(fd), 1) == nil
			if answered {
				// The socket's network namespace (the router may run in
				// another one and dial through a namespaced dialer).
				nsfd, _ = unix.IoctlRetInt(int(fd), unix.SIOCGSKNS)
			}
		})
	}
	if nsfd >= 0 {
		defer unix.Close(nsfd)
	}
	if silenced && answered {
		// A socket in TCP_REPAIR mode still retransmits its unacknowledged
		// bytes on its RTO timer: the request, whose ACK went to the
		// client, would reach the surrogate again and again (a D-SACK to
		// the client each time, RSTs once the session ended). The
		// surrogate has it: the leg is closed (silently, in repair mode)
		// and its 4-tuple held by an empty socket in repair mode instead.
		c.Close()
		fd, err := reserveIn(nsfd, local, remote)
		if err != nil {
			j.reserveFailed.Add(1)
			silenced = false
		} else {
			defer unix.Close(fd)
		}
	}
	if silenced {
		j.silent.Add(1)
		defer j.silent.Add(-1)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for j.Splicer.Joined(in) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// Wait waits for the lingering surrogate legs to be closed (they close
// when their linger ends or the context given to Join ends).
func (j *XlateJoiner) Wait() { j.wg.Wait() }

// freezeAndInstall installs the join with the surrogate leg's snd_nxt moved
// by later (the bytes sent after the install); it returns the surrogate
// leg's In tuple.
// With prep (the surrogate leg's state read when it was pooled) only the
// client leg is frozen.
//
// It also returns, when the surrogate -> client direction was placed on
// the surrogate's host (Placer), what retire watches of the placement.
func (j *XlateJoiner) freezeAndInstall(cfd, sfd int, prep *preparedLeg, later int, ph *phases) (sin xlate.Tuple, pl *placement, err error) {
	if err := setRepair(cfd, 1); err != nil {
		return sin, nil, fmt.Errorf("%w: TCP_REPAIR: %v", ErrJoinRefused, err)
	}
	if prep == nil {
		if err := setRepair(sfd, 1); err != nil {
			setRepair(cfd, unix.TCP_REPAIR_OFF_NO_WP)
			return sin, nil, fmt.Errorf("%w: TCP_REPAIR: %v", ErrJoinRefused, err)
		}
	}
	undo := func() {
		setRepair(cfd, unix.TCP_REPAIR_OFF_NO_WP)
		if prep == nil {
			setRepair(sfd, unix.TCP_REPAIR_OFF_NO_WP)
		}
	}
	cs, err1 := frozenState(cfd)
	var ss xlate.SockState
	var err2 error
	if prep != nil {
		ss = prep.st
	} else {
		ss, err2 = frozenState(sfd)
	}
	if err := errors.Join(err1, err2); err != nil {
		undo()
		return sin, nil, fmt.Errorf("%w: %v", ErrJoinRefused, err)
	}
	ss.SndNxt += uint32(later) // sent after the install
	ph.mark(0)
	ab, ba, err := xlate.Pair(cs, ss)
	sur := ba.In.Src.Addr()
	remote := err == nil && j.Placer != nil && (j.Triangle == nil || j.Triangle(cs.Remote.Addr(), sur)) && !j.isSuspended(sur) && j.Placer.Ready(sur)
	ba.Remote = remote
	if remote {
		// What reaches this host anyway (sent before the agent's install)
		// is translated here with the TSval delta the agent latches at
		// send time: taken back by the trip's estimate (half the leg's
		// RTT) plus 1 ms, so it does not run ahead of the agent's.
		ba.TSBack = uint16(min((ss.RTT/2+time.Millisecond-1)/time.Millisecond+1, 60000))
	}
	ab.Ifindex, ba.Ifindex = j.Ifindex, j.Ifindex
	if err == nil && j.Ifindex == 0 {
		ab.Ifindex, err = j.routes.ifindex(ab.Out.Dst.Addr())
		if err == nil {
			ba.Ifindex, err = j.routes.ifindex(ba.Out.Dst.Addr())
		}
	}
	if err == nil {
		err = j.Splicer.Install(ab, ba)
	}
	if err != nil {
		undo()
		return sin, nil, fmt.Errorf("%w: %v", ErrJoinRefused, err)
	}
	ph.mark(1)
	// Did a packet reach either socket between the read and the install?
	// Data or a FIN moves rcv_nxt (the receive queue is still the one
	// TCP_REPAIR_QUEUE selected in frozenState); nothing can be sent in
	// repair mode and both legs had nothing to send (Pair checked), so
	// snd_nxt cannot move. One getsockopt per leg instead of a full re-read.
	// A prepared surrogate leg is not in repair mode (its state was read
	// when pooled and cannot move, see Prepare).
	crcv, err1 := unix.GetsockoptInt(cfd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	srcv, err2 := int(ss.RcvNxt), error(nil)
	if prep == nil {
		srcv, err2 = unix.GetsockoptInt(sfd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	}
	if err1 != nil || err2 != nil || uint32(crcv) != cs.RcvNxt || uint32(srcv) != ss.RcvNxt {
		j.Splicer.Remove(ab.In)
		undo()
		return sin, nil, fmt.Errorf("%w: a leg moved during the install", ErrJoinRefused)
	}
	// The client leg stays in repair mode (closed silently by the caller);
	// the surrogate leg leaves it to send the last byte.
	if prep == nil {
		if err := setRepair(sfd, unix.TCP_REPAIR_OFF_NO_WP); err != nil {
			return sin, nil, fmt.Errorf("router: leave TCP_REPAIR: %w", err)
		}
	}
	if remote {
		// Before the request leaves: the agent's install races the
		// surrogate's answer; what leaves the surrogate before it is
		// translated here (the Remote entry), the rest there.
		j.placed.Add(1)
		p := &placement{cin: ab.In, ackAdd: ab.AckAdd, start: ba.SeqHi}
		if j.Placer.Place(sur, ba, func() { p.released.Store(true); j.release(ba.In) }) {
			pl = p
		} else {
			j.release(ba.In)
		}
	}
	ph.mark(2)
	return ba.In, pl, nil
}

// routeTTL is how long a looked-up route is reused.
const routeTTL = time.Second

// routeCache remembers the device towards an address for routeTTL: xlate's
// own lookup (a netlink round trip per entry, two per join) was the
// largest part of the join's install phase. A route changed meanwhile is
// followed within routeTTL.
type routeCache struct {
	mu sync.Mutex
	m  map[netip.Addr]cachedRoute
}

type cachedRoute struct {
	ifindex int
	at      time.Time
}

func (c *routeCache) ifindex(dst netip.Addr) (int, error) {
	now := time.Now()
	c.mu.Lock()
	r, ok := c.m[dst]
	c.mu.Unlock()
	if ok && now.Sub(r.at) < routeTTL {
		return r.ifindex, nil
	}
	idx, err := xlate.RouteIfindex(dst)
	if err != nil {
		return 0, fmt.Errorf("route to %s: %w", dst, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= 4096 {
		c.m = map[netip.Addr]cachedRoute{} // bounded: start over
	}
	c.m[dst] = cachedRoute{idx, now}
	return idx, nil
}

// phases times a join's phases (JoinTimes).
type phases struct {
	last time.Time
	d    [4]time.Duration
}

func (p *phases) start() { p.last = time.Now() }

// mark ends phase i.
func (p *phases) mark(i int) {
	now := time.Now()
	p.d[i] = now.Sub(p.last)
	p.last = now
}

// frozenState is xlate.ReadState plus the sequence numbers (the socket is
// in TCP_REPAIR mode). It leaves the receive queue selected (read last),
// which the install's check relies on.
func frozenState(fd int) (xlate.SockState, error) {
	st, err := xlate.ReadState(fd)
	if err != nil {
		return st, err
	}
	for _, q := range []struct {
		queue int
		dst   *uint32
	}{{tcpSendQueue, &st.SndNxt}, {tcpRecvQueue, &st.RcvNxt}} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q.queue); err != nil {
			return st, fmt.Errorf("TCP_REPAIR_QUEUE: %w", err)
		}
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
		if err != nil {
			return st, fmt.Errorf("TCP_QUEUE_SEQ: %w", err)
		}
		*q.dst = uint32(v)
	}
	return st, nil
}

func setRepair(fd, v int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, v)
}

// control2 runs fn with both connections' descriptors held.
func control2(a, b *net.TCPConn, fn func(fa, fb int)) error {
	ra, err := a.SyscallConn()
	if err != nil {
		return err
	}
	rb, err := b.SyscallConn()
	if err != nil {
		return err
	}
	var inner error
	err = ra.Control(func(fa uintptr) {
		inner = rb.Control(func(fb uintptr) { fn(int(fa), int(fb)) })
	})
	return errors.Join(err, inner)
}

// DelayHandshakeAck is a net.Dialer Control that delays the last ACK of
// the connection's handshake (Linux sends it with the first data or after
// its delayed-ACK maximum, 200 ms: TCP_DEFER_ACCEPT on a connecting
// socket). The router dials its handoff pool with it: the surrogate's
// first RTT sample (its handshake) is then no shorter than the handed-off
// path's, so BBR sizes the answer's window from the path the answer takes
// and not from the router-surrogate leg (docs/router.md, 1 GB). A caller
// passing its own Config.Dial sets it on its dialer.
func DelayHandshakeAck(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1)
	})
	if err := errors.Join(err, serr); err != nil {
		return fmt.Errorf("router: delay the handshake's ACK: %w", err)
	}
	return nil
}
