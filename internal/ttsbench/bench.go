package ttsbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/intercept"
)

// Mode is one way of carrying a flow from the client to the server.
type Mode string

// The modes.
const (
	E2E   Mode = "e2e"   // end to end: the on-path hosts only forward
	TTS   Mode = "tts"   // the on-path proxy's tproxy entry splits the flow transparently
	Split Mode = "split" // the client connects to the proxy's service entry (explicit relay)
	// PEPsal is the peer: a PEPsal binary (Config.PEPsal) on the relay
	// host behind its own TPROXY rules (internal/intercept), transparent
	// both ways like TTS.
	PEPsal Mode = "pepsal"
)

// bdpModePrefix starts the modes "tts-bdpG" (e.g. tts-bdp1.25): TTS
// through a second proxy on the relay host beside the first, whose tproxy
// entry has the same settings plus window_bdp: G, on a server port of its
// own (portBDP + the mode's index), so that every trial runs it beside tts
// in the same world.
const bdpModePrefix = "tts-bdp"

// BDPGain returns G of a mode tts-bdpG, and whether m is one.
func (m Mode) BDPGain() (float64, bool) {
	g, ok := strings.CutPrefix(string(m), bdpModePrefix)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(g, 64)
	if err != nil || !(v >= 1 && v <= 16) {
		return 0, false
	}
	return v, true
}

// Ports in the worlds.
const (
	portTTS    = 8080  // server port in the interception scope
	portDirect = 9080  // server port out of scope (E2E; the split relay's origin)
	portSplit  = 8000  // the explicit relay's service entry
	portTP     = 15001 // the transparent listener
	portGrid   = 8100  // grid: server port of segmentation configuration k is portGrid+k
	portPEPsal = 8090  // server port in PEPsal's interception scope
	pepsalPort = 5000  // PEPsal's transparent listener (its default)
	portBDP    = 8081  // server port of the i-th tts-bdpG mode: portBDP+i
	portBDPTP  = 15002 // its proxy's transparent listener: portBDPTP+i
)

// The i-th tts-bdpG proxy's policy route: a mark and table pair of its
// own (its mark + 1 and table + 1 too, for initcwnd), beside the first
// proxy's (intercept's defaults) and PEPsal's.
const (
	bdpMark  = 0x4d60
	bdpTable = 19800
)

// Config configures a run.
type Config struct {
	Mosto  []string // the command that runs the mosto binary, e.g. {os.Executable()}
	Env    []string // extra environment of the proxy processes
	Dir    string   // work and results folder (configs, logs, tts.md, plots)
	Trials int      // trials per cell (the seed: 200)
	// Size of the streamed file; 0 means DefaultSize.
	Size     int64
	CCs      []string // congestion controls; default cubic, bbr
	Modes    []Mode   // default e2e, tts, split
	Rows     []Row    // default SeedRows()
	RateMbit float64  // link rate; 0 means 100 (the seed's R)
	// Timeout bounds one transfer; 0 means 10 minutes.
	Timeout  time.Duration
	Realtime bool // emulator threads at real-time priority
	// Sysctls ("net.ipv4.tcp_recovery=0") are set in every host of the
	// world after it comes up (experiments with the TCP stack).
	Sysctls []string
	// RelaySysctls are set only in the on-path relay hosts (r1, r2, ...),
	// after Sysctls: the relay's own netns settings, which shape only the
	// connections it terminates (its legs), never the flows it forwards.
	RelaySysctls []string
	// JitterGSO draws the links' jitter once per GSO packet, as netem does
	// per skb on the seed's veth links (emu.Link.JitterGSO); default: per
	// wire segment.
	JitterGSO bool
	// NetemLimit bounds what each direction of the tables' links holds,
	// queued and in the delay line together, at 1000 packets: netem's
	// limit as the seed's Mininet links had it (emu.Link.LimitPkts);
	// default: a 1000-packet queue with the delay line unbounded.
	NetemLimit bool
	// RelayCC is the congestion control of the relay's own connections
	// (the proxy's socket.congestion); default: the table's.
	RelayCC string
	// RelayNoSACK runs the legs of intercepted flows without SACK (the
	// tproxy entry's no_sack); the explicit split relay's legs keep it.
	RelayNoSACK bool
	// TProxyCC is the tproxy entry's congestion control (the intercepted
	// legs only; after RelayCC); default: none (the proxy's).
	TProxyCC string
	// TProxyPacing sets the tproxy entry's pacing (TCP-internal pacing on
	// the intercepted legs).
	TProxyPacing bool
	// TProxyPacingMbit caps the intercepted legs' pacing (tproxy
	// pacing_mbit); 0: no cap.
	TProxyPacingMbit float64
	// TProxyInitCwnd is the intercepted legs' initial congestion window
	// (tproxy initcwnd, segments); 0: the kernel's.
	TProxyInitCwnd int
	// TProxyWindowClamp bounds the receive window of the intercepted
	// legs (tproxy window_clamp, bytes); 0: none.
	TProxyWindowClamp int64
	// TProxyHandshakeHold holds the intercepted flows' handshake ACK to
	// the server and their first bytes (tproxy handshake_hold); 0: off.
	TProxyHandshakeHold time.Duration
	// PEPsal is the path of a PEPsal binary (github.com/CNES/pepsal,
	// built by the user; none is shipped), needed by the pepsal mode.
	PEPsal string
	// Parallel runs the tables in this many worlds at once (each its own
	// namespaces, links, proxy and server), the trials of a cell dealt
	// out among them; 0 or 1: one world. Every transfer records it
	// (Trial.Parallel), so pooled tables can keep the parallel runs apart.
	Parallel int
	Log      *slog.Logger
	Progress io.Writer // one line per finished cell; nil: none
}

// DefaultSize makes end-to-end TCP take about 5.9 s at 100 Mbit/s on the
// lossy last-mile row, as in the seed: 70 MB.
const DefaultSize = 70_000_000

func (c *Config) defaults() error {
	if len(c.Mosto) == 0 {
		return errors.New("ttsbench: no mosto command")
	}
	if c.Dir == "" {
		return errors.New("ttsbench: no directory")
	}
	if c.Trials < 1 {
		return fmt.Errorf("ttsbench: trials %d; want >= 1", c.Trials)
	}
	if c.Size == 0 {
		c.Size = DefaultSize
	}
	if c.Parallel < 0 {
		return fmt.Errorf("ttsbench: parallel %d; want >= 0", c.Parallel)
	}
	if c.Parallel == 0 {
		c.Parallel = 1
	}
	if c.Size < 1 {
		return fmt.Errorf("ttsbench: size %d; want > 0", c.Size)
	}
	if len(c.CCs) == 0 {
		c.CCs = []string{"cubic", "bbr"}
	}
	if len(c.Modes) == 0 {
		c.Modes = []Mode{E2E, TTS, Split}
	}
	for _, m := range c.Modes {
		if _, ok := m.BDPGain(); !ok && m != E2E && m != TTS && m != Split && m != PEPsal {
			return fmt.Errorf("ttsbench: unknown mode %q (want e2e, tts, split, pepsal, tts-bdpG with G in [1, 16])", m)
		}
		if m == PEPsal && c.PEPsal == "" {
			return errors.New("ttsbench: mode pepsal needs the path of a PEPsal binary")
		}
	}
	if c.Rows == nil {
		c.Rows = SeedRows()
	}
	if c.RateMbit == 0 {
		c.RateMbit = 100
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return os.MkdirAll(c.Dir, 0o755)
}

// lab is a running world with a server and the proxies.
type lab struct {
	cfg     *Config
	w       *emu.World
	size    int64
	servers []net.Listener
	srvWG   sync.WaitGroup
	procs   []*proc
	ics     []*intercept.Interception // removed after the processes
}

func (l *lab) close() {
	for _, s := range l.servers {
		s.Close()
	}
	l.srvWG.Wait()
	for _, p := range l.procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	for _, ic := range l.ics {
		ic.Remove()
	}
	l.w.Close()
}

func linkSpec(a, b string, delay, jitter, loss, rate float64, jitterGSO bool) emu.LinkSpec {
	q := 1000 // netem's default limit (packets), as Mininet's TCLink
	r := true // netem jitter reorders
	return emu.LinkSpec{A: a, B: b, DelayMS: &delay, JitterMS: &jitter, LossPct: &loss, RateMbit: &rate, QueuePkts: &q, Reorder: &r, JitterGSO: &jitterGSO}
}

// sysctls sets cfg.Sysctls in every host, then cfg.RelaySysctls in the
// relay hosts (named r1, r2, ...).
func (l *lab) sysctls(ctx context.Context) error {
	set := func(h, kv string) error {
		if out, err := l.w.Command(ctx, h, "sysctl", "-q", "-w", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("ttsbench: sysctl %s in %s: %v: %s", kv, h, err, out)
		}
		return nil
	}
	for _, kv := range l.cfg.Sysctls {
		for _, h := range l.w.Hosts() {
			if err := set(h, kv); err != nil {
				return err
			}
		}
	}
	for _, kv := range l.cfg.RelaySysctls {
		for _, h := range l.w.Hosts() {
			if isRelay(h) {
				if err := set(h, kv); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// isRelay reports whether host h of a bench world is an on-path relay.
func isRelay(h string) bool {
	return len(h) > 1 && h[0] == 'r' && h[1] >= '0' && h[1] <= '9'
}

// serve streams size bytes to every connection on addr of host s after a
// one-byte request.
func (l *lab) serve(ctx context.Context, port uint16) error {
	ln, err := l.w.Listen(ctx, "s", "tcp4", netip.AddrPortFrom(l.w.Addr("s"), port).String())
	if err != nil {
		return err
	}
	l.servers = append(l.servers, ln)
	l.srvWG.Go(func() {
		var conns sync.WaitGroup
		defer conns.Wait()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer c.Close()
				var req [1]byte
				c.SetDeadline(time.Now().Add(l.cfg.Timeout))
				if _, err := io.ReadFull(c, req[:]); err != nil {
					return
				}
				io.CopyN(c, zeros{}, l.size)
			})
		}
	})
	return nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// fetch connects from c to addr, sends the request and reads until the
// end; the time runs from the dial to the last byte.
func (l *lab) fetch(ctx context.Context, addr netip.AddrPort) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	start := time.Now()
	c, err := l.w.Dial(ctx, "c", "tcp4", addr.String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	if _, err := c.Write([]byte{1}); err != nil {
		return 0, err
	}
	n, err := io.Copy(io.Discard, c)
	if err != nil {
		return 0, err
	}
	if n != l.size {
		return 0, fmt.Errorf("fetch %v: got %d bytes; want %d", addr, n, l.size)
	}
	return time.Since(start), nil
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process exited (Wait returned)
}

// proxy starts `mosto proxy` in host with the given config and waits until
// ready (an address) accepts connections.
func (l *lab) proxy(ctx context.Context, host, conf string, ready netip.AddrPort) error {
	name := host
	if id := proxyID(conf); id != host {
		name = host + "-" + id
	}
	path := filepath.Join(l.cfg.Dir, fmt.Sprintf("proxy-%s-%s.yaml", l.w.RunID(), name))
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return err
	}
	logf, err := os.Create(strings.TrimSuffix(path, ".yaml") + ".log")
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append(append([]string(nil), l.cfg.Mosto[1:]...), "proxy", "-config", path)
	cmd := l.w.Command(context.Background(), host, l.cfg.Mosto[0], args...)
	cmd.Env = append(os.Environ(), l.cfg.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("ttsbench: start proxy in %s: %w", host, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	l.procs = append(l.procs, p)
	deadline := time.Now().Add(30 * time.Second)
	for !l.ready(ctx, ready) {
		select {
		case <-p.done:
			out, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("ttsbench: proxy in %s exited: %s", host, out)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("ttsbench: proxy in %s not ready after 30 s: %s", host, out)
		}
	}
	return nil
}

func (l *lab) ready(ctx context.Context, a netip.AddrPort) bool {
	if !a.IsValid() {
		return true
	}
	host := "c"
	if a.Port() == portTP || a.Port() >= portBDPTP && a.Port() < portBDPTP+16 {
		host = l.hostOf(a.Addr())
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := l.w.Dial(ctx, host, "tcp4", a.String())
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (l *lab) hostOf(a netip.Addr) string {
	for _, h := range l.w.Hosts() {
		if l.w.Addr(h) == a {
			return h
		}
	}
	return ""
}

// proxyConf is the config of the proxy of an on-path host: the tproxy
// entry for ports (empty: none) and, when split is set, a service entry
// whose origin is the server's out-of-scope port.
// cfg gives the tproxy entry's settings (Config.RelayNoSACK, TProxy*).
func proxyConf(id string, ports []int, split *[2]netip.AddrPort, cc string, cfg *Config) string {
	return proxyConfWith(id, ports, split, cc, cfg, extraTProxy{})
}

// extraTProxy is what a second proxy's tproxy entry adds (mode tts-bdpG).
type extraTProxy struct {
	listen      uint16 // 0: portTP
	mark, table int    // 0: intercept's defaults
	windowBDP   float64
}

// proxyID reads the id a proxyConf config starts with.
func proxyID(conf string) string {
	first, _, _ := strings.Cut(conf, "\n")
	return strings.TrimPrefix(first, "id: ")
}

func proxyConfWith(id string, ports []int, split *[2]netip.AddrPort, cc string, cfg *Config, x extraTProxy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "id: %s\ndestinations: {allow: [\"%v\"]}\n", id, emu.Prefix)
	if len(ports) > 0 {
		ps := make([]string, len(ports))
		for i, p := range ports {
			ps[i] = fmt.Sprint(p)
		}
		listen := uint16(portTP)
		if x.listen != 0 {
			listen = x.listen
		}
		fmt.Fprintf(&b, "tproxy: {listen: \"0.0.0.0:%d\", ports: \"%s\", no_sack: %v", listen, strings.Join(ps, ","), cfg.RelayNoSACK)
		if x.mark != 0 {
			fmt.Fprintf(&b, ", mark: %d, route_table: %d", x.mark, x.table)
		}
		if x.windowBDP > 0 {
			fmt.Fprintf(&b, ", window_bdp: %g", x.windowBDP)
		}
		if cfg.TProxyCC != "" {
			fmt.Fprintf(&b, ", congestion: %s", cfg.TProxyCC)
		}
		if cfg.TProxyPacing {
			b.WriteString(", pacing: true")
		}
		if cfg.TProxyPacingMbit > 0 {
			fmt.Fprintf(&b, ", pacing_mbit: %g", cfg.TProxyPacingMbit)
		}
		if cfg.TProxyInitCwnd > 0 {
			fmt.Fprintf(&b, ", initcwnd: %d", cfg.TProxyInitCwnd)
		}
		if cfg.TProxyWindowClamp > 0 && x.windowBDP == 0 { // they exclude each other
			fmt.Fprintf(&b, ", window_clamp: %d", cfg.TProxyWindowClamp)
		}
		if cfg.TProxyHandshakeHold > 0 {
			fmt.Fprintf(&b, ", handshake_hold: %v", cfg.TProxyHandshakeHold)
		}
		b.WriteString("}\n")
	}
	if split != nil {
		fmt.Fprintf(&b, "services: [{name: split, listen: \"%v\", origin: \"%v\"}]\n", split[0], split[1])
	}
	fmt.Fprintf(&b, "socket: {congestion: %s}\ntimeouts: {drain: 1s, idle: 15m}\n", cc)
	return b.String()
}

// shuffled returns the modes in a random order (per trial, so that no mode
// always runs first after an idle period).
func shuffled[T any](xs []T) []T {
	out := append([]T(nil), xs...)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// shuffledWith is shuffled with the given source (a run's recorded seed).
func shuffledWith[T any](r *rand.Rand, xs []T) []T {
	out := append([]T(nil), xs...)
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func secs(d time.Duration) float64 { return d.Seconds() }

func nan() float64 { return math.NaN() }
