package xlate

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Tuple is one TCP connection as the packets arriving at this host see it:
// Src is the remote end, Dst the local one.
type Tuple struct {
	Src, Dst netip.AddrPort
}

// Reverse swaps the ends.
func (t Tuple) Reverse() Tuple { return Tuple{Src: t.Dst, Dst: t.Src} }

func (t Tuple) String() string { return t.Src.String() + "->" + t.Dst.String() }

// Entry is one direction of a join: packets arriving as In leave as Out,
// with seq + SeqAdd, ack and every SACK edge + AckAdd, the window rescaled
// from InWScale to OutWScale, and, with Timestamps, TSval moved to the out
// leg's clock (latched on the first packet from TSOffset) and TSecr moved back
// by the reverse entry's TSval delta. An Entry is plain data: Pair computes
// the two of a join from the two sockets' states, possibly captured on
// another host, and Splicer.Install installs one.
type Entry struct {
	In, Out Tuple
	SeqAdd  uint32
	AckAdd  uint32
	// Timestamps: both legs negotiated RFC 7323 timestamps.
	Timestamps bool
	// TSOffset is the out leg's timestamp clock minus CLOCK_MONOTONIC in
	// milliseconds (Linux: TSval = ms clock + per-connection offset).
	TSOffset  uint32
	InWScale  uint8
	OutWScale uint8
	// Ifindex is the device Out's packets leave from (0: decided by
	// Splicer.Install from the routing table).
	Ifindex int
	// Remote: this direction is translated at the sender's host, by its
	// egress program (InstallEgress there); packets that still arrive here
	// (sent before that entry was in place, or after it is gone) are
	// translated here too and counted (Stats.Remote) until
	// Splicer.Release.
	Remote bool
	// TSBack (ms) is taken off the TSval delta latched here: the trip of
	// a packet from its sender when the sender's egress latches the same
	// delta at send time (Remote), so both give the receiver one clock.
	TSBack uint16
	// Marks: SeqHi and AckHi start the entry's high-water marks, in In's
	// sequence space: the end of the highest segment (SYN and FIN count
	// one) and the highest ACK translated (EntryStats). Pair sets them
	// from the sockets (the next sequence number each way); without Marks
	// the first packet sets them.
	Marks        bool
	SeqHi, AckHi uint32
	// Tail: the relay's socket on the leg this entry's packets arrive
	// from still has bytes to send or to see acknowledged (an early join,
	// Handover): the program also passes each pure ACK of In to this
	// host's stack, untranslated, until one acknowledges TailEnd (that
	// socket's write_seq at the join).
	Tail    bool
	TailEnd uint32
}

// SockState is what a join needs to know about one established connection
// of the relay: its ends, the next sequence numbers both ways, the options
// negotiated and the queues.
type SockState struct {
	Local, Remote netip.AddrPort
	// State is the TCP state: established, or half-closed after the relay
	// forwarded a FIN (close-wait on the leg that received it, fin-wait-2 on
	// the leg it was forwarded to).
	State  TCPState
	SndNxt uint32 // next seq this host sends (write_seq)
	RcvNxt uint32 // next seq expected from the peer
	// Options negotiated on the SYN.
	Timestamps, SACK, WScale, USecTS bool
	SndWScale                        uint8 // shift the peer applies to the windows it sends
	RcvWScale                        uint8 // shift this host applies to the windows it sends
	// TSOffset is this socket's timestamp clock minus CLOCK_MONOTONIC ms.
	TSOffset uint32
	AdvMSS   uint32 // MSS this host announced
	SndMSS   uint32 // current send MSS (options excluded)
	// PeerMSS is the MSS the peer announced (the socket's mss_clamp: what
	// the peer accepts), readable only in TCP_REPAIR mode (0: unknown);
	// PathMSS is the largest segment the route's path MTU carries
	// (tcpi_pmtu less the IP and TCP headers; 0: unknown).
	PeerMSS, PathMSS uint32
	Unacked          uint32 // segments sent and not acknowledged
	InQ              int    // bytes received and not read
	// RmemAlloc is the memory charged to the receive side (SO_MEMINFO
	// rmem_alloc): the receive queue and the out-of-order queue. With
	// nothing readable, anything charged is data held behind a hole.
	RmemAlloc int
	// RcvWnd is the window this host offers (bytes; -1 when the kernel
	// does not say), LastDataRecv the time since data last arrived, RTT the
	// smoothed round-trip time.
	RcvWnd       int64
	LastDataRecv time.Duration
	RTT          time.Duration
	OutQ         int // bytes written and not acknowledged (unsent included)
	Unsent       int // bytes written and not sent yet
	// MinRTT is the connection's minimum RTT, DeliveryRate its latest
	// delivery rate sample (bytes/s); 0 when the kernel does not say.
	MinRTT       time.Duration
	DeliveryRate uint64
}

// TCPState is a Linux TCP state (include/net/tcp_states.h).
type TCPState uint8

// The states a join accepts.
const (
	StateEstablished TCPState = 1
	StateFinWait2    TCPState = 5
	StateCloseWait   TCPState = 8
)

// Reason says why a join was refused; it is the label of the refusal
// counters.
type Reason string

// Refusal reasons.
const (
	ReasonState       Reason = "state"       // not an established TCP connection
	ReasonBusy        Reason = "busy"        // unacknowledged, unsent or unread data
	ReasonRaced       Reason = "raced"       // data arrived while the entries were installed
	ReasonOOO         Reason = "ooo"         // a relay socket holds data out of order (behind a hole)
	ReasonFamily      Reason = "family"      // an IPv4 leg and an IPv6 leg
	ReasonTimestamps  Reason = "timestamps"  // timestamps on one leg only, or in microseconds
	ReasonSACK        Reason = "sack"        // SACK on one leg only
	ReasonMSS         Reason = "mss"         // segments of one leg would not fit the other's MSS
	ReasonRoute       Reason = "route"       // no route, or a device without the program
	ReasonMapFull     Reason = "map-full"    // no room for the entries
	ReasonExists      Reason = "exists"      // one of the tuples is already joined
	ReasonSocket      Reason = "socket"      // a socket option failed
	ReasonUnsupported Reason = "unsupported" // not Linux
)

// Reasons lists every refusal reason (for counters and docs).
var Reasons = []Reason{ReasonState, ReasonBusy, ReasonRaced, ReasonOOO, ReasonFamily, ReasonTimestamps,
	ReasonSACK, ReasonMSS, ReasonRoute, ReasonMapFull, ReasonExists, ReasonSocket, ReasonUnsupported}

// ErrEnded is returned by Handover when the flow ended while it drained it
// (FIN forwarded both ways, or a leg closed): the caller closes both
// connections as after any finished flow.
var ErrEnded = errors.New("xlate: flow ended during the handover")

// DefaultDrainPace is the Config.DrainPace of the relay's default (frozen)
// handover: the relay's socket toward a receiver paced at this fraction of
// its rate while the handover relays up to the frozen edge (session 14).
const DefaultDrainPace = 0.95

// DefaultPreDrain is the Config.PreDrain of the relay's default (frozen)
// handover: the backlog toward the receiver is drained to 1.5 in-leg RTTs
// of the flow before the sender gets its window back (its data comes back
// one in-leg RTT later; at 1.0 the backlog ran out meanwhile in some
// Fig. 3 runs: 0.89 of the rate for one interval).
const DefaultPreDrain = 1.5

// RefusedError is returned when two connections cannot be joined; both keep
// working as they were.
type RefusedError struct {
	Reason Reason
	Detail string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("xlate: join refused (%s): %s", e.Reason, e.Detail)
}

func refuse(r Reason, format string, args ...any) error {
	return &RefusedError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// Pair computes the two entries that join connection a (peer1 <-> this host)
// and b (this host <-> peer2): ab turns peer1's packets on a into packets of
// b, ba the reverse. It checks the options are compatible and both legs are
// quiescent; ifindexes are left 0.
func Pair(a, b SockState) (ab, ba Entry, err error) { return pairTail(a, b, false, false) }

// pairTail is Pair where a leg with tail set may still have bytes unsent or
// unacknowledged (its socket stays alive to deliver them: Entry.Tail).
func pairTail(a, b SockState, tailA, tailB bool) (ab, ba Entry, err error) {
	for i, s := range []SockState{a, b} {
		tail := []bool{tailA, tailB}[i]
		if s.InQ != 0 || !tail && (s.Unacked != 0 || s.OutQ != 0) {
			return ab, ba, refuse(ReasonBusy, "%s: %d segments unacknowledged, %d bytes unread, %d bytes unacknowledged or unsent",
				s.Local, s.Unacked, s.InQ, s.OutQ)
		}
		if s.USecTS {
			return ab, ba, refuse(ReasonTimestamps, "%s uses microsecond timestamps", s.Local)
		}
	}
	for _, p := range [][2]SockState{{a, b}, {b, a}} {
		if p[0].State == StateCloseWait && p[1].State != StateFinWait2 || p[0].State == StateFinWait2 && p[1].State != StateCloseWait {
			return ab, ba, refuse(ReasonState, "%s in state %d, %s in state %d: a FIN not forwarded", p[0].Local, p[0].State, p[1].Local, p[1].State)
		}
	}
	if a.Local.Addr().Is4() != b.Local.Addr().Is4() || a.Remote.Addr().Is4() != a.Local.Addr().Is4() {
		return ab, ba, refuse(ReasonFamily, "%s and %s", a.Remote, b.Remote)
	}
	if a.Timestamps != b.Timestamps {
		return ab, ba, refuse(ReasonTimestamps, "timestamps on one leg only (%v, %v)", a.Timestamps, b.Timestamps)
	}
	if a.SACK != b.SACK {
		return ab, ba, refuse(ReasonSACK, "SACK on one leg only (%v, %v)", a.SACK, b.SACK)
	}
	if !mssFits(a, b) || !mssFits(b, a) {
		return ab, ba, refuse(ReasonMSS, "advertised %d/%d, peers accept %d/%d, path MSS %d/%d, send MSS %d/%d",
			a.AdvMSS, b.AdvMSS, a.PeerMSS, b.PeerMSS, a.PathMSS, b.PathMSS, a.SndMSS, b.SndMSS)
	}
	ab = Entry{
		In:         Tuple{Src: a.Remote, Dst: a.Local},
		Out:        Tuple{Src: b.Local, Dst: b.Remote},
		SeqAdd:     b.SndNxt - a.RcvNxt,
		AckAdd:     b.RcvNxt - a.SndNxt,
		Timestamps: a.Timestamps,
		TSOffset:   b.TSOffset,
		InWScale:   a.SndWScale,
		OutWScale:  b.RcvWScale,
		Marks:      true,
		SeqHi:      a.RcvNxt,
		AckHi:      a.SndNxt,
	}
	ba = Entry{
		In:         Tuple{Src: b.Remote, Dst: b.Local},
		Out:        Tuple{Src: a.Local, Dst: a.Remote},
		SeqAdd:     a.SndNxt - b.RcvNxt,
		AckAdd:     a.RcvNxt - b.SndNxt,
		Timestamps: b.Timestamps,
		TSOffset:   a.TSOffset,
		InWScale:   b.SndWScale,
		OutWScale:  a.RcvWScale,
		Marks:      true,
		SeqHi:      b.RcvNxt,
		AckHi:      b.SndNxt,
	}
	if tailA && (a.OutQ != 0 || a.Unacked != 0) {
		ab.Tail, ab.TailEnd = true, a.SndNxt
	}
	if tailB && (b.OutQ != 0 || b.Unacked != 0) {
		ba.Tail, ba.TailEnd = true, b.SndNxt
	}
	return ab, ba, nil
}

// mssFits says whether the segments the peer of in may send after a join fit
// the leg out: that peer sends at most the MSS this host announced on in
// (in.AdvMSS, plus the timestamp option's 12 bytes, which Linux takes off
// tcpi_advmss on one side of a connection only); after the join they cross
// out's path to out's peer, so they must fit what that peer accepts (the MSS
// it announced, out.PeerMSS) and out's path MTU (out.PathMSS). This host's
// own send MSS on out does not matter: on lo it is capped at half the peer's
// largest window (32768 of 65483), not by what the peer accepts, which
// refused every join there before session 12. When PeerMSS is unknown (a
// state read outside repair mode) the send MSS stands in for it, as before.
func mssFits(in, out SockState) bool {
	opt := uint32(0)
	if in.Timestamps {
		opt = 12
	}
	limit := out.PeerMSS
	if limit == 0 {
		limit = out.SndMSS
	}
	if out.PathMSS != 0 {
		limit = min(limit, out.PathMSS)
	}
	return in.AdvMSS <= limit+opt
}
