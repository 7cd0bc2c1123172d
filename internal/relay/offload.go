package relay

// Stage: offload. Once a flow has left slow start (or moved enough bytes)
// the relay leaves its data path: the copies pause, xlate.Handover brings
// both connections to the quiescent point and joins them in the kernel
// (internal/xlate), and the flow ends here with outcome "offloaded" while its
// packets keep flowing through the eBPF translation. A refused handover
// resumes the copies; nothing is lost either way.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/mosto-net/mosto/internal/metrics"
	"github.com/mosto-net/mosto/internal/xlate"
	"golang.org/x/sys/unix"
)

// OffloadConfig is the `offload:` section.
type OffloadConfig struct {
	// Mode: "off" (default), "slow-start" (after the flow's sending leg
	// left slow start: ssthresh set, or cwnd grew less than 1.5x in an RTT)
	// or "bytes" (after AfterBytes relayed).
	Mode string `yaml:"mode"`
	// AfterBytes is the threshold of mode "bytes"; in mode "slow-start" a
	// flow is also offloaded once it reaches it (the flow's size class).
	AfterBytes int64 `yaml:"after_bytes"`
	// Interfaces carry the relayed flows (the program attaches to their
	// ingress); empty: every up, non-loopback interface.
	Interfaces []string `yaml:"interfaces"`
	// Timeout bounds one handover (default 5s).
	Timeout Duration `yaml:"timeout"`
	// MaxFlows bounds the joined flows at once (default 32768).
	MaxFlows int `yaml:"max_flows"`
	// PinDir is where the program's maps and links are pinned (bpffs), so
	// offloaded flows survive a killed relay and a restarted one adopts
	// them; "off": not pinned (offloaded flows end with the process).
	// Default: /sys/fs/bpf/mosto/net<netns inode>/<id>[-w<worker>]
	// (bpffs is mounted at /sys/fs/bpf when absent). A clean stop removes
	// the pins.
	PinDir string `yaml:"pin_dir"`
	// Linger keeps a joined flow's entries this long after FIN both ways or
	// a RST (default 10s).
	Linger Duration `yaml:"linger"`
	// KeepLossy holds a due offload back while the rate one joined
	// connection could sustain with the legs' loss over the end-to-end RTT
	// (Mathis) is below what the relay delivers: under random loss each
	// leg recovers within its own RTT, which a join gives up (seed 000).
	// Off by default: the model assumes non-congestive loss, and on a fast
	// LAN path a few congestion drops already make the estimate fall below
	// multi-Gbit/s rates. See keepSplit.
	KeepLossy bool `yaml:"keep_lossy"`
	// Attempts bounds the handovers tried per flow (default 4; 1: never
	// retry). A refused handover that may succeed later (it timed out
	// before the quiescent point, raced, or the map was full) is tried
	// again after RetryBackoff, doubling each time up to 30 s; a refusal
	// of the flow itself (options, route) is final.
	Attempts int `yaml:"attempts"`
	// RetryBackoff is the wait before the first retry (default 1s).
	RetryBackoff Duration `yaml:"retry_backoff"`
	// NoBound pauses a due flow at once, as before the drain bound (see
	// offloader.bound): the handover then drains whatever the relay holds.
	NoBound bool `yaml:"no_bound"`
	// KeepShortWindow is accepted for old configs: holding an offload back
	// while a window would limit the joined flow is the default now (see
	// JoinShort).
	KeepShortWindow bool `yaml:"keep_short_window"`
	// JoinShort offloads a due flow even when a window would limit the
	// joined flow (the behaviour before session 10). By default a due
	// offload waits (the flow keeps relaying, the watcher keeps sampling)
	// while joining would leave a direction slower than it is relayed now:
	// its receiver's window (windowShort) or its sender's window
	// (senderShort) does not cover the delivery rate times the joined
	// path's minimum RTT. Counted by reason
	// (mosto_relay_offload_held_*_total).
	JoinShort bool `yaml:"join_short"`
	// PeerCC is the congestion control assumed for the senders at the far
	// ends of the legs ("" : what this relay's own socket on that leg runs,
	// i.e. the deployment runs one algorithm). A rate-based sender ("bbr")
	// keeps a window of twice its bandwidth x minimum RTT, a loss-based one
	// (cubic, reno) about what it has in flight (senderShort).
	PeerCC string `yaml:"peer_cc"`
	// AgeRTTs holds a due offload back until the flow has lasted this
	// many joined (minimum) RTTs (default 20; -1: never): a join costs the
	// flow about one joined RTT of goodput (the handover's gap), and the
	// relay, which does not know how much is left, takes the time the flow
	// has lasted as its estimate, so the gap stays within 1/AgeRTTs of it
	// (young). Joins under minRuleRTT are never held.
	AgeRTTs int `yaml:"age_rtts"`
	// Handover is how a due flow leaves the relay (session 13):
	// HandoverFrozen ("frozen", the default) freezes the window edge the
	// relay offered when the handover began (xlate.Config.Freeze), keeps
	// relaying up to it and joins early (xlate.Config.Tail), with no
	// drain bound before it; HandoverDrain ("drain") is the handover of
	// sessions 9-12: the drain bound, then the receive-buffer cut and the
	// join at the quiescent point, with Tail, Freeze and NoBound as
	// opt-ins.
	Handover string `yaml:"handover"`
	// Tail lets the handover join while the relay's socket toward a
	// receiver still delivers up to about one RTT of data (the early join,
	// xlate.Config.Tail; opt-in since session 11). Always on with
	// Handover frozen.
	Tail bool `yaml:"tail"`
	// Freeze stops each sender at the window edge the relay offered when
	// the handover began (the program lowers the relay's offered windows
	// at egress; xlate.Config.Freeze) instead of cutting the receive
	// buffers. Opt-in (session 12); always on with Handover frozen.
	Freeze bool `yaml:"freeze"`
	// NoRcvbufCap leaves the receive buffers as they are during a
	// handover (xlate.Config.NoRcvbufCap; for comparison: the cap is how
	// a handover without Freeze stops the senders).
	NoRcvbufCap bool `yaml:"no_rcvbuf_cap"`
	// DrainPace, with Handover frozen, paces the relay's socket toward a
	// receiver at this fraction of its rate during the handover
	// (xlate.Config.DrainPace, session 14): the bottleneck queue the
	// relay's own sender kept full drains before the resumed sender's
	// first joined round reaches it. 0: xlate.DefaultDrainPace; -1: off.
	DrainPace float64 `yaml:"drain_pace"`
	// PreDrain, with Handover frozen, first drains the relay's backlog
	// toward a receiver to this many in-leg RTTs of the flow, holding the
	// sender to a small window meanwhile (xlate.Config.PreDrain, session
	// 15): the sender then reaches its frozen edge with little backlog
	// left and is not stopped there before the join. 0:
	// xlate.DefaultPreDrain; -1: off.
	PreDrain float64 `yaml:"pre_drain"`
}

// Handover modes (OffloadConfig.Handover).
const (
	HandoverFrozen = "frozen"
	HandoverDrain  = "drain"
)

// frozen reports whether the frozen handover is in use (the default).
func (c OffloadConfig) frozen() bool { return c.Handover == "" || c.Handover == HandoverFrozen }

// XlateHandover is how the relay configures its splicer for c: the early
// join (xlate.Config.Tail) and the frozen edge (xlate.Config.Freeze).
//
// Why the frozen handover is the default (Fig. 3, session 13): the drain
// bound clamps the window the relay offers to about one RTT of the flow
// before the pause, so a frozen edge is then only that far away and the
// join has no room to come before it (worst 100 ms interval 0.02-0.74 of
// pre-offload, against >= 0.9 without the bound). Frozen at the window
// the sender already had, the sender keeps sending at its rate while the
// relay forwards up to the edge, stops there only briefly, and the join's
// window update reaches it one leg RTT later while the relay's tail still
// feeds the receiver. The bound's purpose (a sender stalled at a zero
// window for the whole drain, then a timeout) does not arise: the sender
// is never stalled for more than about one RTT. CUBIC flows the policy
// would join are still held by its sender-window rule.
func (c OffloadConfig) XlateHandover() (tail, freeze bool) {
	if c.frozen() {
		return true, true
	}
	return c.Tail, c.Freeze
}

// XlateDrainPace is the splicer's xlate.Config.DrainPace for c: the
// default pace with the frozen handover (unless DrainPace is -1), none
// with the drain handover (its bound already limits what the relay holds).
func (c OffloadConfig) XlateDrainPace() float64 {
	switch {
	case !c.frozen() || c.DrainPace < 0:
		return 0
	case c.DrainPace == 0:
		return xlate.DefaultDrainPace
	}
	return c.DrainPace
}

// XlatePreDrain is the splicer's xlate.Config.PreDrain for c: the default
// with the frozen handover (unless PreDrain is -1), none with the drain
// handover.
func (c OffloadConfig) XlatePreDrain() float64 {
	switch {
	case !c.frozen() || c.PreDrain < 0:
		return 0
	case c.PreDrain == 0:
		return xlate.DefaultPreDrain
	}
	return c.PreDrain
}

// ageRTTs resolves AgeRTTs (0: the default).
func (c OffloadConfig) ageRTTs() int {
	if c.AgeRTTs == 0 {
		return 20
	}
	return c.AgeRTTs
}

// attempts and backoff resolve the retry settings.
func (c OffloadConfig) attempts() int {
	if c.Attempts == 0 {
		return 4
	}
	return c.Attempts
}

// backoff is the wait before handover attempt n+1 after n refusals.
func (c OffloadConfig) backoff(n int) time.Duration {
	d := time.Duration(c.RetryBackoff)
	if d == 0 {
		d = time.Second
	}
	for i := 1; i < n && d < maxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, maxRetryBackoff)
}

const maxRetryBackoff = 30 * time.Second

// pinDir resolves PinDir for relay id in the calling process's network
// namespace ("" when pinning is off).
func (c OffloadConfig) pinDir(id string) (string, error) {
	switch c.PinDir {
	case "off":
		return "", nil
	case "":
	default:
		return c.PinDir, nil
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("offload: network namespace: %w", err)
	}
	name := id
	if name == "" {
		name = "relay"
	}
	name = strings.Map(func(r rune) rune {
		if r == '/' || r == 0 {
			return '_'
		}
		return r
	}, name)
	if w := os.Getenv(WorkerEnv); w != "" {
		name += "-w" + w
	}
	return filepath.Join(xlate.DefaultBPFFS, "mosto", "net"+strconv.FormatUint(st.Ino, 10), name), nil
}

// Offload modes.
const (
	OffloadOff       = "off"
	OffloadSlowStart = "slow-start"
	OffloadBytes     = "bytes"
)

func (c OffloadConfig) enabled() bool { return c.Mode == OffloadSlowStart || c.Mode == OffloadBytes }

func (c OffloadConfig) validate() error {
	switch c.Mode {
	case "", OffloadOff, OffloadSlowStart:
	case OffloadBytes:
		if c.AfterBytes <= 0 {
			return errors.New("offload.after_bytes: must be > 0 with mode bytes")
		}
	default:
		return fmt.Errorf("offload.mode: %q, want off, slow-start or bytes", c.Mode)
	}
	if c.AfterBytes < 0 || c.MaxFlows < 0 || c.Timeout < 0 || c.Linger < 0 || c.Attempts < 0 || c.RetryBackoff < 0 {
		return errors.New("offload: after_bytes, max_flows, timeout, linger, attempts and retry_backoff must not be negative")
	}
	switch c.Handover {
	case "", HandoverFrozen, HandoverDrain:
	default:
		return fmt.Errorf("offload.handover: %q, want frozen or drain", c.Handover)
	}
	if c.DrainPace != -1 && !(c.DrainPace >= 0 && c.DrainPace <= 1) { // (NaN too)
		return fmt.Errorf("offload.drain_pace: %v, want -1 (off), 0 (default %v) or a fraction in (0, 1]", c.DrainPace, xlate.DefaultDrainPace)
	}
	if c.PreDrain != -1 && !(c.PreDrain >= 0 && c.PreDrain <= math.MaxFloat64) { // (NaN, +Inf too)
		return fmt.Errorf("offload.pre_drain: %v, want -1 (off), 0 (default %v) or more", c.PreDrain, xlate.DefaultPreDrain)
	}
	if c.AgeRTTs < -1 {
		return errors.New("offload.age_rtts: want -1 (never hold), 0 (default 20) or more")
	}
	if c.PinDir != "" && c.PinDir != "off" && !filepath.IsAbs(c.PinDir) {
		return fmt.Errorf("offload.pin_dir: %q, want an absolute path or off", c.PinDir)
	}
	return nil
}

// offloader owns the splicer of a Server.
type offloader struct {
	cfg OffloadConfig
	sp  *xlate.Splicer
	log *slog.Logger
	// Handovers by result: tried, joined, refused; of the refused, retried
	// later or final (a flow that then stays relayed).
	tried, joined, refused, retried, final atomic.Uint64
	// Flows whose due offload was held back, by reason (each flow counted
	// once per reason): loss (keepSplit), the receiver's window
	// (windowShort), the sender's window (senderShort), its age (young).
	heldLoss, heldRcvWnd, heldSndWnd, heldYoung atomic.Uint64
}

// offloadStats are an offloader's handover counters.
type offloadStats struct {
	Tried, Joined, Refused, Retried, Final uint64
	HeldLoss, HeldRcvWnd, HeldSndWnd       uint64
	HeldYoung                              uint64
}

// offloadMetrics exports the handover counters of the running offloader
// (zero while offload is off or not started).
func (s *Server) offloadMetrics() {
	for _, c := range []struct {
		name, help string
		v          func(offloadStats) uint64
	}{
		{"mosto_relay_offload_handovers_total", "Handovers tried (a flow paused to leave the relay's data path).",
			func(st offloadStats) uint64 { return st.Tried }},
		{"mosto_relay_offload_joined_total", "Handovers that joined the flow in the kernel.",
			func(st offloadStats) uint64 { return st.Joined }},
		{"mosto_relay_offload_refused_total", "Handovers refused (the flow kept relaying).",
			func(st offloadStats) uint64 { return st.Refused }},
		{"mosto_relay_offload_retries_total", "Refused handovers tried again after a backoff (offload.attempts, offload.retry_backoff).",
			func(st offloadStats) uint64 { return st.Retried }},
		{"mosto_relay_offload_held_loss_total", "Flows whose due offload was held back under loss (offload.keep_lossy).",
			func(st offloadStats) uint64 { return st.HeldLoss }},
		{"mosto_relay_offload_held_receiver_window_total", "Flows whose due offload was held back: a receiver's window would limit the joined flow.",
			func(st offloadStats) uint64 { return st.HeldRcvWnd }},
		{"mosto_relay_offload_held_sender_window_total", "Flows whose due offload was held back: a sender's window would limit the joined flow.",
			func(st offloadStats) uint64 { return st.HeldSndWnd }},
		{"mosto_relay_offload_held_young_total", "Flows whose due offload was held back: the flow had lasted fewer than offload.age_rtts joined RTTs.",
			func(st offloadStats) uint64 { return st.HeldYoung }},
	} {
		s.m.reg.CounterFunc(metrics.Opts{Name: c.name, Help: c.help}, func() float64 {
			o := s.offload.Load()
			if o == nil {
				return 0
			}
			return float64(c.v(o.stats()))
		})
	}
}

func (o *offloader) stats() offloadStats {
	return offloadStats{Tried: o.tried.Load(), Joined: o.joined.Load(), Refused: o.refused.Load(),
		Retried: o.retried.Load(), Final: o.final.Load(),
		HeldLoss: o.heldLoss.Load(), HeldRcvWnd: o.heldRcvWnd.Load(), HeldSndWnd: o.heldSndWnd.Load(),
		HeldYoung: o.heldYoung.Load()}
}

// errPaused ends a copy direction paused for a handover.
var errPaused = errors.New("relay: copy paused for offload")

// errOffloaded marks a flow that left the relay.
var errOffloaded = errors.New("relay: flow offloaded")

// startOffload loads and attaches the program (Run calls it).
func (s *Server) startOffload(ctx context.Context) error {
	c := s.cfg.Offload
	if !c.enabled() {
		return nil
	}
	if !xlate.Supported {
		return errors.New("offload: eBPF splicing is not supported on this OS")
	}
	flows := c.MaxFlows
	if flows == 0 {
		flows = 32768
	}
	pin, err := c.pinDir(s.cfg.ID)
	if err != nil {
		return err
	}
	// Sweep often enough for the linger (a short one frees a full map soon).
	sweep := time.Second
	if c.Linger > 0 {
		sweep = min(sweep, max(time.Duration(c.Linger)/2, 10*time.Millisecond))
	}
	tail, freeze := c.XlateHandover()
	sp, err := xlate.Open(ctx, xlate.Config{Interfaces: c.Interfaces, MaxEntries: 2 * flows, PinDir: pin,
		CloseLinger: time.Duration(c.Linger), SweepInterval: sweep, Tail: tail, Freeze: freeze, NoRcvbufCap: c.NoRcvbufCap, DrainPace: c.XlateDrainPace(), PreDrain: c.XlatePreDrain(), Log: s.log})
	if err != nil {
		return err
	}
	s.offload.Store(&offloader{cfg: c, sp: sp, log: s.log})
	s.log.Info("offload enabled", "mode", c.Mode, "after_bytes", c.AfterBytes, "pin_dir", pin, "tail", tail, "freeze", freeze, "drain_pace", c.XlateDrainPace(), "pre_drain", c.XlatePreDrain(),
		"adopted", sp.Stats().Adopted)
	return nil
}

func (s *Server) stopOffload() {
	if o := s.offload.Load(); o != nil {
		o.sp.Close()
	}
}

// watch samples both connections' TCP_INFO about once per RTT and pauses
// the flow's copies when it should leave the relay, not before delay. It
// returns when ctx ends or after pausing. st carries what earlier samples
// saw (a first sample taken before the copies started, see run).
func (o *offloader) watch(ctx context.Context, p *pipe, wg *sync.WaitGroup, delay time.Duration, st watchState) {
	defer wg.Done()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	for {
		due, wait, ok := o.sample(p, &st)
		if !ok {
			return
		}
		if due {
			p.pause()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// watchState is what a flow's watcher carries from one sample to the next.
type watchState struct {
	prev [2]ccSample
	// held: the reasons that held the offload back so far (each logged and
	// counted once per flow).
	held map[string]bool
	// rateBased: the sender into each leg keeps a window of twice its
	// bandwidth x minimum RTT (BBR); known once cc is set.
	rateBased [2]bool
	cc        bool
	// born is when the flow started (its first sample, or as the watcher
	// was told).
	born time.Time
	// bounding counts the samples since the flow became due and the relay
	// started bounding what it holds (see bound); 0: not due yet.
	bounding int
	dueAt    time.Time
	// wnd and hold are each direction's bounds (drainBounds), set on the
	// first bounded sample.
	wnd, hold [2]int
}

// sample reads both connections' TCP_INFO once: due reports whether the
// flow should leave the relay now, wait is the time to the next sample
// (about one RTT), ok is false when a connection cannot be read (closed).
func (o *offloader) sample(p *pipe, st *watchState) (due bool, wait time.Duration, ok bool) {
	wait = 10 * time.Millisecond
	if st.born.IsZero() {
		st.born = time.Now()
	}
	for i, c := range []*net.TCPConn{p.down, p.up} {
		cur, ok := readCC(c)
		if !ok {
			return false, 0, false
		}
		if cur.rtt > wait {
			wait = min(cur.rtt, 200*time.Millisecond)
		}
		if o.cfg.AfterBytes > 0 && int64(cur.bytesAcked) >= o.cfg.AfterBytes {
			due = true
		}
		if o.cfg.Mode == OffloadSlowStart && cur.bytesAcked > 1<<20 {
			// Left slow start: ssthresh set by a loss, or the cwnd of a
			// cwnd-limited sender grew less than 1.5x over an RTT.
			if cur.ssthresh < 0x7fffffff {
				due = true
			}
			prev := st.prev[i]
			if prev.cwnd > 0 && cur.bytesAcked > prev.bytesAcked && 2*cur.cwnd < 3*prev.cwnd {
				due = true
			}
		}
		st.prev[i] = cur
	}
	return o.decide(p, st, due), wait, true
}

// decide turns a sample's verdict into the pause: a due flow is held back
// while a rule says its join would not pay (hold), and otherwise bounded
// first (bound). The rules are asked until the flow is bounded: a bound (a
// clamped window) changes what they measure, so a bounded flow goes on to
// its pause.
func (o *offloader) decide(p *pipe, st *watchState, due bool) bool {
	if due && st.bounding == 0 {
		if !st.cc {
			st.cc = true
			for i, c := range []*net.TCPConn{p.down, p.up} {
				st.rateBased[i] = rateBasedCC(o.cfg.PeerCC, c)
			}
		}
		if reason := o.hold(st); reason != "" {
			due = false
		}
	}
	// The frozen handover needs no bound (see XlateHandover): its sender
	// keeps sending up to the edge it already had.
	if due && !o.cfg.NoBound && !o.cfg.frozen() {
		due = o.bound(p, st)
	}
	return due
}

// Reasons a due offload is held back.
const (
	holdLoss      = "loss"
	holdRcvWindow = "receiver-window"
	holdSndWindow = "sender-window"
	holdYoung     = "young"
)

// hold reports why the due flow sampled in st should not be joined yet
// ("" : join): loss (keepSplit, with offload.keep_lossy), or a window that
// would limit the joined flow (windowShort, senderShort; unless
// offload.join_short). The first time a reason holds a flow it is logged
// and counted.
func (o *offloader) hold(st *watchState) string {
	var reason string
	var attrs []any
	if o.cfg.KeepLossy {
		if keep, est, rate := keepSplit(st.prev); keep {
			reason = holdLoss
			attrs = []any{"joined_estimate_mbit", est / 1e6, "relayed_mbit", rate / 1e6}
		}
	}
	if reason == "" && o.cfg.ageRTTs() > 0 {
		joined := st.prev[0].baseRTT() + st.prev[1].baseRTT()
		if age := time.Since(st.born); joined >= minRuleRTT && age < time.Duration(o.cfg.ageRTTs())*joined {
			reason = holdYoung
			attrs = []any{"age", age, "joined_min_rtt", joined, "age_rtts", o.cfg.ageRTTs()}
		}
	}
	if reason == "" && !o.cfg.JoinShort {
		if short, in := windowShort(st.prev); short {
			reason = holdRcvWindow
			attrs = []any{"receiver_window", st.prev[1-in].sndWnd, "relayed_mbit", float64(st.prev[1-in].deliveryRate) * 8 / 1e6,
				"joined_min_rtt", st.prev[0].baseRTT() + st.prev[1].baseRTT()}
		} else if short, in, have, need := senderShort(st.prev, st.rateBased); short {
			reason = holdSndWindow
			attrs = []any{"sender_window_estimate", int(have), "needed", int(need), "rate_based", st.rateBased[in],
				"relayed_mbit", float64(st.prev[1-in].deliveryRate) * 8 / 1e6, "in_leg_rcv_rtt", st.prev[in].rcvRTT,
				"joined_min_rtt", st.prev[0].baseRTT() + st.prev[1].baseRTT()}
		}
	}
	if reason == "" || st.held[reason] {
		return reason
	}
	if st.held == nil {
		st.held = map[string]bool{}
	}
	st.held[reason] = true
	switch reason {
	case holdLoss:
		o.heldLoss.Add(1)
	case holdRcvWindow:
		o.heldRcvWnd.Add(1)
	case holdSndWindow:
		o.heldSndWnd.Add(1)
	case holdYoung:
		o.heldYoung.Add(1)
	}
	if o.log != nil {
		o.log.Debug("offload held back", append([]any{"reason", reason}, attrs...)...)
	}
	return reason
}

// joinKeep is the share of the relayed rate a join must keep: a rule holds
// a due offload back while the joined flow would run below it.
const joinKeep = 0.9

// minRuleRTT: the window rules judge only joins whose path has at least
// this minimum RTT. Below it (a LAN, veths) timestamps cannot measure the
// receive-side RTT (1 ms clock), scheduling delay dominates what the
// kernel reports, and a window short of the joined path's BDP grows back
// within milliseconds (per-RTT growth).
const minRuleRTT = 2 * time.Millisecond

// senderShort reports whether joining would leave a direction limited by
// its sender's congestion window. After the join the sender into the
// in-leg (the origin of a download) sends over both legs, with the window
// it has now, sized for the in-leg alone: a loss-based sender (CUBIC)
// keeps about what it has in flight, and goodput falls to window / joined
// RTT until it grows the window again, seconds later (MOSTO Fig. 3). The
// relay cannot read that window; it sees what the sender keeps in flight:
// the bytes arriving per RTT of the in-leg, rate x tcpi_rcv_rtt (the
// receive-side RTT from the timestamps, which includes the sender's own
// queue). A rate-based sender (BBR) keeps a window of twice its bandwidth
// x its minimum RTT, the in-leg's. The joined path needs the rate x both
// legs' minimum RTTs; a direction whose estimate is below joinKeep of that
// holds the offload back, unless it carries little (at most
// minDrainBound per joined RTT: the request of a download) or the joined
// path is shorter than minRuleRTT. in is the in-leg of the short
// direction (0: down, 1: up); have and need are in bytes.
func senderShort(legs [2]ccSample, rateBased [2]bool) (short bool, in int, have, need float64) {
	joined := legs[0].baseRTT() + legs[1].baseRTT()
	if joined < minRuleRTT {
		return false, 0, 0, 0
	}
	for in := range legs {
		l, out := legs[in], legs[1-in]
		rate := float64(out.deliveryRate)
		need = rate * joined.Seconds()
		if need <= minDrainBound {
			continue
		}
		if rateBased[in] {
			have = 2 * rate * l.baseRTT().Seconds()
		} else {
			rtt := l.rcvRTT
			if rtt == 0 {
				rtt = l.rtt
			}
			have = rate * rtt.Seconds()
		}
		if have < joinKeep*need {
			return true, in, have, need
		}
	}
	return false, 0, 0, 0
}

// rateBasedCC reports whether the sender into c's leg is taken to be rate
// based (BBR): cc names its congestion control, or "" for c's own.
func rateBasedCC(cc string, c *net.TCPConn) bool {
	if cc == "" {
		raw, err := c.SyscallConn()
		if err != nil {
			return false
		}
		raw.Control(func(fd uintptr) {
			cc, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
		})
	}
	return strings.HasPrefix(strings.TrimRight(cc, "\x00"), "bbr")
}

// OffloadWatcher runs the relay's offload policy on a relayed pair outside
// a relay (benchmarks that drive xlate.Handover themselves): the flow is
// due from the start, and each Step is one sample of the relay's watcher
// (the rules that hold a due offload back, then the drain bound).
type OffloadWatcher struct {
	o  offloader
	p  pipe
	st watchState
}

// NewOffloadWatcher watches down (the client's leg) and up (the origin's)
// of a flow that started at born, with cfg (its Mode and AfterBytes are
// ignored); log may be nil.
func NewOffloadWatcher(down, up *net.TCPConn, born time.Time, cfg OffloadConfig, log *slog.Logger) *OffloadWatcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.Mode, cfg.AfterBytes = OffloadBytes, 1
	return &OffloadWatcher{o: offloader{cfg: cfg, log: log}, p: pipe{down: down, up: up, log: log.Debug},
		st: watchState{born: born}}
}

// Step samples once: ready reports that the flow may pause for its
// handover now, wait is the time to the next sample (about one RTT), held
// the rule holding the offload back ("" : none).
func (w *OffloadWatcher) Step() (ready bool, wait time.Duration, held string, err error) {
	due, wait, ok := w.o.sample(&w.p, &w.st)
	if !ok {
		return false, 0, "", errors.New("relay: offload watcher: TCP_INFO unreadable")
	}
	if !due && w.st.bounding == 0 {
		held = w.o.hold(&w.st)
	}
	return due, wait, held, nil
}

// Unbound restores what the drain bound changed (after a refused handover).
func (w *OffloadWatcher) Unbound() { w.p.unbound() }

// windowShort reports whether joining would leave a direction limited by
// its receiver's window: after the join the out-leg's peer receives over
// both legs' RTTs, with the window it advertises now, which Linux
// autotuned for the out-leg's RTT alone (per RTT of what its application
// reads). An ingress relay next to its client (a ~0 RTT out-leg) sees a
// window of some 100 KB; over the joined RTT that, not the congestion
// window, bounds the flow until the client's autotuning catches up: in the
// emulator's Fig. 4 chain the ingress relay's join alone made 15 MB fetches
// 1.26x slower. So a direction whose out-leg delivers rate r holds the
// offload back while its peer's window is below joinKeep x r x (RTT_in +
// RTT_out), with the legs' minimum RTTs (the smoothed ones grow with
// queues and a loaded machine's scheduling delay: with them a veth flow
// was never offloaded), when that is more than minDrainBound (a direction
// that carries little, the request of a download, never does) and the
// joined path is at least minRuleRTT long. in is the in-leg of the short
// direction (0: down, 1: up).
func windowShort(legs [2]ccSample) (short bool, in int) {
	joined := legs[0].baseRTT() + legs[1].baseRTT()
	if joined < minRuleRTT {
		return false, 0
	}
	for in := range legs {
		out := legs[1-in]
		need := float64(out.deliveryRate) * joined.Seconds()
		if out.sndWnd >= 0 && need > minDrainBound && float64(out.sndWnd) < joinKeep*need {
			return true, in
		}
	}
	return false, 0
}

// Bounding the drain.
const (
	// minDrainBound is the least a leg may hold per direction while
	// bounding (a cold leg's cwnd says little).
	minDrainBound = 64 << 10
	// maxBoundSamples pauses a due flow after this many samples (about as
	// many RTTs) even if it still holds more than its bound.
	maxBoundSamples = 32
	// minDrainTime: a direction whose held bytes drain within this at the
	// out-leg's rate is ready whatever its bound (veths: 20 MB at
	// 16 Gbit/s; without it a veth flow waited its 32 samples, relaying
	// ~300 ms more: relay CPU per GB 10% of splice instead of 3%).
	minDrainTime = 10 * time.Millisecond
)

// bound runs on each sample of a due flow, before its pause, and reports
// whether the flow may pause now. The handover pushes everything the relay
// holds (each receive queue, each send queue, and what a sender may still
// send into the window the relay already offered) through the other leg
// before it can join, and at the rate of that leg: a relay that buffers
// megabytes for a slower or colder downstream leg (split TCP in a chain)
// stalled its upstream sender for seconds and hit the handover timeout.
// So for each direction (in-leg -> out-leg) the relay first bounds what it
// holds while it keeps relaying (drainBounds: about one RTT of the
// out-leg's delivery rate): the in-leg's offered window is clamped
// (TCP_WINDOW_CLAMP: new offers only, the window already offered is kept,
// so nothing in flight is dropped; the receive buffer stays as it is) and
// the out-leg's send buffer is cut (SO_SNDBUF: writes wait, nothing
// dropped). The flow pauses once each direction holds at most twice its
// bound (its in-leg's receive queue and its out-leg's send queue) and the
// in-leg's offered window is at most twice its clamp (or either drains
// within minDrainTime at the out-leg's rate), or
// after maxBoundSamples. A refused handover restores both
// (unbound).
func (o *offloader) bound(p *pipe, st *watchState) bool {
	conns := [2]*net.TCPConn{p.down, p.up}
	var q [2]legQueues
	for i, c := range conns {
		var ok bool
		if q[i], ok = readQueues(c); !ok {
			return true // the handover reads them again and decides
		}
	}
	if st.bounding == 0 {
		st.dueAt = time.Now()
		if !p.bounded {
			p.saved = q
			p.bounded = true
		}
		st.wnd, st.hold = [2]int{}, [2]int{}
	}
	// The bounds follow the rates up, never down. Recomputed from each
	// sample, a clamped sender's lower rate shrank the next clamp, and so
	// on (a BBR sender's bandwidth estimate followed it down to 0.4x in
	// 20-30 samples of Fig. 3, and kept it after the join). Fixed at the
	// first sample (session 10), a flow still ramping up (a chain's legs
	// after 1 MB, Fig. 4) stayed clamped to its early rate for the whole
	// bound: bound-only joins in the Fig. 4 chain were 1.55x slower than
	// no offload at 15 MB (the receive-buffer cap off), 1.22x with the
	// bounds recomputed (session 13).
	for in := range conns {
		wnd, hold := drainBounds(st.prev[in], st.prev[1-in])
		st.wnd[in], st.hold[in] = max(st.wnd[in], wnd), max(st.hold[in], hold)
	}
	st.bounding++
	ready := true
	var held [2]int
	wnd, hold := st.wnd, st.hold
	for in := range conns {
		out := 1 - in
		held[in] = q[in].inq + q[out].outq
		setInt(conns[in], unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, wnd[in])
		setInt(conns[out], unix.SOL_SOCKET, unix.SO_SNDBUF, max(2*hold[in], 2*wnd[in]))
		// Ready: what it holds drains within about two out-leg RTTs, or
		// within minDrainTime at the out-leg's rate (a fast LAN leg: its
		// RTT says little, and 64 KB is a few microseconds there), and
		// the in-leg's sender has at most about as much window left.
		fast := int(float64(st.prev[out].deliveryRate) * minDrainTime.Seconds())
		if held[in] > max(2*hold[in], fast) || q[in].rcvWnd > int64(max(2*wnd[in], fast)) {
			ready = false
		}
	}
	// The first bounded sample only sets the bounds: pause on a later one.
	pause := (ready && st.bounding > 1) || st.bounding >= maxBoundSamples
	if pause && p.log != nil {
		p.log("offload: bounded, pausing", "samples", st.bounding, "bounding", time.Since(st.dueAt),
			"held_down_to_up", held[0], "held_up_to_down", held[1], "ready", ready,
			"wnd_up_to_down", wnd[1], "hold_up_to_down", hold[1], "rcv_wnd_up", q[1].rcvWnd)
	}
	return pause
}

// drainBounds are the bounds of one direction, from the in-leg to the
// out-leg: wnd, the window the in-leg's sender gets (what the out-leg
// delivers in one RTT of the in-leg: the in-leg keeps up with the out-leg,
// and after the pause its sender stops within about one of its RTTs), and
// hold, what the relay may hold for the out-leg (what the out-leg delivers
// in one of its RTTs, so the handover's drain takes about one RTT). The
// out-leg's rate is its TCP_INFO delivery rate (its cwnd x MSS per RTT when
// the kernel has none yet); both at least minDrainBound.
func drainBounds(in, out ccSample) (wnd, hold int) {
	rate := float64(out.deliveryRate) // bytes/s
	if rate == 0 && out.rtt > 0 {
		rate = float64(out.cwnd) * float64(out.mss) / out.rtt.Seconds()
	}
	wnd = max(minDrainBound, int(rate*in.rtt.Seconds()))
	hold = max(minDrainBound, int(rate*out.rtt.Seconds()))
	return wnd, hold
}

// unbound gives a flow whose handover was refused its buffers back (the
// window clamp and send buffer read before bound changed them). The send
// buffer stays locked at its old size (the kernel stops autotuning a
// buffer once it is set).
func (p *pipe) unbound() {
	if !p.bounded {
		return
	}
	p.bounded = false
	for i, c := range [2]*net.TCPConn{p.down, p.up} {
		setInt(c, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, p.saved[i].clamp)
		setInt(c, unix.SOL_SOCKET, unix.SO_SNDBUF, p.saved[i].sndbuf/2) // the kernel doubles it
	}
}

// legQueues is what a leg holds: unread bytes (inq), unacknowledged or
// unsent bytes (outq), the window last offered (rcvWnd, -1 if the kernel
// does not say), and the settings bound changes.
type legQueues struct {
	inq, outq     int
	rcvWnd        int64
	clamp, sndbuf int
}

func readQueues(c *net.TCPConn) (legQueues, bool) {
	q := legQueues{rcvWnd: -1}
	raw, err := c.SyscallConn()
	if err != nil {
		return q, false
	}
	ok := false
	raw.Control(func(fd uintptr) {
		f := int(fd)
		var err error
		if q.inq, err = unix.IoctlGetInt(f, unix.SIOCINQ); err != nil {
			return
		}
		if q.outq, err = unix.IoctlGetInt(f, unix.SIOCOUTQ); err != nil {
			return
		}
		if q.clamp, err = unix.GetsockoptInt(f, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP); err != nil {
			return
		}
		if q.sndbuf, err = unix.GetsockoptInt(f, unix.SOL_SOCKET, unix.SO_SNDBUF); err != nil {
			return
		}
		var info [256]byte
		n := uint32(len(info))
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0); e == 0 && n >= 236 {
			q.rcvWnd = int64(binary.NativeEndian.Uint32(info[232:])) // tcpi_rcv_wnd, Linux 6.2+
		}
		ok = true
	})
	return q, ok
}

// setInt sets an integer socket option on c; errors are ignored (a closed
// connection fails its handover anyway).
func setInt(c *net.TCPConn, level, opt, v int) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), level, opt, v) })
}

// pause stops both copy directions at their next read (errPaused) so the
// flow can be handed over.
func (p *pipe) pause() {
	p.pausing.Store(true)
	p.down.SetReadDeadline(time.Now())
	p.up.SetReadDeadline(time.Now())
}

// afterCopies runs when both copy directions returned: if they were paused
// it hands the flow over; when that is refused it resumes the copies, and
// for a refusal that may pass (retryable) watches the flow again after a
// backoff, up to Attempts handovers.
func (o *offloader) afterCopies(p *pipe, errDown, errUp error, log func(string, ...any)) (error, error) {
	for n := 1; errors.Is(errDown, errPaused) || errors.Is(errUp, errPaused); n++ {
		err := o.handover(p)
		if err == nil {
			log("offload: joined", "attempt", n)
			return errOffloaded, errOffloaded
		}
		if errors.Is(err, xlate.ErrEnded) {
			log("offload: both directions ended during the handover", "attempt", n)
			return nil, nil // both directions ended (FINs forwarded): a finished flow
		}
		if legFailed(err) {
			// A leg was reset (or a write failed) while the handover
			// drained it: the flow is broken. Resuming would read the
			// reset leg's EOF and pass a clean FIN on (a truncated
			// transfer that looks complete): reset both sides instead.
			o.final.Add(1)
			log("offload: a leg failed during the handover, resetting the flow", "err", err, "attempt", n)
			p.abort()
			return err, err
		}
		retry := n < o.cfg.attempts() && retryable(err)
		if retry {
			o.retried.Add(1)
		} else {
			o.final.Add(1)
		}
		log("offload refused, relaying on", "err", err, "attempt", n, "retry", retry)
		// Resume: the handover consumed exactly what it forwarded.
		p.unbound()
		errDown, errUp = o.resume(p, errDown, errUp, retry, o.cfg.backoff(n))
	}
	return errDown, errUp
}

// handover tries one handover of p's paused connections.
func (o *offloader) handover(p *pipe) error {
	timeout := time.Duration(o.cfg.Timeout)
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	o.tried.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t0 := time.Now()
	sp, err := o.sp.Handover(ctx, p.down, p.up)
	switch {
	case err == nil:
		o.joined.Add(1)
		if p.log != nil {
			p.log("offload: handover phases", "stopped", sp.Phases.Stopped, "quiet", sp.Phases.Quiet,
				"joined", sp.Phases.Joined, "attempts", sp.Phases.Attempts)
		}
		return nil
	case !errors.Is(err, xlate.ErrEnded):
		o.refused.Add(1)
	}
	if p.log != nil {
		p.log("offload: handover ended", "after", time.Since(t0), "err", err)
	}
	return err
}

// retryable reports whether a refused handover may succeed later: it timed
// out before the quiescent point (a flow busy both ways), a segment raced
// the install, a leg was busy at the join or held data behind a hole, or
// the map was full. Refusals
// of the connections themselves (options, family, route, state) and
// socket errors are final.
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var re *xlate.RefusedError
	if !errors.As(err, &re) {
		return false
	}
	switch re.Reason {
	case xlate.ReasonBusy, xlate.ReasonRaced, xlate.ReasonOOO, xlate.ReasonMapFull:
		return true
	}
	return false
}

// legFailed reports whether a handover error is a failure of the flow's
// sockets themselves (a peek, write or FIN forward that met a reset or
// broken leg), not a refusal or a timeout.
func legFailed(err error) bool {
	var re *xlate.RefusedError
	if errors.As(err, &re) {
		return false
	}
	for _, e := range []error{unix.ECONNRESET, unix.EPIPE, unix.ETIMEDOUT, unix.ENOTCONN, unix.EHOSTUNREACH, unix.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// resume restarts the paused copy directions of p and waits for both to
// return again. With watch a new watcher may pause them again after delay.
func (o *offloader) resume(p *pipe, errDown, errUp error, watch bool, delay time.Duration) (error, error) {
	p.pausing.Store(false)
	p.down.SetReadDeadline(time.Time{})
	p.up.SetReadDeadline(time.Time{})
	var watchWG sync.WaitGroup
	ctx, stopWatch := context.WithCancel(context.Background())
	if watch {
		watchWG.Add(1)
		go o.watch(ctx, p, &watchWG, delay, watchState{})
	}
	var wg sync.WaitGroup
	if errors.Is(errUp, errPaused) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errUp = p.copyHalf(p.up, p.down, p.upBytes)
		}()
	}
	if errors.Is(errDown, errPaused) {
		errDown = p.copyHalf(p.down, p.up, p.dnBytes)
	}
	wg.Wait()
	stopWatch()
	watchWG.Wait()
	return errDown, errUp
}

// pausedErr reports whether err is the deadline that paused a copy.
func (p *pipe) pausedErr(err error) bool {
	return p.pausing.Load() && errors.Is(err, os.ErrDeadlineExceeded)
}

type ccSample struct {
	rtt        time.Duration
	cwnd       uint32
	ssthresh   uint32
	bytesAcked uint64
	mss        uint32
	// dataSegsOut and totalRetrans count this socket's data segments sent
	// and retransmitted; deliveryRate is its latest delivery rate (bytes/s).
	dataSegsOut, totalRetrans uint32
	deliveryRate              uint64
	// sndWnd is the window the peer last advertised (bytes; -1 if the
	// kernel does not say: before Linux 5.4).
	sndWnd int64
	// minRTT is the least RTT seen on the leg (0: unknown); rcvRTT the
	// receive side's RTT estimate (from the timestamps: includes the
	// sender's own queue; 0: none yet).
	minRTT, rcvRTT time.Duration
}

// baseRTT is the leg's minimum RTT, its smoothed RTT when unknown: the
// smoothed one grows with queues and, on a loaded machine, with
// scheduling delay.
func (s ccSample) baseRTT() time.Duration {
	if s.minRTT > 0 {
		return s.minRTT
	}
	return s.rtt
}

// keepSplit decides whether a flow whose legs are sampled in legs should
// stay split because of loss. Each leg's sending socket shows the loss of
// its own direction over the flow so far (retransmitted / sent data
// segments); a joined connection would see their sum over the sum of the
// RTTs, and a loss-based sender then sustains about 1.22 MSS / (RTT
// sqrt(p)) (Mathis et al.). If that estimate is below the rate the relay
// delivers now (the faster leg's delivery rate), the split serves the flow
// better. est and rate are in bit/s.
func keepSplit(legs [2]ccSample) (keep bool, est, rate float64) {
	var p float64
	var rtt time.Duration
	mss := uint32(0)
	for _, l := range legs {
		segs, retr := l.dataSegsOut, l.totalRetrans
		if segs >= 100 { // too few segments say nothing
			p += float64(retr) / float64(segs)
		}
		rtt += l.rtt
		mss = max(mss, l.mss)
		rate = max(rate, float64(l.deliveryRate)*8)
	}
	if p == 0 || rtt <= 0 || mss == 0 {
		return false, 0, rate
	}
	est = 1.22 * float64(mss) * 8 / rtt.Seconds() / math.Sqrt(p)
	return est < rate, est, rate
}

// readCC reads the congestion state of c (TCP_INFO).
func readCC(c *net.TCPConn) (ccSample, bool) {
	var s ccSample
	raw, err := c.SyscallConn()
	if err != nil {
		return s, false
	}
	ok := false
	raw.Control(func(fd uintptr) {
		var info [256]byte
		n := uint32(len(info))
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0); e != 0 || n < 128 {
			return
		}
		ne := binary.NativeEndian
		s.mss = ne.Uint32(info[16:])
		s.totalRetrans = ne.Uint32(info[100:])
		if n >= 168 {
			s.dataSegsOut = ne.Uint32(info[156:])
			s.deliveryRate = ne.Uint64(info[160:])
		}
		s.sndWnd = -1
		if n >= 232 {
			s.sndWnd = int64(ne.Uint32(info[228:])) // tcpi_snd_wnd
		}
		s.rtt = time.Duration(ne.Uint32(info[68:])) * time.Microsecond
		s.rcvRTT = time.Duration(ne.Uint32(info[92:])) * time.Microsecond
		if n >= 152 {
			if v := ne.Uint32(info[148:]); v != ^uint32(0) { // ~0: no sample yet
				s.minRTT = time.Duration(v) * time.Microsecond
			}
		}
		s.ssthresh = ne.Uint32(info[76:])
		s.cwnd = ne.Uint32(info[80:])
		s.bytesAcked = ne.Uint64(info[120:])
		ok = true
	})
	return s, ok
}

// offloadReady reports whether offload is configured and attached (tests).
func (s *Server) offloadReady() bool { return s.offload.Load() != nil }
