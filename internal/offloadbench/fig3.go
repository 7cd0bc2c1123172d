package offloadbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/xlate"
	"golang.org/x/sys/unix"
)

// Modes of a Fig. 3 run.
const (
	ModeRelay         = "relay"                // never offloaded
	ModeDirect        = "direct"               // no relay: peer2 -> peer1 end to end over one link of the whole path's delay, rate and queue
	ModePlain         = "plain"                // offloaded, no mitigation (no window probes after the join)
	ModeProbe         = "probe"                // offloaded with the join's window probes, windows still closed (xlate.Config.NoReopen)
	ModeNow           = "now"                  // offloaded at once, with the join's window probes carrying reopened windows
	ModeMosto         = "mosto"                // the relay's default policy and handover (relay.OffloadWatcher: the rules that hold a join back; since session 13 the frozen early join, no drain bound)
	ModeDrain         = "mosto-drain"          // the policy with the handover of sessions 9-12 (offload.handover: drain): the rules, the drain bound, then as ModeNow
	ModeNoBound       = "mosto-nobound"        // ModeDrain without the drain bound (offload.no_bound)
	ModeTail          = "mosto-tail"           // ModeDrain with the early join (xlate.Config.Tail)
	ModeRaise         = "mosto-raise"          // ModeTail with the join's probes offering the other peer's free window (xlate.Config.RaiseWindow)
	ModeFreeze        = "mosto-freeze"         // ModeTail with the handover's frozen window edge (xlate.Config.Freeze)
	ModeNowFreeze     = "now-freeze"           // offloaded at once (no policy, no bound) with the early join and the frozen edge
	ModeFreezeNoBound = "mosto-freeze-nobound" // ModeFreeze without the drain bound (as ModeMosto since session 13, through the drain mode's opt-ins)
	ModeGradual       = "gradual"              // seed's mitigation: legs' delay raised in 10 ms RTT steps, then offloaded (with probes)
	ModeGradualFreeze = "gradual-freeze"       // ModeGradual, then the frozen early join (as ModeNowFreeze)
)

// Fig3Config is one run.
type Fig3Config struct {
	RTT       time.Duration // end to end; each leg has half
	CC        string        // congestion control of every host
	Mode      string
	Duration  time.Duration // whole flow
	OffloadAt time.Duration // when the relay leaves
	RateMbit  float64       // rate of both links (0: unlimited)
	QueueMS   float64       // queue of both links
	LossPct   float64       // random loss on every link, each way
	Interval  time.Duration // goodput interval
	// TraceSender samples peer2's TCP_INFO at every interval (Trace.Sender).
	TraceSender bool
	// StepEvery is the time between two delay steps of ModeGradual and
	// ModeGradualFreeze (0: 1.5 end-to-end RTTs).
	StepEvery time.Duration
	// DrainPace overrides xlate.Config.DrainPace of the modes with the
	// frozen edge (0: the mode's own; < 0: off).
	DrainPace float64
	// FirstRound sets xlate.Config.FirstRound of the modes with the
	// frozen edge (0: off, the default).
	FirstRound float64
	// PreDrain sets xlate.Config.PreDrain of the modes with the frozen
	// edge (0: the mode's own; < 0: off).
	PreDrain float64
	Log      *slog.Logger
}

// SenderSample is peer2's (the sender's) TCP_INFO at the end of one
// interval: what limits it after a join.
type SenderSample struct {
	CaState        uint8 // 0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss
	Cwnd, Ssthresh uint32
	SRTT           time.Duration
	SndWnd         uint32 // the receiver's window as peer2 sees it (bytes)
	Unacked        uint32 // segments in flight
	NotSent        uint32 // bytes written, not sent
	Retrans        uint32 // total retransmitted segments so far
	RwndLimited    time.Duration
	SndbufLimited  time.Duration
	Busy           time.Duration
	PacingRate     uint64 // bytes/s
	DeliveryRate   uint64 // bytes/s
}

// Trace is the goodput of one run.
type Trace struct {
	Cfg        Fig3Config
	Mbps       []float64 // goodput per interval at peer1
	OffloadIdx int       // first interval after the handover started (or the ramp)
	Pre        float64   // mean goodput over the second before
	MinRatio   float64   // worst interval after OffloadIdx / Pre
	RTOs       int       // retransmission timeouts at the sender (tcpi_total_rto), -1 unknown
	Retrans    int       // segments retransmitted by the sender
	Handover   time.Duration
	Phases     xlate.Phases // of the handover
	// HeldDrops counts the packets the program dropped while the join's
	// entries were held (xlate.Stats.HeldDrops): retransmitted, each a
	// hole at peer1 for about one end-to-end RTT.
	HeldDrops uint64
	// QueueDrops counts the packets the relay -> peer1 link dropped with
	// its queue full: during the handover (from its start to its end, the
	// tail included) and in the second before it.
	QueueDrops, QueueDropsPre uint64
	// QueueDropsAfter counts the same link's drops from the handover's end
	// to 1.5 end-to-end RTTs after it (the resumed sender's first round).
	QueueDropsAfter uint64
	// QueueDropsIn counts the peer2 -> relay link's drops over both
	// (the sender's own queue).
	QueueDropsIn uint64
	// MaxGap is the longest time peer1 received nothing, from the offload
	// time on (the stall around the join).
	MaxGap time.Duration
	// Post is the mean goodput from the end of the handover (or the offload
	// time) to the end of the flow.
	Post float64
	// Waited is how long the policy held the offload back (ModeMosto);
	// Held is its reason when the flow was never offloaded.
	Waited time.Duration
	Held   string
	// Sender has one sample per interval with Fig3Config.TraceSender.
	Sender []SenderSample
}

const relayPort, serverPort = 9100, 9101

// errHeld: the policy held the offload back until the flow's end.
var errHeld = errors.New("offload held back")

// PolicyConfig is the relay configuration of a mode that runs the relay's
// policy (ok false: the mode offloads without it).
func PolicyConfig(mode string) (c relay.OffloadConfig, ok bool) {
	drain := relay.OffloadConfig{Handover: relay.HandoverDrain}
	switch mode {
	case ModeMosto:
		return relay.OffloadConfig{}, true
	case ModeDrain:
		return drain, true
	case ModeNoBound:
		drain.NoBound = true
	case ModeTail, ModeRaise:
		drain.Tail = true
	case ModeFreeze:
		drain.Tail, drain.Freeze = true, true
	case ModeFreezeNoBound:
		drain.Tail, drain.Freeze, drain.NoBound = true, true, true
	default:
		return c, false
	}
	return drain, true
}

// RunFig3 brings up a 3-host world (peer1, relay, peer2), streams from peer2
// to peer1 through a splice relay and offloads it at OffloadAt.
func RunFig3(ctx context.Context, cfg Fig3Config) (Trace, error) {
	if cfg.Interval == 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	tr := Trace{Cfg: cfg, RTOs: -1}
	oneWay := float64(cfg.RTT.Microseconds()) / 4000
	link := emu.Link{DelayMS: oneWay, RateMbit: cfg.RateMbit, QueueMS: cfg.QueueMS, LossPct: cfg.LossPct}
	whole := link
	whole.DelayMS *= 2
	spec := &emu.Spec{
		Name:  "fig3",
		Hosts: []emu.HostSpec{{Name: "p1"}, {Name: "relay"}, {Name: "p2"}},
		// p1-p2 is never used: peer1 talks to the relay's address, and after
		// the join the relay's program sends the packets on to peer2.
		Links: []emu.LinkSpec{linkSpec("p1", "relay", link), linkSpec("relay", "p2", link), linkSpec("p1", "p2", whole)},
		TCP:   emu.TCP{Congestion: cfg.CC},
	}
	w, err := emu.Up(ctx, spec, cfg.Log)
	if err != nil {
		return tr, fmt.Errorf("emu: %w", err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	direct := cfg.Mode == ModeDirect
	offloads := cfg.Mode != ModeRelay && !direct
	var sp *xlate.Splicer
	if offloads {
		if err := w.Do("relay", func() (err error) {
			xc := xlate.Config{NoKick: cfg.Mode == ModePlain, NoReopen: cfg.Mode == ModeProbe, RaiseWindow: cfg.Mode == ModeRaise, Log: cfg.Log}
			if pc, ok := PolicyConfig(cfg.Mode); ok {
				xc.Tail, xc.Freeze = pc.XlateHandover()
				xc.DrainPace = pc.XlateDrainPace()
				xc.PreDrain = pc.XlatePreDrain()
			} else if cfg.Mode == ModeNowFreeze || cfg.Mode == ModeGradualFreeze {
				xc.Tail, xc.Freeze = true, true
			}
			switch {
			case cfg.DrainPace > 0 && xc.Freeze:
				xc.DrainPace = cfg.DrainPace
			case cfg.DrainPace < 0:
				xc.DrainPace = 0
			}
			if cfg.FirstRound > 0 && xc.Freeze {
				xc.FirstRound = cfg.FirstRound
			}
			switch {
			case cfg.PreDrain > 0 && xc.Freeze:
				xc.PreDrain = cfg.PreDrain
			case cfg.PreDrain < 0:
				xc.PreDrain = 0
			}
			sp, err = xlate.Open(ctx, xc)
			return err
		}); err != nil {
			return tr, err
		}
		defer sp.Close()
	}
	srv, err := w.Listen(ctx, "p2", "tcp", fmt.Sprintf(":%d", serverPort))
	if err != nil {
		return tr, err
	}
	defer srv.Close()
	// peer2 streams until the end.
	sender := make(chan *net.TCPConn, 1)
	go serve(ctx, srv, sender)
	var a, b *net.TCPConn
	copies := make(chan error, 2)
	var c1 net.Conn
	if direct {
		// Over the p1-p2 link: the whole path's one-way delay, the
		// same rate and queue (the joined path's bottleneck is one such
		// queue too).
		if c1, err = w.Dial(ctx, "p1", "tcp", fmt.Sprintf("%s:%d", w.Addr("p2"), serverPort)); err != nil {
			return tr, err
		}
		defer c1.Close()
	} else {
		rl, err := w.Listen(ctx, "relay", "tcp", fmt.Sprintf(":%d", relayPort))
		if err != nil {
			return tr, err
		}
		defer rl.Close()
		if c1, err = w.Dial(ctx, "p1", "tcp", fmt.Sprintf("%s:%d", w.Addr("relay"), relayPort)); err != nil {
			return tr, err
		}
		defer c1.Close()
		ca, err := rl.Accept()
		if err != nil {
			return tr, err
		}
		defer ca.Close()
		cb, err := w.Dial(ctx, "relay", "tcp", fmt.Sprintf("%s:%d", w.Addr("p2"), serverPort))
		if err != nil {
			return tr, err
		}
		defer cb.Close()
		a, b = ca.(*net.TCPConn), cb.(*net.TCPConn)
		go copyHalf(b, a, copies)
		go copyHalf(a, b, copies)
	}

	var got, maxGap atomic.Int64
	var watch atomic.Bool
	go drain(c1, &got, &watch, &maxGap)
	snd := <-sender

	born := time.Now() // the flow's start, for the policy's age rule
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	n := int(cfg.Duration / cfg.Interval)
	offIdx := int(cfg.OffloadAt / cfg.Interval)
	tr.OffloadIdx = offIdx
	ramp := cfg.Mode == ModeGradual || cfg.Mode == ModeGradualFreeze
	var steps []float64
	if ramp {
		// From RTT/4 to RTT/2 one way per link: +5 ms one way = +10 ms
		// on a leg's RTT per step, one step every 3 RTTs of the leg.
		for d := oneWay + 5; d < 2*oneWay; d += 5 {
			steps = append(steps, d)
		}
		steps = append(steps, 2*oneWay)
	}
	stepEvery := max(1, int((3*cfg.RTT/2)/cfg.Interval))
	if cfg.StepEvery > 0 {
		stepEvery = max(1, int(cfg.StepEvery/cfg.Interval))
	}
	rampStart := offIdx - len(steps)*stepEvery
	if ramp {
		tr.OffloadIdx = rampStart
	}
	handover := make(chan error, 1)
	stopWait := make(chan struct{})
	var last int64
	var qpre uint64 // the relay -> peer1 link's queue drops one second before the due time
	for i := 0; i < n; i++ {
		select {
		case <-ctx.Done():
			return tr, ctx.Err()
		case <-tick.C:
		}
		cur := got.Load()
		if cfg.TraceSender {
			tr.Sender = append(tr.Sender, senderSample(snd))
		}
		tr.Mbps = append(tr.Mbps, float64(cur-last)*8/cfg.Interval.Seconds()/1e6)
		last = cur
		if ramp && i+1 >= rampStart && i+1 < offIdx && (i+1-rampStart)%stepEvery == 0 {
			d := steps[(i+1-rampStart)/stepEvery]
			l := link
			l.DelayMS = d
			w.SetLink("p1", "relay", l)
			w.SetLink("relay", "p2", l)
		}
		if i+1 == offIdx {
			watch.Store(true)
		}
		if i+1 == max(0, offIdx-int(time.Second/cfg.Interval)) {
			qpre = w.Stats("relay", "p1").QueueDrops
		}
		if i+1 == offIdx && offloads {
			go func() {
				if pc, ok := PolicyConfig(cfg.Mode); ok {
					// The relay's watcher, due from now on: its rules hold
					// the offload back while a window would limit the joined
					// flow, then it bounds what the relay holds; up to the
					// flow's end.
					due := time.Now()
					w := relay.NewOffloadWatcher(a, b, born, pc, cfg.Log)
					for {
						ready, wait, held, err := w.Step()
						if err != nil {
							handover <- err
							return
						}
						if ready {
							tr.Held = ""
							break
						}
						if held != "" {
							tr.Held = held
						}
						select {
						case <-stopWait:
							tr.Waited = time.Since(due)
							handover <- errHeld
							return
						case <-time.After(wait):
						}
					}
					tr.Waited = time.Since(due)
				}
				t0 := time.Now()
				q0 := w.Stats("relay", "p1").QueueDrops
				qin0 := w.Stats("p2", "relay").QueueDrops
				tr.QueueDropsPre = q0 - qpre
				a.SetReadDeadline(time.Now())
				b.SetReadDeadline(time.Now())
				for range 2 {
					if err := <-copies; !errors.Is(err, os.ErrDeadlineExceeded) {
						handover <- fmt.Errorf("relay copy: %v", err)
						return
					}
				}
				err := w.Do("relay", func() error {
					hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
					defer hcancel()
					j, err := sp.Handover(hctx, a, b)
					if err == nil {
						tr.Phases = j.Phases
						tr.HeldDrops = sp.Stats().HeldDrops
					}
					return err
				})
				tr.Handover = time.Since(t0)
				tr.QueueDrops = w.Stats("relay", "p1").QueueDrops - q0
				if err == nil {
					// The resumed sender's first joined round crosses the
					// link within about one end-to-end RTT of the join's
					// end: its drops count too.
					select {
					case <-time.After(cfg.RTT + cfg.RTT/2):
					case <-stopWait:
					}
					tr.QueueDropsAfter = w.Stats("relay", "p1").QueueDrops - q0 - tr.QueueDrops
					tr.QueueDropsIn = w.Stats("p2", "relay").QueueDrops - qin0
				}
				if err == nil && ramp {
					w.SetLink("p1", "relay", link)
					w.SetLink("relay", "p2", link)
				}
				handover <- err
			}()
		}
	}
	if offloads {
		close(stopWait)
		if err := <-handover; err != nil && !errors.Is(err, errHeld) {
			return tr, fmt.Errorf("handover: %w", err)
		}
	}
	tr.MaxGap = time.Duration(maxGap.Load())
	tr.RTOs, tr.Retrans = senderStats(snd)
	lo, hi := max(0, tr.OffloadIdx-int(time.Second/cfg.Interval)), tr.OffloadIdx
	for _, v := range tr.Mbps[lo:hi] {
		tr.Pre += v
	}
	tr.Pre /= float64(max(1, hi-lo))
	from := min(len(tr.Mbps), tr.OffloadIdx+int((tr.Waited+tr.Handover+cfg.Interval-1)/cfg.Interval))
	for _, v := range tr.Mbps[from:] {
		tr.Post += v
	}
	tr.Post /= float64(max(1, len(tr.Mbps)-from))
	tr.MinRatio = 1e9
	for _, v := range tr.Mbps[tr.OffloadIdx:] {
		tr.MinRatio = min(tr.MinRatio, v/tr.Pre)
	}
	return tr, nil
}

func linkSpec(a, b string, l emu.Link) emu.LinkSpec {
	return emu.LinkSpec{A: a, B: b, DelayMS: &l.DelayMS, RateMbit: &l.RateMbit, QueueMS: &l.QueueMS}
}

// serve accepts one connection and writes to it until it fails.
func serve(ctx context.Context, l net.Listener, sender chan<- *net.TCPConn) {
	c, err := l.Accept()
	if err != nil {
		close(sender)
		return
	}
	tc := c.(*net.TCPConn)
	sender <- tc
	buf := make([]byte, 256<<10)
	for ctx.Err() == nil {
		if _, err := tc.Write(buf); err != nil {
			return
		}
	}
}

// drain reads c to the end, counting bytes in got; once watch is set it
// records in maxGap the longest time between two reads.
func drain(c net.Conn, got *atomic.Int64, watch *atomic.Bool, maxGap *atomic.Int64) {
	buf := make([]byte, 256<<10)
	last := time.Now()
	for {
		n, err := c.Read(buf)
		got.Add(int64(n))
		now := time.Now()
		if watch.Load() {
			if g := int64(now.Sub(last)); g > maxGap.Load() {
				maxGap.Store(g)
			}
		}
		last = now
		if err != nil {
			return
		}
	}
}

// copyHalf copies src to dst until src fails (the read deadline that stops
// it for the handover, or EOF).
func copyHalf(dst, src *net.TCPConn, done chan<- error) {
	_, err := io.Copy(dst, src)
	done <- err
}

// senderStats reads tcpi_total_rto (Linux 6.7+) and tcpi_total_retrans.
func senderStats(c *net.TCPConn) (rtos, retrans int) {
	rtos, retrans = -1, -1
	info, n := tcpInfo(c)
	if n < 104 {
		return
	}
	retrans = int(binary.NativeEndian.Uint32(info[100:]))
	if n >= 244 {
		rtos = int(binary.NativeEndian.Uint16(info[240:]))
	}
	return
}

// tcpInfo reads c's struct tcp_info as the kernel returns it, and how many
// bytes of it the kernel filled (0 when c is nil or the read failed).
func tcpInfo(c *net.TCPConn) (info [512]byte, n uint32) {
	if c == nil {
		return info, 0
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return info, 0
	}
	raw.Control(func(fd uintptr) {
		l := uint32(len(info))
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0); e == 0 {
			n = l
		}
	})
	return info, n
}

// senderSample reads c's TCP_INFO (Linux 6.2+ layout).
func senderSample(c *net.TCPConn) (s SenderSample) {
	info, n := tcpInfo(c)
	if n < 232 {
		return
	}
	ne := binary.NativeEndian
	s.CaState = info[1]
	s.Unacked = ne.Uint32(info[24:])
	s.SRTT = time.Duration(ne.Uint32(info[68:])) * time.Microsecond
	s.Ssthresh = ne.Uint32(info[76:])
	s.Cwnd = ne.Uint32(info[80:])
	s.Retrans = ne.Uint32(info[100:])
	s.PacingRate = ne.Uint64(info[104:])
	s.NotSent = ne.Uint32(info[144:])
	s.DeliveryRate = ne.Uint64(info[160:])
	s.Busy = time.Duration(ne.Uint64(info[168:])) * time.Microsecond
	s.RwndLimited = time.Duration(ne.Uint64(info[176:])) * time.Microsecond
	s.SndbufLimited = time.Duration(ne.Uint64(info[184:])) * time.Microsecond
	s.SndWnd = ne.Uint32(info[228:])
	return
}
