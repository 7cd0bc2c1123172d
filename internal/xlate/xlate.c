//go:build ignore

// xlate: joins two established TCP connections of this host into one by
// translating every packet of one into a packet of the other (tc/tcx ingress,
// direct action). See doc.go for the model; the layout of struct tuple and
// struct entry is mirrored by the Go side (bpf2go generates xlateTuple and
// xlateEntry from the BTF of this file).

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char __license[] SEC("license") = "Dual MIT/GPL";

// A TCP connection as seen in one packet: addresses in network order (IPv4 in
// the first 4 bytes), ports in network order.
struct tuple {
	__u8 family; // 4 or 6
	__u8 pad0;
	__be16 sport;
	__be16 dport;
	__u16 pad1;
	__u8 saddr[16];
	__u8 daddr[16];
};

// Entry flags.
#define F_TS 1          // both legs use timestamps: translate TSval/TSecr
#define F_TSVAL_SET 2   // tsval_add is latched
#define F_TSECR_SET 4   // tsecr_sub is known (written by the reverse entry)
#define F_FIN 8         // a FIN went through
#define F_RST 16        // a RST went through
#define F_HOLD 32       // being installed: see holds
#define F_REMOTE 64     // translated at the sender's egress (surrogate-side
                        // placement): what still arrives here is counted
#define F_MARKS 128     // seq_hi and ack_hi hold values (else the first
                        // packet sets them)
#define F_TAIL 256      // the relay's socket of the other leg still sends
                        // its tail (bytes before tail_end): pure ACKs up
                        // to tail_end also go to it, untranslated

// The mark of a packet the program passed to this host's stack itself (a
// clone of an ACK for a relay socket's tail): when it comes back through
// the ingress hook it is not translated again.
#define TAIL_MARK 0x786c7431 // "xlt1"

// One direction of a join: packets whose tuple is the map key are rewritten
// into packets of out and sent from ifindex.
struct entry {
	struct tuple out;
	__u32 seq_add;   // added to seq
	__u32 ack_add;   // added to ack and to every SACK edge
	__u32 ts_off;    // out leg's timestamp offset: its TSval = ms clock + ts_off
	__u32 tsval_add; // added to TSval once latched
	__u32 tsecr_sub; // subtracted from TSecr once set
	__u32 ifindex;   // where out's packets leave
	__u8 in_wscale;  // shift the sender applies to its window field
	__u8 out_wscale; // shift the receiver expects
	__u16 ts_back;   // ms taken off the latched TSval delta (F_REMOTE: the
	                 // packet's trip from the sender, whose egress latches
	                 // the same delta at send time)
	__u32 flags;
	// High-water marks in the sender's (in) sequence space: the end of the
	// highest segment (payload, SYN and FIN counted) and the highest ACK
	// that went through. The request router compares them across a join's
	// two entries to see whether a client acknowledged bytes that did not
	// cross this host (docs/router.md, surrogate-side placement).
	__u32 seq_hi;
	__u32 ack_hi;
	// With F_TAIL: the relay socket's next sequence number (its write_seq
	// at the join, in In's ACK space). ACKs before it, and the first at or
	// after it, are cloned to the stack for that socket; then F_TAIL goes.
	__u32 tail_end;
	__u64 last_ns;   // bpf_ktime_get_ns of the last packet
	__u64 packets;
	__u64 bytes;     // TCP payload bytes
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct tuple);
	__type(value, struct entry);
} joins SEC(".maps");

// Entries being installed (Join's two phases): while an entry with F_HOLD
// has its key here, its packets are dropped; the first packet after the key
// was deleted clears F_HOLD (atomically: userspace cannot) and is
// translated.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct tuple);
	__type(value, __u8);
} holds SEC(".maps");

// A frozen window (Handover with Config.Freeze): the relay's own packets
// on one of its sockets, as they leave (egress), offer at most up to the
// right edge latched from the first of them (ack + window << wscale), so
// the sender into that socket stops within about one RTT at the edge
// offered when the handover began, instead of being fed small windows by a
// receive buffer that still has room. Never shrinks an edge already
// offered (the first packet's is kept; Linux never offers less itself).
struct freeze {
	__u32 edge;   // latched right edge (sequence space of the peer's data)
	__u32 ack;    // highest ACK the relay sent since (bytes received)
	__u8 wscale;  // the shift the relay applies to the windows it sends
	__u8 set;     // edge latched
	__u8 fix;     // the join's window probe: see probe_seq
	__u8 ooo;     // the relay's last packet carried a SACK block past its
	              // ACK: its socket holds data out of order (a hole)
	__u32 clamped; // packets whose window was lowered
	// With fix: the socket's window probe (a pure ACK one byte before
	// snd_una, which the peer discards as out of window and only answers)
	// leaves with seq probe_seq + 1, i.e. as a plain ACK whose window the
	// peer takes: the sender stopped at the edge resumes one trip after
	// the join, not after the other peer has acknowledged the tail.
	// With fix and set, that window reaches at most up to edge (the
	// resumed sender's first joined round, Config.FirstRound): until the
	// other peer's translated ACKs pass what the relay acknowledged, one
	// joined RTT later, it is all the sender may send.
	__u32 probe_seq;
	// hold > 0 (a pre-drain, Config.PreDrain): every packet offers at
	// most hold bytes past its own ACK (a window that slides with what the
	// relay received), nothing is latched; the relay clears it to freeze.
	__u32 hold;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tuple);
	__type(value, struct freeze);
} freezes SEC(".maps");

// Counters indexed by enum ctr (per CPU).
enum ctr {
	C_PACKETS = 0,
	C_BYTES,
	C_REDIRECTED,
	C_SHORT,   // a matched packet too short or malformed: passed to the stack
	C_ERRORS,  // a helper failed: dropped
	C_LATCHED, // TSval deltas latched
	C_EGRESS,  // packets translated by an egress program
	C_REMOTE,  // packets of an F_REMOTE entry that arrived here
	C_REMOTE_DATA, // those of them with a payload (a lost race's answer)
	C_TAIL,    // ACKs cloned to a relay socket's tail (F_TAIL)
	C_HELD,    // packets dropped by a join being installed (F_HOLD)
	C_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// Scratch space for the old and the new TCP header; map values allow the
// variable offsets of option walking. new starts at 64, the tail is slack for
// accesses past a short header (bounded at run time by doff).
struct scratch {
	__u8 old[64];
	__u8 new[64];
	__u8 slack[64];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratchmap SEC(".maps");

static __always_inline void count(__u32 c, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &c);
	if (v)
		*v += n;
}

// raise sets *m to v when v is after *m in sequence space (wrap-safe); a
// compare-and-swap, as two CPUs may translate one entry's packets at once.
static __always_inline void raise(__u32 *m, __u32 v)
{
	for (int i = 0; i < 4; i++) {
		__u32 old = *m;
		if ((__s32)(v - old) <= 0)
			return;
		if (__sync_val_compare_and_swap(m, old, v) == old)
			return;
	}
}

static __always_inline __u32 get32(const __u8 *p)
{
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | (__u32)p[3];
}

static __always_inline void put32(__u8 *p, __u32 v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

// sack_beyond says whether the SACK option of a relay's own packet (its
// TCP header at toff, doff bytes) has a block that ends after ack: the
// socket holds that data out of order, behind a hole it has not received.
// (A D-SACK block, reporting a duplicate below ack, does not count; one
// above ack lies in the next block, which does.) Linux puts its SACK
// blocks on every segment while its out-of-order queue is not empty and
// acknowledges at once when a hole fills, so the last packet the socket
// sent says whether it holds such data now.
static __always_inline int sack_beyond(struct __sk_buff *skb, __u32 toff, __u32 doff, __u32 ack)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratchmap, &zero);
	if (!s || doff <= 20 || doff > 60)
		return 0;
	if (bpf_skb_load_bytes(skb, toff, s->old, doff) < 0)
		return 0;
	__u8 *h = s->old;
	__u32 o = 20;
	for (int i = 0; i < 40; i++) {
		if (o >= doff)
			break;
		o &= 63;
		__u8 kind = h[o];
		if (kind == 0) // EOL
			break;
		if (kind == 1) { // NOP
			o++;
			continue;
		}
		if (o + 1 >= doff)
			break;
		__u32 len = h[(o + 1) & 63];
		if (len < 2 || o + len > doff)
			break;
		if (kind == 5 && len >= 10) {
			__u8 *b = h + (o & 63) + 2;
			for (int j = 0; j < 4; j++) {
				if (2 + 8 * (j + 1) > len)
					break;
				if ((__s32)(get32(b + 8 * j + 4) - ack) > 0)
					return 1;
			}
			return 0;
		}
		o += len;
	}
	return 0;
}

// NEXT is returned for every packet that is not ours: tcx runs the next
// program (TCX_NEXT; another xlate instance in the same namespace, e.g. a
// second router) and passes the packet after the last; cls_bpf reads it as
// TC_ACT_UNSPEC (continue).
#define NEXT TC_ACT_UNSPEC

static __always_inline int xlate(struct __sk_buff *skb, __u32 l2len, int egress)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct tuple key = {};
	__u32 ipoff = l2len, toff, iplen;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + ipoff;
		if ((void *)(ip + 1) > data_end)
			return NEXT;
		if (ip->protocol != IPPROTO_TCP || ip->ihl != 5)
			return NEXT;
		if (ip->frag_off & bpf_htons(0x3fff)) // fragment
			return NEXT;
		key.family = 4;
		__builtin_memcpy(key.saddr, &ip->saddr, 4);
		__builtin_memcpy(key.daddr, &ip->daddr, 4);
		toff = ipoff + sizeof(*ip);
		iplen = bpf_ntohs(ip->tot_len);
		if (iplen < sizeof(*ip))
			return NEXT;
		iplen -= sizeof(*ip);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + ipoff;
		if ((void *)(ip6 + 1) > data_end)
			return NEXT;
		if (ip6->nexthdr != IPPROTO_TCP)
			return NEXT;
		key.family = 6;
		__builtin_memcpy(key.saddr, &ip6->saddr, 16);
		__builtin_memcpy(key.daddr, &ip6->daddr, 16);
		toff = ipoff + sizeof(*ip6);
		iplen = bpf_ntohs(ip6->payload_len);
	} else {
		return NEXT;
	}
	struct tcphdr *tcp = data + toff;
	if ((void *)(tcp + 1) > data_end)
		return NEXT;
	if (!egress && skb->mark == TAIL_MARK) {
		// Our own clone for a relay socket (see F_TAIL): to the stack.
		skb->mark = 0;
		return NEXT;
	}
	key.sport = tcp->source;
	key.dport = tcp->dest;

	if (egress && tcp->ack) {
		struct freeze *f = bpf_map_lookup_elem(&freezes, &key);
		if (f && f->fix) {
			__u32 seq = bpf_ntohl(tcp->seq);
			if (seq == f->probe_seq && iplen == (__u32)tcp->doff * 4 && !(tcp->syn || tcp->fin || tcp->rst)) {
				__be32 olds = tcp->seq, news = bpf_htonl(seq + 1);
				// (Read before the stores: packet pointers are invalid
				// after one.)
				__u32 ack = bpf_ntohl(tcp->ack_seq);
				__be16 oldw = tcp->window;
				__u16 w16 = bpf_ntohs(oldw);
				if (bpf_skb_store_bytes(skb, toff + 4, &news, 4, 0) < 0 ||
				    bpf_l4_csum_replace(skb, toff + 16, olds, news, 4) < 0) {
					count(C_ERRORS, 1);
					return TC_ACT_SHOT;
				}
				if (f->set && (__s32)(ack + ((__u32)w16 << (f->wscale & 15)) - f->edge) > 0) {
					__u32 room = (__s32)(f->edge - ack) > 0 ? f->edge - ack : 0;
					__be16 neww = bpf_htons(room >> (f->wscale & 15));
					if (bpf_skb_store_bytes(skb, toff + 14, &neww, 2, 0) < 0 ||
					    bpf_l4_csum_replace(skb, toff + 16, oldw, neww, 2) < 0) {
						count(C_ERRORS, 1);
						return TC_ACT_SHOT;
					}
				}
				__sync_fetch_and_add(&f->clamped, 1);
			}
			return NEXT;
		}
		if (f) {
			__u32 ack = bpf_ntohl(tcp->ack_seq);
			__u16 w16 = bpf_ntohs(tcp->window);
			__u32 tdoff = (__u32)tcp->doff * 4;
			// (Loads from the packet: the pointers stay valid.)
			f->ooo = sack_beyond(skb, toff, tdoff, ack);
			__u32 edge = ack + ((__u32)w16 << (f->wscale & 15));
			__u32 hold = f->hold;
			if (hold) {
				// (ack 0: none seen yet; raise() compares in
				// sequence space, where 0 may be ahead.)
				if (!f->ack)
					f->ack = ack;
				else
					raise(&f->ack, ack);
				if ((__s32)(edge - (ack + hold)) > 0) {
					__u16 nw = hold >> (f->wscale & 15);
					if (nw == 0)
						nw = 1;
					__be16 oldw = tcp->window, neww = bpf_htons(nw);
					if (bpf_skb_store_bytes(skb, toff + 14, &neww, 2, 0) < 0 ||
					    bpf_l4_csum_replace(skb, toff + 16, oldw, neww, 2) < 0) {
						count(C_ERRORS, 1);
						return TC_ACT_SHOT;
					}
					__sync_fetch_and_add(&f->clamped, 1);
				}
			} else if (!f->set) {
				f->edge = edge;
				f->ack = ack;
				f->set = 1;
			} else {
				raise(&f->ack, ack);
				if ((__s32)(edge - f->edge) > 0) {
					__u32 room = (__s32)(f->edge - ack) > 0 ? f->edge - ack : 0;
					__u16 nw = room >> (f->wscale & 15);
					__be16 oldw = tcp->window, neww = bpf_htons(nw);
					// (The window field: 14 bytes into the TCP header.)
					if (bpf_skb_store_bytes(skb, toff + 14, &neww, 2, 0) < 0 ||
					    bpf_l4_csum_replace(skb, toff + 16, oldw, neww, 2) < 0) {
						count(C_ERRORS, 1);
						return TC_ACT_SHOT;
					}
					__sync_fetch_and_add(&f->clamped, 1);
				}
			}
			// (Packet pointers are invalid after a store: none is used
			// below; a frozen socket is not joined at the same time.)
			return NEXT;
		}
	}

	struct entry *e = bpf_map_lookup_elem(&joins, &key);
	if (!e)
		return NEXT;
	// A SYN without ACK opens a new connection: the joined flow on this
	// tuple is over (an entry lingers after FIN both ways, and a client
	// that closed passively may reuse its port at once). Translated, it
	// and the request after it reached the other leg's peer as a new
	// connection from the old tuple (the next relay refused a hop header
	// it did not find: the client saw a reset). The entry goes (the
	// sweeper then removes its pair and frees the relay's reserved
	// sockets) and the SYN goes to this host's stack.
	if (tcp->syn && !tcp->ack) {
		bpf_map_delete_elem(&joins, &key);
		return NEXT;
	}
	// The surrogate's agent translates this direction at its egress; a
	// packet arriving here left the surrogate before the agent's entry was
	// in place (or the agent is gone). It is translated here too, its
	// TSval delta latched ts_back ms lower, i.e. as at its send time, as
	// the agent's egress latches it: the client sees one clock.
	if (e->flags & F_REMOTE) {
		count(C_REMOTE, 1);
		if (iplen > (__u32)tcp->doff * 4)
			count(C_REMOTE_DATA, 1);
	}
	// A join being installed: the relay's sockets are frozen and compared
	// with the state the entries were computed from. A packet passed to
	// them now would go unnoticed if the join then goes on; one
	// translated would be lost to them if it is rolled back. Dropped, it
	// is retransmitted into whichever side wins.
	if (e->flags & F_HOLD) {
		if (bpf_map_lookup_elem(&holds, &key)) {
			count(C_HELD, 1);
			return TC_ACT_SHOT;
		}
		__sync_fetch_and_and(&e->flags, ~F_HOLD);
	}

	__u32 doff = tcp->doff * 4;
	if (doff < 20 || doff > 60 || iplen < doff) {
		count(C_SHORT, 1);
		return TC_ACT_OK;
	}
	// The relay's socket of the other leg still owns a tail of bytes it
	// sent (or has yet to send) before the join: it needs this peer's
	// ACKs for them, to retransmit what is lost and to send what is left.
	// A pure ACK goes to it as well (a clone, untranslated), until one
	// acknowledges the whole tail. Segments with a payload are not cloned:
	// the socket would acknowledge data that belongs to the joined flow.
	if (!egress && (e->flags & F_TAIL) && iplen == doff && !(tcp->syn || tcp->fin || tcp->rst) && tcp->ack) {
		__u32 ack = bpf_ntohl(tcp->ack_seq);
		__u32 mark = skb->mark;
		// An ACK past the tail (the joined flow's bytes that followed it
		// were received too: a sender that never stopped, Config.Freeze)
		// acknowledges data that socket never sent, which it would drop:
		// its copy acknowledges exactly the tail.
		__be32 olda = tcp->ack_seq, taila = bpf_htonl(e->tail_end);
		int over = (__s32)(ack - e->tail_end) > 0;
		if (over && (bpf_skb_store_bytes(skb, toff + 8, &taila, 4, 0) < 0 ||
			     bpf_l4_csum_replace(skb, toff + 16, olda, taila, 4) < 0))
			goto fail;
		skb->mark = TAIL_MARK;
		if (bpf_clone_redirect(skb, skb->ifindex, BPF_F_INGRESS) == 0)
			count(C_TAIL, 1);
		else
			count(C_ERRORS, 1);
		skb->mark = mark;
		if (over && (bpf_skb_store_bytes(skb, toff + 8, &olda, 4, 0) < 0 ||
			     bpf_l4_csum_replace(skb, toff + 16, taila, olda, 4) < 0))
			goto fail;
		if ((__s32)(ack - e->tail_end) >= 0)
			__sync_fetch_and_and(&e->flags, ~F_TAIL);
		// (Packet pointers are invalid after a clone: none is used below.)
	}
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratchmap, &zero);
	if (!s)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, toff, s->old, doff) < 0) {
		count(C_SHORT, 1);
		return TC_ACT_OK;
	}
	__builtin_memcpy(s->new, s->old, 64);
	__u8 *h = s->new;
	__u8 fl = h[13];
	__u64 now = bpf_ktime_get_ns();

	// Ports, seq, ack.
	__builtin_memcpy(h, &e->out.sport, 2);
	__builtin_memcpy(h + 2, &e->out.dport, 2);
	put32(h + 4, get32(h + 4) + e->seq_add);
	if (fl & 0x10) // ACK
		put32(h + 8, get32(h + 8) + e->ack_add);

	// Window, from the sender's scale to the receiver's.
	__u32 win = ((__u32)h[14] << 8) | h[15];
	win = (win << e->in_wscale) >> e->out_wscale;
	if (win > 0xffff)
		win = 0xffff;
	h[14] = win >> 8;
	h[15] = win;

	// Options: SACK edges and timestamps.
	__u32 o = 20;
	for (int i = 0; i < 40; i++) {
		if (o >= doff)
			break;
		o &= 63;
		__u8 kind = h[o];
		if (kind == 0) // EOL
			break;
		if (kind == 1) { // NOP
			o++;
			continue;
		}
		if (o + 1 >= doff)
			break;
		__u32 len = h[(o + 1) & 63];
		if (len < 2 || o + len > doff)
			break;
		if (kind == 5 && len >= 10) { // SACK: up to 4 blocks
			__u8 *b = h + (o & 63) + 2;
			for (int j = 0; j < 4; j++) {
				if (2 + 8 * (j + 1) > len)
					break;
				put32(b + 8 * j, get32(b + 8 * j) + e->ack_add);
				put32(b + 8 * j + 4, get32(b + 8 * j + 4) + e->ack_add);
			}
		} else if (kind == 8 && len == 10 && (e->flags & F_TS)) {
			__u8 *t = h + (o & 63) + 2;
			__u32 tsval = get32(t);
			if (!(e->flags & F_TSVAL_SET)) {
				// Latch on the first packet: its TSval becomes the out
				// leg's clock now, which the receiver's PAWS accepts.
				__u32 clk = (__u32)(now / 1000000) + e->ts_off;
				__u32 add = clk - tsval + 1 - e->ts_back;
				e->tsval_add = add;
				__sync_fetch_and_or(&e->flags, F_TSVAL_SET);
				struct tuple rk = {};
				rk.family = e->out.family;
				rk.sport = e->out.dport;
				rk.dport = e->out.sport;
				__builtin_memcpy(rk.saddr, e->out.daddr, 16);
				__builtin_memcpy(rk.daddr, e->out.saddr, 16);
				struct entry *r = bpf_map_lookup_elem(&joins, &rk);
				if (r) {
					r->tsecr_sub = add;
					__sync_fetch_and_or(&r->flags, F_TSECR_SET);
				}
				count(C_LATCHED, 1);
			}
			put32(t, tsval + e->tsval_add);
			__u32 tsecr = get32(t + 4);
			if (e->flags & F_TSECR_SET)
				tsecr -= e->tsecr_sub;
			else
				tsecr = 0; // unknown yet: 0 makes the receiver skip its RTT sample
			put32(t + 4, tsecr);
		}
		o += len;
	}

	if (fl & 0x01)
		__sync_fetch_and_or(&e->flags, F_FIN);
	if (fl & 0x04)
		__sync_fetch_and_or(&e->flags, F_RST);

	__u32 csum_off = toff + 16;
	__s64 diff = bpf_csum_diff((__be32 *)s->old, doff, (__be32 *)s->new, doff, 0);
	if (diff < 0)
		goto fail;
	if (bpf_skb_store_bytes(skb, toff, s->new, doff, BPF_F_RECOMPUTE_CSUM) < 0)
		goto fail;
	if (bpf_l4_csum_replace(skb, csum_off, 0, diff, 0) < 0)
		goto fail;

	// Addresses: the pseudo header of TCP, and the IPv4 header checksum.
	__be32 oa[8] = {}, na[8] = {};
	if (key.family == 4) {
		__builtin_memcpy(oa, key.saddr, 4);
		__builtin_memcpy(oa + 1, key.daddr, 4);
		__builtin_memcpy(na, e->out.saddr, 4);
		__builtin_memcpy(na + 1, e->out.daddr, 4);
		diff = bpf_csum_diff(oa, 8, na, 8, 0);
		if (diff < 0)
			goto fail;
		if (bpf_skb_store_bytes(skb, ipoff + 12, na, 8, BPF_F_RECOMPUTE_CSUM) < 0)
			goto fail;
		if (bpf_l3_csum_replace(skb, ipoff + 10, 0, diff, 0) < 0)
			goto fail;
	} else {
		__builtin_memcpy(oa, key.saddr, 16);
		__builtin_memcpy(oa + 4, key.daddr, 16);
		__builtin_memcpy(na, e->out.saddr, 16);
		__builtin_memcpy(na + 4, e->out.daddr, 16);
		diff = bpf_csum_diff(oa, 32, na, 32, 0);
		if (diff < 0)
			goto fail;
		if (bpf_skb_store_bytes(skb, ipoff + 8, na, 32, BPF_F_RECOMPUTE_CSUM) < 0)
			goto fail;
	}
	if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR) < 0)
		goto fail;

	__u64 payload = iplen - doff;
	__u32 seq_end = get32(s->old + 4) + (__u32)payload + (fl & 0x01) + ((fl >> 1) & 1);
	__u32 ack = get32(s->old + 8);
	if (!(e->flags & F_MARKS)) {
		e->seq_hi = seq_end;
		e->ack_hi = ack;
		__sync_fetch_and_or(&e->flags, F_MARKS);
	} else {
		raise(&e->seq_hi, seq_end);
		if (fl & 0x10)
			raise(&e->ack_hi, ack);
	}
	e->last_ns = now;
	__sync_fetch_and_add(&e->packets, 1);
	__sync_fetch_and_add(&e->bytes, payload);
	count(C_PACKETS, 1);
	count(C_BYTES, payload);
	if (egress) {
		count(C_EGRESS, 1);
		// Leaving by the device it was going out of anyway, on an L3
		// device: no neighbour to resolve, no redirect (which would run
		// this hook again).
		if (!l2len && e->ifindex == skb->ifindex)
			return TC_ACT_OK;
	}
	count(C_REDIRECTED, 1);
	if (!l2len) // an L3 device (TUN) has no neighbours to resolve
		return bpf_redirect(e->ifindex, 0);
	return bpf_redirect_neigh(e->ifindex, NULL, 0, 0);

fail:
	count(C_ERRORS, 1);
	return TC_ACT_SHOT;
}

// xlate_eth runs on Ethernet devices (veth, physical NICs).
SEC("tc")
int xlate_eth(struct __sk_buff *skb)
{
	return xlate(skb, ETH_HLEN, 0);
}

// xlate_l3 runs on devices without a link-layer header (TUN, as used by the
// emulator); it redirects with bpf_redirect, so the out device must be one
// too.
SEC("tc")
int xlate_l3(struct __sk_buff *skb)
{
	return xlate(skb, 0, 0);
}

// xlate_eth_egress and xlate_l3_egress run on the egress of the devices of
// a host whose own packets are translated (a surrogate answering a session
// a request router handed off: its answer, addressed to the router, leaves
// as the router's packet to the client). Same entries and map; the reverse
// direction's entry lives on the router's host, so the TSval delta latched
// here is not written to it.
SEC("tc")
int xlate_eth_egress(struct __sk_buff *skb)
{
	return xlate(skb, ETH_HLEN, 1);
}

SEC("tc")
int xlate_l3_egress(struct __sk_buff *skb)
{
	return xlate(skb, 0, 1);
}
