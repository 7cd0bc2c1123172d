// Package xlate joins two established TCP connections of this host into one
// by translating packets in the kernel: an eBPF program on the tc/tcx ingress
// hook rewrites every packet of connection A (peer1 <-> this host) into a
// packet of connection B (this host <-> peer2) and redirects it out, and the
// reverse, so that peer1 and peer2 talk end to end while this host's sockets
// are gone. It is the offload of a split-TCP relay after slow start (MOSTO,
// seed 000, Sec. IV-C) and the TCP handoff of transparent redirection (seed
// 004): both only need "join any two established connections".
//
// Translation of one direction (an Entry): addresses and ports, seq + SeqAdd,
// ack and every SACK edge (1-4 blocks) + AckAdd, all modulo 2^32; the window
// from the sender's scale to the scale the receiver expects (saturating at
// 65535); TSval moved onto the clock of the socket the receiver knew (the
// delta is latched on the first packet, so the receiver's PAWS check passes),
// TSecr moved back by the reverse direction's delta (0, which Linux reads as
// "no echo", until that delta is known); checksums updated incrementally
// (bpf_csum_diff + bpf_l3/l4_csum_replace, which also keeps CHECKSUM_PARTIAL
// and CHECKSUM_COMPLETE packets right). Packets leave with
// bpf_redirect_neigh (Ethernet devices) or bpf_redirect (TUN devices, the
// xlate_l3 program).
//
// API, from the most general to the most convenient:
//   - Pair(a, b SockState) computes the two entries from two sockets' states
//     (ReadState reads one; SndNxt/RcvNxt need TCP_REPAIR). It is pure, so the
//     states may come from another host: a request router can capture its
//     client connection, ship the entries to a surrogate and Install them there.
//   - Splicer.Install(ab, ba) installs a pair (ifindexes from the routing table
//     when 0), Splicer.Remove removes it.
//   - Splicer.Join(a, b *net.TCPConn) does it all on this host: checks both
//     connections are established, quiescent (nothing unacknowledged, unsent
//     or unread) and compatible (timestamps and SACK on both or neither, no
//     microsecond timestamps, same family, MSS that fit), freezes them with
//     TCP_REPAIR, reads the sequence numbers, installs the entries, checks
//     nothing moved meanwhile, then closes both sockets in repair mode so
//     neither peer sees a FIN or a RST. A refusal is a *RefusedError with a
//     Reason and leaves both connections working.
//
// Egress (surrogate-side placement of the request router's handoff): with
// Config.Egress the program also runs at tcx egress (xlate_*_egress), and
// InstallEgress installs one direction alone on the host whose own packets
// it translates (a surrogate's answer to the router's pooled connection
// leaves as the router's packet to the client). On the router's host that
// direction's entry is installed with Entry.Remote: what still reaches the
// router (sent before the surrogate's install) is translated there too and
// counted (Stats.Remote, RemoteData); Release ends the counting when the
// router takes the direction back (the fallback). Every entry keeps
// high-water marks (EntryStats.SeqHi/AckHi: the end of the highest segment
// and the highest ACK it translated), from which the router tells whether
// the client acknowledged answer bytes that never crossed it. Packets that
// match no entry return TCX_NEXT, so several instances (two routers in one
// namespace) chain on one device.
//
// Lifetime: entries live in a hash map (Config.MaxEntries; a full map refuses
// new joins with ReasonMapFull instead of evicting live ones). A sweeper
// removes a pair IdleTimeout after its last packet, or CloseLinger after FIN
// both ways or a RST. Removing an entry under a live flow (Remove, Close, the
// sweeper) hands its packets back to this host's stack, which has no socket
// for them and answers with a RST: the flow ends cleanly, never silently.
// With Config.PinDir the maps and tcx links are pinned in bpffs, so entries
// keep translating after the process dies (a killed relay's flows go on);
// Open with the same PinDir adopts them, Close removes the pins. While a
// join lives, silent TCP_REPAIR sockets keep its tuples taken, so a new
// connection of this host cannot reuse the local port (pin_linux.go).
//
// Freeze (Config.Freeze, opt-in, session 12): the program also runs at
// egress and, during a Handover, lowers the window of the relay's own packets
// on both legs so that ack + window never passes the edge latched from the
// first of them (map freezes): each sender stops at the window already
// offered instead of being fed small windows from a cut receive buffer. The
// join is tried once a frozen sender has about one RTT of its leg left, and
// the join's window probe on a leg with nothing to send leaves as a plain ACK
// (seq + 1), whose window the sender takes.
//
// Counters: Splicer.Stats (joined, removed, refused by reason, and from the
// program packets, bytes, redirected, passed-as-malformed, errors, timestamp
// latches) and Splice.Stats (per direction).
//
// BPF convention (docs/design.md): the program is xlate.c (//go:build
// ignore), generated by `go generate` (bpf2go, pinned in go.mod's tool block)
// into xlate_bpfel.go/.o, which are committed so that go build needs no
// clang; xlate_default.go says "not supported" elsewhere; tests run the
// program with BPF_PROG_TEST_RUN (prog.Run) on crafted packets without
// attaching it, and Join on real sockets in namespaces. See docs/offload.md.
package xlate
