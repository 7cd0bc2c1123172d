//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

//go:generate go tool bpf2go -tags linux -target bpfel -type tuple -type entry -type freeze xlate xlate.c -- -mcpu=v3 -O2 -g -Wall -I/usr/include/x86_64-linux-gnu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Supported reports whether this build carries the program.
const Supported = true

// Config configures a Splicer.
type Config struct {
	// Interfaces the program is attached to (tcx ingress): every device
	// where packets of joined connections arrive. Empty: every up,
	// non-loopback device of the network namespace at Open.
	Interfaces []string
	// MaxEntries bounds the number of entries (two per join); 0 means 65536.
	MaxEntries int
	// IdleTimeout removes the entries of a join that saw no packet for
	// that long; 0 means 5 minutes.
	IdleTimeout time.Duration
	// CloseLinger removes the entries of a join this long after FIN both
	// ways or a RST; 0 means 10 s (retransmitted FINs and last ACKs still
	// find their entry).
	CloseLinger time.Duration
	// SweepInterval is how often entries are checked; 0 means 1 s.
	SweepInterval time.Duration
	// NoKick skips the window probes sent to both peers after a join (for
	// experiments that show what they prevent: a sender stalled by a zero
	// window waits for its persist timer).
	NoKick bool
	// NoReopen keeps the relay's receive windows closed at the join (for
	// experiments): by default a handover's join drops the forwarded
	// bytes from both sockets' receive queues before the window probes, so
	// each probe tells its peer the window is open again and a stalled
	// sender resumes after one one-way trip instead of waiting for the
	// other peer's answer to be translated.
	NoReopen bool
	// NoRcvbufCap leaves the relay's receive buffers as they are during a
	// handover (for experiments): by default they are cut to what they
	// hold plus a margin for the window already offered, so each sender
	// stops soon after the handover starts (Handover, capRcvbuf).
	NoRcvbufCap bool
	// noOOOCheck skips the out-of-order check of a join (oooHeld; tests
	// show what it prevents).
	noOOOCheck bool
	// Tail lets a handover join while a leg still delivers a tail (an
	// early join: at most about one RTT of the stopped sender's leg still
	// to send, see tailReady; that socket stays open until its tail is
	// acknowledged, the program passing it the peer's pure ACKs), so the
	// stopped sender's new data arrives about as the tail ends. Opt-in
	// (session 11): it shortened Fig. 3's BBR stall 2-4x but did not meet
	// the 0.9x target, and Handover waits (up to 30 s) for a pure ACK of
	// the tail, which a peer that starts sending data after the join may
	// not give. Without it, a handover waits until each leg's send queue
	// is acknowledged before the join.
	Tail bool
	// RaiseWindow makes each of the join's window probes offer the other
	// peer's free window (past the relay's tail) instead of what the
	// relay's socket computes (its receive buffer, cut during the
	// handover). The peer ignores the other peer's translated ACKs while
	// they acknowledge less than the relay already did, so until then it
	// sends only into that probe's window. Experimental (session 11): in
	// Fig. 3 a BBR sender given the large window at once ran at 0.35-0.65x
	// after the join in 2 of 2 runs without a tail.
	RaiseWindow bool
	// Freeze makes a handover stop each sender at the right edge of the
	// window the relay offered when it began (session 12): the program,
	// attached at egress too, lowers the window of the relay's own packets
	// on both legs so that ack + window never passes the edge of the first
	// of them (it never shrinks an offered edge), until the join's window
	// probes. Without it the handover cuts the receive buffers
	// (capRcvbuf), and the kernel goes on offering small windows from the
	// room left: a BBR sender was fed 56 -> 2 KB steps for ~600 ms, its
	// delivery samples collapsed for ~12 rounds and its max filter forgot
	// its rate (Fig. 3, session 11). A frozen sender stops within about one
	// RTT and, with nothing delivered, BBR's rounds and filters stand
	// still. Opt-in. With PinDir the egress links are not pinned: a
	// freeze lives only during a handover of this process.
	Freeze bool
	// DrainPace, with Freeze, caps the pacing of the relay's socket toward
	// each receiver at this fraction of the rate it delivers at
	// (SO_MAX_PACING_RATE, TCP's internal pacing) from the handover's
	// start until its tail is sent: the bottleneck queue the relay's own
	// sender kept full drains while the handover relays up to the frozen
	// edge, so the resumed sender's first joined round finds room there
	// (see drainPace). 0: off; the relay's default handover uses
	// DefaultDrainPace.
	DrainPace float64
	// FirstRound, with Freeze, caps the window the join's probe offers a
	// stopped sender at this fraction of the joined path's BDP (the flow's
	// rate x both legs' minimum RTTs): what it may send in its first
	// joined round, before the other peer's ACKs of its own data come
	// back (see firstRound). 0: off (the relay's socket's window, its
	// whole receive buffer). Experimental (session 14): at 0.9 it did not
	// stop the resumed BBR sender's first round from overflowing its own
	// link's queue at 100 ms in Fig. 3 (docs/offload.md).
	FirstRound float64
	// PreDrain, with Freeze, first drains the relay's backlog toward a
	// receiver to PreDrain x one in-leg RTT of the flow (see preDrain): the
	// sender into the in-leg is held to a small window (at most 8 in-leg
	// RTTs) until the backlog is down to that, then runs about 4 in-leg
	// RTTs to a frozen edge that close, and the join comes before it
	// stops there. 0: off; the relay's default handover uses
	// DefaultPreDrain (session 15, Fig. 3 at 100 ms).
	PreDrain float64
	// PinDir, when set, pins the maps and the tcx links there (on a bpffs;
	// below DefaultBPFFS it is mounted when absent): joined flows then
	// survive the process, and Open adopts the pins an earlier process
	// left. Close removes them. See pin_linux.go.
	PinDir string
	// Egress also attaches the program at tcx egress of the interfaces:
	// entries installed with InstallEgress then translate this host's own
	// packets as they leave (a surrogate's agent in the request router's
	// surrogate-side placement, docs/router.md). Not with PinDir.
	Egress bool
	Log    *slog.Logger
}

// Splicer owns the loaded program, its maps and attachments in one network
// namespace.
type Splicer struct {
	cfg  Config
	log  *slog.Logger
	objs xlateObjects
	// ifaces the program is attached to: ifindex -> L3 device.
	ifaces map[int]bool
	links  []link.Link

	mu    sync.Mutex // serializes joins and installs
	pairs map[Tuple]Tuple
	// singles are entries installed alone (InstallEgress).
	singles map[Tuple]bool
	// held are silent (TCP_REPAIR) sockets that keep a joined tuple taken,
	// by In tuple (pin_linux.go).
	held map[Tuple]int

	adopted       int
	reserveFailed atomic.Uint64

	joined  atomic.Uint64
	removed atomic.Uint64
	refused map[Reason]*atomic.Uint64

	cancel context.CancelFunc
	done   chan struct{}
}

// Open loads the program, attaches it to the configured interfaces of the
// calling thread's network namespace and starts the sweeper (stopped by
// Close or ctx).
func Open(ctx context.Context, cfg Config) (*Splicer, error) {
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = 65536
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.CloseLinger == 0 {
		cfg.CloseLinger = 10 * time.Second
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Egress && cfg.PinDir != "" {
		return nil, errors.New("xlate: Egress with PinDir is not supported")
	}
	spec, err := loadXlate()
	if err != nil {
		return nil, err
	}
	spec.Maps["joins"].MaxEntries = uint32(cfg.MaxEntries)
	s := &Splicer{cfg: cfg, log: log, ifaces: map[int]bool{}, pairs: map[Tuple]Tuple{}, singles: map[Tuple]bool{}, held: map[Tuple]int{},
		refused: map[Reason]*atomic.Uint64{}, done: make(chan struct{})}
	for _, r := range Reasons {
		s.refused[r] = new(atomic.Uint64)
	}
	ifs, err := pickInterfaces(cfg.Interfaces)
	if err != nil {
		return nil, err
	}
	if cfg.PinDir != "" {
		if err := ensureBPFFS(cfg.PinDir, log); err != nil {
			return nil, err
		}
		if err := s.loadPinned(spec, cfg.PinDir); err != nil {
			return nil, err
		}
	} else if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("xlate: load program: %w", err)
	}
	keep := map[string]bool{}
	for _, ifi := range ifs {
		// No link-layer address: a TUN device (L3). lo has none either
		// (all zeros) but carries an Ethernet header.
		l3 := len(ifi.HardwareAddr) == 0 && ifi.Flags&net.FlagLoopback == 0
		prog := s.objs.XlateEth
		if l3 {
			prog = s.objs.XlateL3
		}
		var l link.Link
		if cfg.PinDir != "" {
			l, err = s.attachPinned(ifi.Index, ifi.Name, prog)
			keep[linkPin(cfg.PinDir, ifi.Index, ifi.Name)] = true
		} else {
			l, err = link.AttachTCX(link.TCXOptions{Interface: ifi.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
		}
		if err != nil {
			s.closeObjs()
			return nil, fmt.Errorf("xlate: attach to %s: %w", ifi.Name, err)
		}
		s.links = append(s.links, l)
		s.ifaces[ifi.Index] = l3
		if cfg.Egress || cfg.Freeze {
			eprog := s.objs.XlateEthEgress
			if l3 {
				eprog = s.objs.XlateL3Egress
			}
			el, err := link.AttachTCX(link.TCXOptions{Interface: ifi.Index, Program: eprog, Attach: ebpf.AttachTCXEgress})
			if err != nil {
				s.closeObjs()
				return nil, fmt.Errorf("xlate: attach to %s egress: %w", ifi.Name, err)
			}
			s.links = append(s.links, el)
		}
	}
	if cfg.PinDir != "" {
		s.dropStaleLinks(keep)
		s.adopted = s.adopt()
	}
	ctx, s.cancel = context.WithCancel(ctx)
	go s.sweeper(ctx)
	log.Info("xlate attached", "interfaces", len(ifs), "max_entries", cfg.MaxEntries, "pin_dir", cfg.PinDir, "adopted", s.adopted)
	return s, nil
}

// newUnattached loads the program without attaching it (tests running it
// with BPF_PROG_TEST_RUN).
func newUnattached(maxEntries int) (*Splicer, error) {
	spec, err := loadXlate()
	if err != nil {
		return nil, err
	}
	spec.Maps["joins"].MaxEntries = uint32(maxEntries)
	s := &Splicer{log: slog.New(slog.DiscardHandler), ifaces: map[int]bool{}, pairs: map[Tuple]Tuple{}, singles: map[Tuple]bool{}, held: map[Tuple]int{},
		refused: map[Reason]*atomic.Uint64{}, done: make(chan struct{})}
	for _, r := range Reasons {
		s.refused[r] = new(atomic.Uint64)
	}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("xlate: load program: %w", err)
	}
	close(s.done)
	return s, nil
}

func pickInterfaces(names []string) ([]net.Interface, error) {
	if len(names) > 0 {
		var out []net.Interface
		for _, n := range names {
			ifi, err := net.InterfaceByName(n)
			if err != nil {
				return nil, fmt.Errorf("xlate: interface %q: %w", n, err)
			}
			out = append(out, *ifi)
		}
		return out, nil
	}
	all, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("xlate: list interfaces: %w", err)
	}
	var out []net.Interface
	for _, ifi := range all {
		if ifi.Flags&net.FlagLoopback != 0 || ifi.Flags&net.FlagUp == 0 {
			continue
		}
		out = append(out, ifi)
	}
	if len(out) == 0 {
		return nil, errors.New("xlate: no interface to attach to")
	}
	return out, nil
}

// Close detaches the program, removes its pins and every entry: joined
// connections that are still live then reach this host's stack, which has
// no socket for them and answers with a RST.
func (s *Splicer) Close() error {
	if s.cancel != nil {
		s.cancel()
	}
	<-s.done
	s.unpinAll()
	s.closeObjs()
	s.mu.Lock()
	for t, fd := range s.held {
		unix.Close(fd)
		delete(s.held, t)
	}
	s.mu.Unlock()
	return nil
}

// closeObjs closes this process's handles (pinned objects stay).
func (s *Splicer) closeObjs() {
	for _, l := range s.links {
		l.Close()
	}
	s.links = nil
	s.objs.Close()
}

func (s *Splicer) sweeper(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sweep(monoNow())
		}
	}
}

// sweep removes joins idle for IdleTimeout, and those that saw FIN both ways
// or a RST and were then idle for CloseLinger.
func (s *Splicer) sweep(now time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for in, rev := range s.pairs {
		if in.Src.Compare(rev.Src) > 0 { // visit each pair once
			continue
		}
		var e1, e2 xlateEntry
		k1, k2 := tupleKey(in), tupleKey(rev)
		if s.objs.Joins.Lookup(&k1, &e1) != nil || s.objs.Joins.Lookup(&k2, &e2) != nil {
			s.removePair(in, rev)
			n++
			continue
		}
		last := max(e1.LastNs, e2.LastNs)
		idle := now - time.Duration(last)
		closed := (e1.Flags&fFIN != 0 && e2.Flags&fFIN != 0) || (e1.Flags|e2.Flags)&fRST != 0
		// A direction translated at the peer's egress (fRemote) shows no
		// FIN here: the other direction's FIN (or RST) then closes it.
		if e1.Flags&fRemote != 0 {
			closed = e2.Flags&(fFIN|fRST) != 0
		} else if e2.Flags&fRemote != 0 {
			closed = e1.Flags&(fFIN|fRST) != 0
		}
		if idle > s.cfg.IdleTimeout || (closed && idle > s.cfg.CloseLinger) {
			s.removePair(in, rev)
			n++
		}
	}
	for in := range s.singles {
		var e xlateEntry
		k := tupleKey(in)
		if s.objs.Joins.Lookup(&k, &e) != nil {
			delete(s.singles, in)
			n++
			continue
		}
		idle := now - time.Duration(e.LastNs)
		if idle > s.cfg.IdleTimeout || (e.Flags&(fFIN|fRST) != 0 && idle > s.cfg.CloseLinger) {
			s.objs.Joins.Delete(&k)
			delete(s.singles, in)
			s.removed.Add(1)
			n++
		}
	}
	return n
}

func (s *Splicer) removePair(a, b Tuple) {
	for _, t := range []Tuple{a, b} {
		k := tupleKey(t)
		s.objs.Joins.Delete(&k)
		delete(s.pairs, t)
		if fd, ok := s.held[t]; ok {
			unix.Close(fd) // in repair mode: silent
			delete(s.held, t)
		}
	}
	s.removed.Add(1)
}

const (
	fTS       = 1
	fTSvalSet = 2
	fTSecrSet = 4
	fFIN      = 8
	fRST      = 16
	fHold     = 32
	fRemote   = 64
	fMarks    = 128
	fTail     = 256
)

func tupleKey(t Tuple) xlateTuple {
	k := xlateTuple{Family: 4}
	src, dst := t.Src.Addr(), t.Dst.Addr()
	if src.Is4() {
		a, b := src.As4(), dst.As4()
		copy(k.Saddr[:], a[:])
		copy(k.Daddr[:], b[:])
	} else {
		k.Family = 6
		a, b := src.As16(), dst.As16()
		copy(k.Saddr[:], a[:])
		copy(k.Daddr[:], b[:])
	}
	k.Sport = htons(t.Src.Port())
	k.Dport = htons(t.Dst.Port())
	return k
}

func keyTuple(k xlateTuple) Tuple {
	var src, dst netip.Addr
	if k.Family == 4 {
		src = netip.AddrFrom4([4]byte(k.Saddr[:4]))
		dst = netip.AddrFrom4([4]byte(k.Daddr[:4]))
	} else {
		src = netip.AddrFrom16(k.Saddr)
		dst = netip.AddrFrom16(k.Daddr)
	}
	return Tuple{Src: netip.AddrPortFrom(src, ntohs(k.Sport)), Dst: netip.AddrPortFrom(dst, ntohs(k.Dport))}
}

// htons converts a port to the network-order value the program compares
// with the packet's bytes read as a little-endian u16.
func htons(p uint16) uint16 { return p<<8 | p>>8 }
func ntohs(p uint16) uint16 { return p<<8 | p>>8 }

func (e Entry) value() xlateEntry {
	v := xlateEntry{
		Out:       tupleKey(e.Out),
		SeqAdd:    e.SeqAdd,
		AckAdd:    e.AckAdd,
		TsOff:     e.TSOffset,
		Ifindex:   uint32(e.Ifindex),
		InWscale:  e.InWScale,
		OutWscale: e.OutWScale,
		TsBack:    e.TSBack,
	}
	if e.Marks {
		v.Flags |= fMarks
		v.SeqHi, v.AckHi = e.SeqHi, e.AckHi
	}
	if e.Timestamps {
		v.Flags |= fTS
	}
	if e.Remote {
		v.Flags |= fRemote
	}
	if e.Tail {
		v.Flags |= fTail
		v.TailEnd = e.TailEnd
	}
	return v
}

// Install installs the two entries of a join (as computed by Pair, possibly
// from states captured on another host). Entries with Ifindex 0 get the
// device of the route to their Out destination. Nothing is installed if one
// fails.
func (s *Splicer) Install(ab, ba Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.install(ab, ba)
}

func (s *Splicer) install(ab, ba Entry) error { return s.installHeld(ab, ba, false) }

// installHeld installs both entries; with hold they drop their packets
// until unhold (Join's two-phase install).
func (s *Splicer) installHeld(ab, ba Entry, hold bool) (err error) {
	for _, e := range []*Entry{&ab, &ba} {
		if e.Ifindex == 0 {
			idx, err := routeIfindex(e.Out.Dst.Addr())
			if err != nil {
				return refuse(ReasonRoute, "%v", err)
			}
			e.Ifindex = idx
		}
		if s.links != nil {
			if _, ok := s.ifaces[e.Ifindex]; !ok {
				return refuse(ReasonRoute, "%s leaves from ifindex %d, which has no xlate program", e.Out, e.Ifindex)
			}
		}
	}
	k1, k2 := tupleKey(ab.In), tupleKey(ba.In)
	v1, v2 := ab.value(), ba.value()
	// A new entry counts as active now: with LastNs 0 a sweep between the
	// install and the first packet found it idle since boot and removed it
	// (the router's handoff lost ~1% of its sessions that way).
	v1.LastNs = uint64(monoNow())
	v2.LastNs = v1.LastNs
	if hold {
		v1.Flags |= fHold
		v2.Flags |= fHold
		defer func() {
			if err != nil {
				s.unhold(ab, ba)
			}
		}()
		var one uint8 = 1
		for _, k := range []*xlateTuple{&k1, &k2} {
			if err := s.objs.Holds.Update(k, &one, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("xlate: hold %s: %w", ab.In, err)
			}
		}
	}
	if err := s.objs.Joins.Update(&k1, &v1, ebpf.UpdateNoExist); err != nil {
		return installErr(ab.In, err)
	}
	if err := s.objs.Joins.Update(&k2, &v2, ebpf.UpdateNoExist); err != nil {
		s.objs.Joins.Delete(&k1)
		return installErr(ba.In, err)
	}
	s.pairs[ab.In] = ba.In
	s.pairs[ba.In] = ab.In
	return nil
}

// unhold ends the hold of a join's entries (installHeld): the program
// translates from the next packet on (it clears the entries' hold flag
// itself, atomically, since it writes to live entries).
func (s *Splicer) unhold(ab, ba Entry) {
	for _, t := range []Tuple{ab.In, ba.In} {
		k := tupleKey(t)
		s.objs.Holds.Delete(&k)
	}
}

func installErr(t Tuple, err error) error {
	switch {
	case errors.Is(err, ebpf.ErrKeyExist):
		return refuse(ReasonExists, "%s is already joined", t)
	case errors.Is(err, unix.E2BIG):
		return refuse(ReasonMapFull, "no room for %s: %v", t, err)
	}
	return fmt.Errorf("xlate: install %s: %w", t, err)
}

// Remove removes a join by either of its In tuples. Packets of the
// connections then reach this host's stack again, which has no socket for
// them and answers with a RST.
func (s *Splicer) Remove(in Tuple) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	rev, ok := s.pairs[in]
	if !ok {
		return false
	}
	s.removePair(in, rev)
	return true
}

// Splice is one installed join.
type Splice struct {
	AB, BA Entry
	// Phases of the handover that made it (zero after a plain Join).
	Phases Phases
	s      *Splicer
	// tails are relay sockets still delivering their tails (an early
	// join): Handover waits for them and closes them silently.
	tails []*net.TCPConn
}

// EntryStats are the counters of one entry.
type EntryStats struct {
	Packets, Bytes uint64
	LastPacket     time.Duration // CLOCK_MONOTONIC
	TSLatched      bool
	FIN, RST       bool
	// SeqHi and AckHi are the entry's high-water marks in In's sequence
	// space (Entry.Marks): the end of the highest segment and the highest
	// ACK translated so far; valid when Marks.
	Marks        bool
	SeqHi, AckHi uint32
}

// Stats returns both directions' counters; ok is false once the join was
// removed.
func (sp *Splice) Stats() (ab, ba EntryStats, ok bool) {
	var e1, e2 xlateEntry
	k1, k2 := tupleKey(sp.AB.In), tupleKey(sp.BA.In)
	if sp.s.objs.Joins.Lookup(&k1, &e1) != nil || sp.s.objs.Joins.Lookup(&k2, &e2) != nil {
		return ab, ba, false
	}
	return entryStats(e1), entryStats(e2), true
}

func entryStats(e xlateEntry) EntryStats {
	return EntryStats{Packets: e.Packets, Bytes: e.Bytes, LastPacket: time.Duration(e.LastNs),
		TSLatched: e.Flags&fTSvalSet != 0, FIN: e.Flags&fFIN != 0, RST: e.Flags&fRST != 0,
		Marks: e.Flags&fMarks != 0, SeqHi: e.SeqHi, AckHi: e.AckHi}
}

// Stats are a Splicer's counters.
type Stats struct {
	Joined, Removed uint64
	Active          int // installed joins
	// Adopted joins were found pinned by Open; Held sockets keep joined
	// tuples taken, ReserveFailed counts tuples that could not be.
	Adopted, Held int
	ReserveFailed uint64
	Refused       map[Reason]uint64
	// Singles are entries installed alone (InstallEgress).
	Singles int
	// From the program, summed over CPUs. Egress counts the packets
	// translated by the egress program, Remote those that arrived at an
	// entry translated at the sender's egress (Entry.Remote: translated
	// here too), RemoteData those of them with a payload. Tail counts
	// ACKs also passed to a relay socket still sending its tail after an
	// early join (Entry.Tail). HeldDrops counts packets dropped while a
	// join was being installed (its entries hold until the sockets' state
	// is checked; their senders retransmit them).
	Packets, Bytes, Redirected, Passed, Errors, Latched, Egress, Remote, RemoteData, Tail, HeldDrops uint64
}

// Stats returns the counters.
func (s *Splicer) Stats() Stats {
	st := Stats{Joined: s.joined.Load(), Removed: s.removed.Load(), Refused: map[Reason]uint64{}}
	for r, c := range s.refused {
		st.Refused[r] = c.Load()
	}
	s.mu.Lock()
	st.Active = len(s.pairs) / 2
	st.Singles = len(s.singles)
	st.Adopted, st.Held = s.adopted, len(s.held)
	s.mu.Unlock()
	st.ReserveFailed = s.reserveFailed.Load()
	vals := make([]uint64, 11)
	for i := range vals {
		var per []uint64
		if err := s.objs.Counters.Lookup(uint32(i), &per); err == nil {
			for _, v := range per {
				vals[i] += v
			}
		}
	}
	st.Packets, st.Bytes, st.Redirected, st.Passed, st.Errors, st.Latched, st.Egress, st.Remote, st.RemoteData, st.Tail, st.HeldDrops = vals[0], vals[1], vals[2], vals[3], vals[4], vals[5], vals[6], vals[7], vals[8], vals[9], vals[10]
	return st
}

// isRefusal says whether err is a refusal for reason r.
func isRefusal(err error, r Reason) bool {
	var re *RefusedError
	return errors.As(err, &re) && re.Reason == r
}

func (s *Splicer) count(err error) error {
	var re *RefusedError
	if errors.As(err, &re) {
		s.refused[re.Reason].Add(1)
	}
	return err
}

// Join joins two established connections of this host, a (peer1 <-> here)
// and b (here <-> peer2), into one connection peer1 <-> peer2: it checks
// both are quiescent (nothing unacknowledged, unsent or unread) and their
// options compatible, installs the two entries, then closes both sockets
// in TCP_REPAIR mode, so neither peer sees a FIN or a RST. On a
// RefusedError both connections are left as they were. The caller must not
// use a or b concurrently; after a successful Join both are closed.
func (s *Splicer) Join(a, b *net.TCPConn) (*Splice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, err := s.join(a, b, 0, 0, [2]bool{})
	if err != nil {
		return nil, s.count(err)
	}
	s.joined.Add(1)
	return sp, nil
}

// join joins a and b; fwdA and fwdB are bytes still in a's and b's
// receive queues that the caller already forwarded (peeked and written to
// the other leg). A leg with tail set may still have bytes to send or to
// see acknowledged: its socket is then left open, out of repair mode, in
// Splice.tails (Handover waits for it and closes it silently).
func (s *Splicer) join(a, b *net.TCPConn, fwdA, fwdB int, tail [2]bool) (*Splice, error) {
	ra, err := a.SyscallConn()
	if err != nil {
		return nil, refuse(ReasonSocket, "%v", err)
	}
	rb, err := b.SyscallConn()
	if err != nil {
		return nil, refuse(ReasonSocket, "%v", err)
	}
	var sa, sb SockState
	var ab, ba Entry
	var joinErr error
	// Hold both fds for the whole sequence.
	cerr := ra.Control(func(fa uintptr) {
		cerr := rb.Control(func(fb uintptr) {
			joinErr = s.joinFDs(int(fa), int(fb), fwdA, fwdB, tail, &sa, &sb, &ab, &ba)
			if joinErr == nil {
				s.hold(ab.In, int(fa))
				s.hold(ba.In, int(fb))
			}
		})
		if cerr != nil && joinErr == nil {
			joinErr = refuse(ReasonSocket, "%v", cerr)
		}
	})
	if cerr != nil && joinErr == nil {
		joinErr = refuse(ReasonSocket, "%v", cerr)
	}
	if joinErr != nil {
		return nil, joinErr
	}
	// Both sockets are in repair mode (but a tail's): close sends neither
	// FIN nor RST.
	sp := &Splice{AB: ab, BA: ba, s: s}
	for _, l := range []struct {
		c    *net.TCPConn
		tail bool
	}{{a, ab.Tail}, {b, ba.Tail}} {
		if l.tail {
			sp.tails = append(sp.tails, l.c)
		} else {
			l.c.Close()
		}
	}
	s.log.Debug("joined", "a", ab.In, "b", ba.In, "tails", len(sp.tails))
	return sp, nil
}

func (s *Splicer) joinFDs(fa, fb, fwdA, fwdB int, tail [2]bool, sa, sb *SockState, ab, ba *Entry) (err error) {
	// A first look without repair mode: cheap refusals leave no trace.
	if *sa, err = readForwarded(fa, false, fwdA); err != nil {
		return err
	}
	if *sb, err = readForwarded(fb, false, fwdB); err != nil {
		return err
	}
	// (The MSS check waits for repair mode, where the peers' MSS can be
	// read: outside it only the send MSS stands in, which refuses joins on
	// lo; see mssFits.)
	if _, _, err := pairTail(*sa, *sb, tail[0], tail[1]); err != nil && !isRefusal(err, ReasonMSS) {
		return err
	}
	// Freeze: repair mode, then the sequence numbers.
	if err := setRepair(fa, 1); err != nil {
		return refuse(ReasonSocket, "TCP_REPAIR: %v", err)
	}
	if err := setRepair(fb, 1); err != nil {
		setRepair(fa, unix.TCP_REPAIR_OFF_NO_WP)
		return refuse(ReasonSocket, "TCP_REPAIR: %v", err)
	}
	undo := func() {
		setRepair(fa, unix.TCP_REPAIR_OFF_NO_WP)
		setRepair(fb, unix.TCP_REPAIR_OFF_NO_WP)
	}
	if *sa, err = readForwarded(fa, true, fwdA); err == nil {
		*sb, err = readForwarded(fb, true, fwdB)
	}
	if err == nil {
		*ab, *ba, err = pairTail(*sa, *sb, tail[0], tail[1])
	}
	if err == nil {
		err = s.installHeld(*ab, *ba, true)
	}
	if err != nil {
		undo()
		return err
	}
	// The entries hold: the program drops the connections' packets (their
	// senders retransmit them), so the sockets' state is frozen and nothing
	// is translated yet. Anything the sockets received between the read and
	// the install shows as a change: then the entries go away with nothing
	// translated, and the relay goes on from a consistent state. (Rolling
	// back entries that had already translated packets left the two legs'
	// sequence spaces apart: the flow stalled until reset.)
	// (Only what the check compares: the packets dropped meanwhile are
	// retransmitted by their senders, so this read is kept short.)
	a2, err1 := readSeqs(fa, fwdA)
	b2, err2 := readSeqs(fb, fwdB)
	// A tail's send queue may shrink meanwhile (ACKs of it): its write_seq,
	// which the entries use, cannot move.
	if ab.Tail {
		a2.OutQ = 0
	}
	if ba.Tail {
		b2.OutQ = 0
	}
	rollback := func(err error) error {
		s.removePair(ab.In, ba.In)
		s.unhold(*ab, *ba)
		s.removed.Add(^uint64(0))
		undo()
		return err
	}
	if err1 != nil || err2 != nil || a2.RcvNxt != sa.RcvNxt || b2.RcvNxt != sb.RcvNxt ||
		a2.SndNxt != sa.SndNxt || b2.SndNxt != sb.SndNxt || a2.InQ+b2.InQ+a2.OutQ+b2.OutQ != 0 {
		return rollback(refuse(ReasonRaced, "state moved during the install (%v %v)", err1, err2))
	}
	// Data held out of order behind a hole is in neither queue read above
	// (TCP_REPAIR shows the in-order queue only), but its sender saw it
	// SACKed: joined, the sender would take the other peer's ACKs below
	// it as SACK reneging and recover only when its reneging timer fires
	// (an RTO's cost: its window back to one segment). Not yet: the hole
	// fills within about one RTT (see oooHeld).
	for _, c := range []struct {
		st, now SockState
		fwd     int
	}{{*sa, a2, fwdA}, {*sb, b2, fwdB}} {
		if why := s.oooHeld(c.st, c.now, c.fwd); why != "" {
			return rollback(refuse(ReasonOOO, "%s: %s", c.st.Local, why))
		}
	}
	// Consistent: from here the program translates.
	s.unhold(*ab, *ba)
	// Kick both peers: leaving repair mode with TCP_REPAIR_OFF sends a
	// window probe (an old sequence number), which each peer answers at once
	// with an ACK; the program turns that ACK into a window update for the
	// other peer. A sender stalled by the relay's closed window (the
	// handover drains it that way) resumes after one trip instead of
	// waiting for its persist timer. Then back into repair mode for a
	// silent close.
	//
	// A tail's socket leaves repair mode for good: it goes on sending its
	// tail, and the program passes it the peer's ACKs (Entry.Tail).
	//
	// With Config.RaiseWindow each probe offers the other peer's free
	// window (past the relay's tail) in this leg's sequence space.
	// Frozen windows (Config.Freeze) end here: the probes below carry
	// the sockets' own windows. A frozen sender waits at a zero window,
	// and the probe (one byte before snd_una) would only make it answer;
	// so on a leg with nothing of its own to send the program turns the
	// probe into a plain ACK (probe_seq), whose window the sender takes.
	for i, st := range []*SockState{sa, sb} {
		if s.cfg.Freeze && st.OutQ == 0 && st.Unacked == 0 {
			other, otherFD := sb, fb
			if i == 1 {
				other, otherFD = sa, fa
			}
			w := s.firstRound(*st, otherFD, *other)
			s.fixProbe(*st, w)
			if w > 0 {
				s.log.Debug("join: first round capped", "leg", i, "window", w, "min_rtt", st.MinRTT, "other_min_rtt", other.MinRTT)
			}
		} else {
			s.thaw(*st)
		}
	}
	defer s.thaw(*sa)
	defer s.thaw(*sb)
	wins := [2]uint32{}
	for i, fd := range []int{fa, fb} {
		w, err := getRepairWindow(fd)
		outq, err2 := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		if err == nil && err2 == nil && w.SndWnd > uint32(outq) {
			wins[i] = w.SndWnd - uint32(outq)
		}
	}
	for i, l := range []struct {
		fd, fwd int
		tail    bool
		wscale  uint8
	}{{fa, fwdA, ab.Tail, sa.RcvWScale}, {fb, fwdB, ba.Tail, sb.RcvWScale}} {
		if s.cfg.NoKick && !l.tail {
			continue
		}
		if l.fwd > 0 && !s.cfg.NoReopen && setRepair(l.fd, unix.TCP_REPAIR_OFF_NO_WP) == nil {
			// Out of repair mode, drop what was forwarded: the window
			// opens, and the probe below carries it.
			unix.SetsockoptInt(l.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, -1)
			dropQueued(l.fd, l.fwd)
			setRepair(l.fd, 1)
		}
		if !s.cfg.NoReopen && s.cfg.RaiseWindow {
			raiseWindow(l.fd, min(wins[1-i], 65535<<l.wscale))
		}
		if s.log.Enabled(context.Background(), slog.LevelDebug) {
			w, _ := getRepairWindow(l.fd)
			st, _ := readState(l.fd, false)
			s.log.Debug("join: leg", "leg", i, "tail", l.tail, "other_free_wnd", wins[1-i], "rcv_wnd", w.RcvWnd, "snd_wnd", w.SndWnd,
				"outq", st.OutQ, "unsent", st.Unsent, "rate", st.DeliveryRate, "min_rtt", st.MinRTT)
		}
		off := unix.TCP_REPAIR_OFF
		if s.cfg.NoKick {
			off = unix.TCP_REPAIR_OFF_NO_WP
		}
		if setRepair(l.fd, off) == nil && !l.tail {
			setRepair(l.fd, 1)
		}
	}
	// Fill ifindexes as installed.
	k1 := tupleKey(ab.In)
	var v xlateEntry
	if s.objs.Joins.Lookup(&k1, &v) == nil {
		ab.Ifindex = int(v.Ifindex)
	}
	k2 := tupleKey(ba.In)
	if s.objs.Joins.Lookup(&k2, &v) == nil {
		ba.Ifindex = int(v.Ifindex)
	}
	return nil
}

// raiseWindow makes fd (in repair mode) offer at least want bytes past its
// rcv_nxt in its next segment (Linux never shrinks an offered window, so
// the window probe carries it).
func raiseWindow(fd int, want uint32) {
	w, err := getRepairWindow(fd)
	if err != nil {
		return
	}
	var q [2]uint32
	for i, queue := range []int{tcpRecvQueue} {
		if unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, queue) != nil {
			return
		}
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
		if err != nil {
			return
		}
		q[i] = uint32(v)
	}
	rcvNxt := q[0]
	if w.RcvWup+w.RcvWnd-rcvNxt >= want {
		return
	}
	w.RcvWup, w.RcvWnd = rcvNxt, want
	setRepairWindow(fd, w)
}

// dropQueued consumes n received bytes of fd (MSG_TRUNC: TCP discards
// them without copying).
func dropQueued(fd, n int) {
	buf := make([]byte, min(n, 256<<10))
	for n > 0 {
		m, _, err := unix.Recvfrom(fd, buf[:min(n, len(buf))], unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		if err != nil || m <= 0 {
			return
		}
		n -= m
	}
}

// hold keeps a joined socket's tuple taken (pin_linux.go).
func (s *Splicer) hold(in Tuple, fd int) {
	d, err := holdFD(fd)
	if err != nil {
		s.reserveFailed.Add(1)
		s.log.Warn("xlate: cannot hold a joined socket", "tuple", in, "err", err)
		return
	}
	s.held[in] = d
}

// readForwarded reads a socket's state, counting fwd bytes of its receive
// queue as consumed (they were forwarded already); more unread bytes than
// that stay visible in InQ.
func readForwarded(fd int, repair bool, fwd int) (SockState, error) {
	st, err := readState(fd, repair)
	if err != nil {
		return st, err
	}
	if st.InQ == fwd {
		st.InQ = 0
	} else if st.InQ > fwd {
		st.InQ -= fwd
	}
	return st, nil
}

// freezeKey is the tuple of a socket's own packets as they leave.
func freezeKey(st SockState) xlateTuple { return tupleKey(Tuple{Src: st.Local, Dst: st.Remote}) }

// freeze starts freezing the window st's socket offers (Config.Freeze):
// the program latches the right edge of its next packet and keeps every
// later one within it.
func (s *Splicer) freeze(st SockState) error {
	k := freezeKey(st)
	v := xlateFreeze{Wscale: st.RcvWScale}
	if err := s.objs.Freezes.Update(&k, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("xlate: freeze %s: %w", st.Local, err)
	}
	return nil
}

// frozenState reads a freeze: whether its edge is latched, whether the
// socket acknowledged every byte up to it (the sender has nothing left to
// send before the join), and how many bytes the sender may still send.
func (s *Splicer) frozenState(st SockState) (latched, reached bool, left uint32) {
	k := freezeKey(st)
	var v xlateFreeze
	if s.objs.Freezes.Lookup(&k, &v) != nil || v.Set == 0 || v.Fix != 0 {
		return false, false, 0
	}
	if d := int32(v.Edge - v.Ack); d > 0 {
		return true, false, uint32(d)
	}
	return true, true, 0
}

// fixProbe makes the program send st's socket's next window probe as a
// plain ACK (Config.Freeze; the socket has nothing unacknowledged, so its
// snd_una is SndNxt).
//
// window > 0 caps the window the probe offers at that many bytes past
// the socket's rcv_nxt (Config.FirstRound).
func (s *Splicer) fixProbe(st SockState, window uint32) {
	k := freezeKey(st)
	v := xlateFreeze{Fix: 1, ProbeSeq: st.SndNxt - 1}
	if window > 0 {
		v.Set, v.Edge, v.Wscale = 1, st.RcvNxt+window, st.RcvWScale
	}
	s.objs.Freezes.Update(&k, &v, ebpf.UpdateAny)
}

// firstRound is the window the join's probe offers the sender into the
// socket in (Config.FirstRound): FirstRound x the flow's rate (what the
// other leg, out, delivers at) x the joined path's minimum RTT; 0: no cap.
//
// Why (Fig. 3, session 14): after the join the sender gets no ACK it can
// use for one joined RTT (the other peer's translated ACKs are below what
// the relay acknowledged until its own resumed data is acknowledged), so
// it sends open loop at the pacing gain it had when it stopped: a BBR
// sender stopped at the frozen edge in its 1.25x phase (the phase ends
// only once its inflight reaches 1.25 BDP, which a stopped sender never
// does) put its whole window, about the joined BDP, onto the path at
// 1.25x: a quarter of a joined RTT of queue on its first link, more than
// the 20 ms queue at 100 ms, and its drops cost a joined RTT.
func (s *Splicer) firstRound(in SockState, outFD int, out SockState) uint32 {
	if s.cfg.FirstRound <= 0 || in.MinRTT == 0 || out.MinRTT == 0 {
		return 0
	}
	rate := paceRate(outFD, out)
	w := s.cfg.FirstRound * float64(rate) * (in.MinRTT + out.MinRTT).Seconds()
	if w < 64<<10 {
		return 0 // too little data to bother (and never a window below 64 KB)
	}
	return uint32(min(w, 1<<30))
}

// oooHeld says why a socket may hold data out of order ("" : it does not
// as far as this host can see). st is its state read at the join, now the
// held re-read (no packet reaches it any more), fwd the bytes of its
// receive queue already forwarded. Two signs:
//   - Config.Freeze: the program saw the socket's last packet carry a SACK
//     block past its ACK (struct freeze's ooo, set at egress): exact, also
//     with bytes in the receive queue.
//   - otherwise, with nothing in the receive queue (nothing forwarded and
//     nothing unread) on an established socket: memory still charged to
//     its receive side (SO_MEMINFO rmem_alloc) is the out-of-order queue.
//     With bytes in the receive queue their own charge hides it: not seen
//     (docs/offload.md, "Join: preconditions").
func (s *Splicer) oooHeld(st, now SockState, fwd int) string {
	if s.cfg.noOOOCheck {
		return ""
	}
	if s.cfg.Freeze {
		var v xlateFreeze
		k := freezeKey(st)
		if s.objs.Freezes.Lookup(&k, &v) == nil && v.Set != 0 && v.Ooo != 0 {
			return "its last ACK carried a SACK block past it"
		}
	}
	if fwd == 0 && now.InQ == 0 && st.State == StateEstablished && now.RmemAlloc > 0 {
		return fmt.Sprintf("nothing readable, %d bytes charged to its receive side", now.RmemAlloc)
	}
	return ""
}

// thaw ends a freeze (none: no-op).
func (s *Splicer) thaw(st SockState) {
	k := freezeKey(st)
	s.objs.Freezes.Delete(&k)
}

// readSeqs reads what a held join compares (a socket in repair mode): the
// sequence numbers and the queues, fwd bytes of the receive queue counted
// as consumed (readForwarded).
func readSeqs(fd, fwd int) (SockState, error) {
	var st SockState
	err := readQueueSeqs(fd, &st)
	if err != nil {
		return st, err
	}
	if st.InQ, err = unix.IoctlGetInt(fd, unix.SIOCINQ); err != nil {
		return st, refuse(ReasonSocket, "SIOCINQ: %v", err)
	}
	if st.OutQ, err = unix.IoctlGetInt(fd, unix.SIOCOUTQ); err != nil {
		return st, refuse(ReasonSocket, "SIOCOUTQ: %v", err)
	}
	st.RmemAlloc, _, _ = meminfo(fd)
	if st.InQ == fwd {
		st.InQ = 0
	} else if st.InQ > fwd {
		st.InQ -= fwd
	}
	return st, nil
}
