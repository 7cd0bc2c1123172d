package emu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// World is a running emulated network. All its methods are safe for
// concurrent use.
type World struct {
	log     *slog.Logger
	runID   string
	name    string
	offload bool
	base    time.Time
	bufs    *bufPools
	scheds  []*scheduler // delivery threads, by destination host
	done    chan struct{}
	wg      sync.WaitGroup

	hosts  []*host
	byName map[string]int
	byAddr map[netip.Addr]int

	// paths holds the host path of every routed pair (Spec.Routes);
	// read-only once up, nil without routes.
	paths   map[[2]int][]int
	forward []bool // hosts on some route's path: ip_forward on

	mu    sync.Mutex // guards pipes creation and links
	links [][]Link
	pipes [][]atomic.Pointer[pipe]

	restoreCC string // root tcp_allowed_congestion_control to restore, if changed
	setCC     string // the value we set
	stateDir  string

	closeOnce sync.Once
	closeErr  error

	unknownDst atomic.Uint64

	stopFd    int  // eventfd, readable once the world closes
	realtime  bool // SCHED_FIFO for the reader and delivery threads (opt-in)
	keepProcs bool // do not raise GOMAXPROCS
	rtFailed  sync.Once

	cmdMu sync.Mutex
	cmds  []*exec.Cmd
}

type host struct {
	name  string
	addr  netip.Addr
	netns string
	tun   int // TUN file descriptor (non-blocking), -1 when none
	// created is set once this world made the namespace; Close deletes
	// only such namespaces (never another world's of the same name).
	created bool
}

// UpOptions tunes Up; the zero value is fine.
type UpOptions struct {
	RunID    string // default: random 6 hex digits
	StateDir string // default: /run/mosto/emu
	// Realtime gives the emulator's reader and delivery threads SCHED_FIFO
	// priority. Off by default: on the 2-core test machine it cost 30-50%
	// more CPU per forwarded byte (every packet's wake-up preempts the
	// sender at once, with an IPI) without keeping delays tighter under
	// load; see docs/emu.md, "Timing".
	Realtime bool
	// KeepGOMAXPROCS stops Up from raising GOMAXPROCS to the number of
	// CPUs plus two per host (it never lowers it), at the cost of delay
	// spikes when many emulator threads wake at once.
	KeepGOMAXPROCS bool
}

// maxProcs caps the GOMAXPROCS that Up sets.
const maxProcs = 512

// DefaultStateDir holds one directory per running world.
const DefaultStateDir = "/run/mosto/emu"

// Up brings a world up: one namespace and TUN device per host, the TCP
// settings, and the forwarding goroutines. Close removes everything.
func Up(ctx context.Context, spec *Spec, log *slog.Logger) (*World, error) {
	return UpWith(ctx, spec, log, UpOptions{})
}

// UpWith is Up with options.
func UpWith(ctx context.Context, spec *Spec, log *slog.Logger, opt UpOptions) (*World, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	p, err := spec.resolve()
	if err != nil {
		return nil, err
	}
	if opt.StateDir == "" {
		opt.StateDir = DefaultStateDir
	}
	if opt.RunID == "" {
		// A random run id that is taken (by a live or dead world) is
		// replaced; a chosen one is an error.
		for range 10 {
			var b [3]byte
			rand.Read(b[:])
			opt.RunID = hex.EncodeToString(b[:])
			if !runIDTaken(opt.RunID, opt.StateDir) {
				break
			}
		}
	}
	if !validRunID(opt.RunID) {
		return nil, fmt.Errorf("emu: bad run id %q (1-6 lowercase letters or digits)", opt.RunID)
	}
	n := len(p.names)
	w := &World{
		log:     log.With("world", spec.Name, "run", opt.RunID),
		runID:   opt.RunID,
		name:    spec.Name,
		offload: spec.Offload == nil || *spec.Offload,
		base:    time.Now(),
		bufs:    newBufPools(),
		done:    make(chan struct{}),
		byName:  make(map[string]int, n),
		byAddr:  make(map[netip.Addr]int, n),
		links:   p.links,
		paths:   p.paths,
		forward: p.forward,
		pipes:   make([][]atomic.Pointer[pipe], n),
		stopFd:  -1,

		realtime:  opt.Realtime,
		keepProcs: opt.KeepGOMAXPROCS,
	}
	for i, name := range p.names {
		w.hosts = append(w.hosts, &host{name: name, addr: p.addrs[i], netns: fmt.Sprintf("mosto-%s-%d", opt.RunID, i), tun: -1})
		w.byName[name] = i
		w.byAddr[p.addrs[i]] = i
		w.pipes[i] = make([]atomic.Pointer[pipe], n)
	}
	start := time.Now()
	if err := w.up(ctx, spec, opt.StateDir); err != nil {
		w.Close()
		return nil, err
	}
	w.log.Info("world up", "hosts", n, "offload", w.offload, "took", time.Since(start).Round(time.Millisecond))
	return w, nil
}

func (w *World) up(ctx context.Context, spec *Spec, stateRoot string) error {
	if err := os.MkdirAll(stateRoot, 0o755); err != nil {
		return fmt.Errorf("emu: state dir: %w", err)
	}
	dir := filepath.Join(stateRoot, w.runID)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("emu: run id %s: %w", w.runID, err)
	}
	w.stateDir = dir
	if err := writeState(w.stateDir, w.state()); err != nil {
		return err
	}
	if err := w.allowCongestion(spec.TCP.Congestion); err != nil {
		return err
	}
	if w.setCC != "" {
		if err := writeState(w.stateDir, w.state()); err != nil {
			return err
		}
	}
	if err := ensureNetnsDir(); err != nil {
		return fmt.Errorf("emu: %w", err)
	}
	// Create and configure the hosts in parallel.
	workers := min(len(w.hosts), 8)
	jobs := make(chan int)
	errs := make(chan error, len(w.hosts))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				errs <- w.setupHost(ctx, i, spec.TCP)
			}
		})
	}
	for i := range w.hosts {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		if err != nil {
			all = append(all, err)
		}
	}
	if len(all) > 0 {
		return errors.Join(all...)
	}
	// Writing a packet to a TUN device runs the destination's receive path
	// in the writer's thread, so every destination host gets its own
	// delivery thread: a bulk flow to one host does not delay packets to
	// another behind its writes.
	stopFd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("emu: eventfd: %w", err)
	}
	w.stopFd = stopFd
	var ready sync.WaitGroup
	ready.Add(2 * len(w.hosts)) // a reader and a delivery thread per host
	for range len(w.hosts) {
		sched, err := newScheduler(w)
		if err != nil {
			return err
		}
		w.scheds = append(w.scheds, sched)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			sched.run(w.done, ready.Done)
		}()
	}
	for i := range w.hosts {
		w.wg.Add(1)
		go w.readLoop(i, ready.Done)
	}
	// Return only when every thread runs: a packet sent right after Up
	// must not wait for its reader to start.
	ready.Wait()
	if !w.keepProcs {
		// Each locked thread that wakes from ppoll needs a P to run Go
		// code. With fewer Ps than threads a waking thread may wait for
		// sysmon to take one back from a blocked thread (up to ~10 ms):
		// with GOMAXPROCS 2 a ping next to an iperf3 flow had a p99 of
		// 24-41 ms, with 32 of 11-12 ms (configured 10 ms).
		if want := min(runtime.NumCPU()+2*len(w.hosts), maxProcs); runtime.GOMAXPROCS(0) < want {
			runtime.GOMAXPROCS(want)
			w.log.Info("raised GOMAXPROCS for the emulator threads", "gomaxprocs", want)
		}
	}
	return nil
}

// runIDTaken reports whether a world with this run id has a state
// directory or a namespace.
func runIDTaken(id, stateRoot string) bool {
	if _, err := os.Stat(filepath.Join(stateRoot, id)); err == nil {
		return true
	}
	_, err := os.Stat(nsPath("mosto-" + id + "-0"))
	return err == nil
}

func (w *World) tunName() string { return "mosto-" + w.runID }

func (w *World) setupHost(ctx context.Context, i int, tcp TCP) error {
	h := w.hosts[i]
	err := createNetns(h.netns, func() error {
		// Disable IPv6 before the device appears: the emulator is IPv4 only.
		for _, s := range [][2]string{
			{"net/ipv6/conf/all/disable_ipv6", "1"},
			{"net/ipv6/conf/default/disable_ipv6", "1"},
		} {
			writeSysctl(s[0], s[1])
		}
		fd, err := openTUN(w.tunName(), w.offload)
		if err != nil {
			return err
		}
		h.tun = fd
		if w.forward[i] {
			// An on-path host forwards the packets of the pairs routed
			// through it back out of its only device: no redirects, no
			// reverse-path filter (a transparent relay here sends with
			// the client's address).
			for _, s := range [][2]string{
				{"net/ipv4/ip_forward", "1"},
				{"net/ipv4/conf/all/send_redirects", "0"},
				{"net/ipv4/conf/default/send_redirects", "0"},
				{"net/ipv4/conf/all/rp_filter", "0"},
				{"net/ipv4/conf/default/rp_filter", "0"},
				{"net/ipv4/conf/" + w.tunName() + "/send_redirects", "0"},
				{"net/ipv4/conf/" + w.tunName() + "/rp_filter", "0"},
			} {
				if err := writeSysctl(s[0], s[1]); err != nil {
					return fmt.Errorf("forwarding: %w", err)
				}
			}
		}
		return applyTCP(tcp)
	})
	// On failure createNetns removed what it made; an existing namespace
	// of that name belongs to someone else.
	h.created = err == nil
	if err != nil {
		return fmt.Errorf("emu: host %s: %w", h.name, err)
	}
	route := fmt.Sprintf("route add %v dev %s src %v", Prefix, w.tunName(), h.addr)
	if tcp.InitCwnd > 0 {
		route += fmt.Sprintf(" initcwnd %d", tcp.InitCwnd)
	}
	if tcp.InitRwnd > 0 {
		route += fmt.Sprintf(" initrwnd %d", tcp.InitRwnd)
	}
	batch := strings.Join([]string{
		"link set lo up",
		fmt.Sprintf("link set dev %s mtu 1500 txqueuelen 10000 up", w.tunName()),
		fmt.Sprintf("addr add %v/32 dev %s", h.addr, w.tunName()),
		route,
	}, "\n") + "\n"
	cmd := exec.CommandContext(ctx, "ip", "-n", h.netns, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("emu: host %s: configure: %v: %s", h.name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// readLoop reads every packet host i sends and hands it to the pipe of its
// destination. It runs on its own OS thread (real-time priority with
// UpOptions.Realtime) and waits in ppoll(2), so the Go netpoller's scheduling delays
// do not add to the emulated delay.
func (w *World) readLoop(i int, ready func()) {
	defer w.wg.Done()
	// The thread may get real-time priority: it is never unlocked, so it
	// exits with the goroutine instead of running other goroutines.
	runtime.LockOSThread()
	w.setThreadPriority()
	ready()
	h := w.hosts[i]
	hdr := 0
	if w.offload {
		hdr = vnetHdrLen
	}
	buf := w.bufs.get(bigBufSize)
	defer func() { w.bufs.put(buf) }()
	fds := []unix.PollFd{{Fd: int32(h.tun), Events: unix.POLLIN}, {Fd: int32(w.stopFd), Events: unix.POLLIN}}
	for {
		buf = buf[:cap(buf)]
		n, err := unix.Read(h.tun, buf)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				fds[0].Revents, fds[1].Revents = 0, 0
				if _, err := unix.Ppoll(fds, nil, nil); err != nil && !errors.Is(err, unix.EINTR) {
					w.log.Warn("poll device", "host", h.name, "err", err)
					return
				}
				if fds[1].Revents != 0 {
					return // the world is closing
				}
				if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
					// Never spin at real-time priority on a broken device.
					w.log.Warn("device gone", "host", h.name, "revents", fds[0].Revents)
					return
				}
				continue
			}
			select {
			case <-w.done:
			default:
				w.log.Warn("read device", "host", h.name, "err", err)
			}
			return
		}
		now := w.now()
		pkt := buf[:n]
		if n < hdr+20 || pkt[hdr]>>4 != 4 {
			continue // not IPv4: the emulator is IPv4 only
		}
		dst, _ := netip.AddrFromSlice(pkt[hdr+16 : hdr+20])
		j, ok := w.byAddr[dst]
		if ok && w.paths != nil {
			src, _ := netip.AddrFromSlice(pkt[hdr+12 : hdr+16])
			j = w.nextHop(i, src, j)
		}
		if !ok || j == i {
			w.unknownDst.Add(1)
			continue
		}
		p := w.pipe(i, j)
		var out []byte
		if n <= smallBufSize {
			out = w.bufs.get(n)
			copy(out, pkt)
		} else {
			out = pkt
			buf = w.bufs.get(bigBufSize)
		}
		p.send(now, out)
	}
}

// nextHop returns the host to which host i hands a packet from src to
// host dst: the next host on the route of the pair (src's host, dst) when
// i is on it (a packet an on-path host forwards, or a transparent relay's
// packet sent with the client's address), else on the route (i, dst), else
// dst itself.
func (w *World) nextHop(i int, src netip.Addr, dst int) int {
	if s, ok := w.byAddr[src]; ok {
		if next, ok := nextOnPath(w.paths[[2]int{s, dst}], i); ok {
			return next
		}
	}
	if next, ok := nextOnPath(w.paths[[2]int{i, dst}], i); ok {
		return next
	}
	return dst
}

func nextOnPath(path []int, i int) (int, bool) {
	for k := 0; k+1 < len(path); k++ {
		if path[k] == i {
			return path[k+1], true
		}
	}
	return 0, false
}

// setThreadPriority gives the calling (locked) thread real-time priority
// when the world was brought up with UpOptions.Realtime. The kernel's RT
// throttling still leaves 5% of every second to others. Failure only costs
// precision.
func (w *World) setThreadPriority() {
	if !w.realtime {
		return
	}
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 10}
	if err := unix.SchedSetAttr(0, attr, 0); err != nil {
		w.rtFailed.Do(func() { w.log.Warn("no real-time priority for the emulator threads", "err", err) })
	}
}

// pipe returns the pipe i -> j, creating it on first use.
func (w *World) pipe(i, j int) *pipe {
	if p := w.pipes[i][j].Load(); p != nil {
		return p
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.pipes[i][j].Load(); p != nil {
		return p
	}
	p := newPipe(w, w.hosts[j].tun, w.scheds[j], w.links[i][j], uint64(time.Now().UnixNano())+uint64(i)<<32+uint64(j))
	w.pipes[i][j].Store(p)
	return p
}

func (w *World) now() int64 { return int64(time.Since(w.base)) }

// Close stops forwarding, kills every process left in the world's
// namespaces, deletes the namespaces (and with them the devices), restores
// root sysctls and removes the state directory. It is idempotent.
func (w *World) Close() error {
	w.closeOnce.Do(func() {
		start := time.Now()
		close(w.done)
		if w.stopFd >= 0 {
			var one [8]byte
			one[0] = 1
			unix.Write(w.stopFd, one[:])
		}
		for _, s := range w.scheds {
			s.kick()
		}
		w.wg.Wait()
		for _, s := range w.scheds {
			s.close()
		}
		for _, h := range w.hosts {
			if h.tun >= 0 {
				unix.Close(h.tun)
				h.tun = -1
			}
		}
		if w.stopFd >= 0 {
			unix.Close(w.stopFd)
			w.stopFd = -1
		}
		var errs []error
		w.killCommands()
		inodes := make(map[uint64]bool)
		for _, h := range w.hosts {
			if !h.created {
				continue
			}
			if ino, err := nsInode(nsPath(h.netns)); err == nil {
				inodes[ino] = true
			}
		}
		if k := killNetnsProcs(inodes); k > 0 {
			w.log.Info("killed processes left in the world", "count", k)
		}
		for _, h := range w.hosts {
			if !h.created {
				continue
			}
			if err := deleteNetns(h.netns); err != nil {
				errs = append(errs, err)
			}
		}
		if err := w.restoreCongestion(); err != nil {
			errs = append(errs, err)
		}
		if w.stateDir != "" {
			if err := os.RemoveAll(w.stateDir); err != nil {
				errs = append(errs, err)
			}
		}
		w.closeErr = errors.Join(errs...)
		w.log.Info("world down", "took", time.Since(start).Round(time.Millisecond))
	})
	return w.closeErr
}

// RunID returns the world's run id, part of every namespace name.
func (w *World) RunID() string { return w.runID }

// Hosts returns the host names in spec order.
func (w *World) Hosts() []string {
	out := make([]string, len(w.hosts))
	for i, h := range w.hosts {
		out[i] = h.name
	}
	return out
}

func (w *World) host(name string) (*host, error) {
	i, ok := w.byName[name]
	if !ok {
		return nil, fmt.Errorf("emu: unknown host %q", name)
	}
	return w.hosts[i], nil
}

// Addr returns the host's address inside the emulator, or the zero Addr for
// an unknown host.
func (w *World) Addr(host string) netip.Addr {
	h, err := w.host(host)
	if err != nil {
		return netip.Addr{}
	}
	return h.addr
}

// NetNS returns the name of the host's namespace (for `ip netns exec`), or
// "" for an unknown host.
func (w *World) NetNS(host string) string {
	h, err := w.host(host)
	if err != nil {
		return ""
	}
	return h.netns
}

// Command returns a command that runs inside the host's namespace (through
// `ip netns exec`). Processes still running at Close are killed.
func (w *World) Command(ctx context.Context, host string, name string, args ...string) *exec.Cmd {
	ns := w.NetNS(host)
	if ns == "" {
		ns = "mosto-unknown-host-" + host // makes Start/Run fail with a clear message
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w.cmdMu.Lock()
	w.cmds = append(w.cmds, cmd)
	w.cmdMu.Unlock()
	return cmd
}

// killCommands kills the process groups of commands made by Command that
// were started. A command that is still entering its namespace is not found
// by the namespace scan, so this runs first.
func (w *World) killCommands() {
	w.cmdMu.Lock()
	defer w.cmdMu.Unlock()
	for _, c := range w.cmds {
		if c.Process != nil && c.Process.Pid > 0 {
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
	}
	w.cmds = nil
}

// Do runs fn on a locked OS thread inside the host's namespace. Sockets fn
// creates stay in that namespace; goroutines fn starts do not run in it.
func (w *World) Do(host string, fn func() error) error {
	h, err := w.host(host)
	if err != nil {
		return err
	}
	return doInNetns(nsPath(h.netns), fn)
}

// Listen listens inside the host's namespace.
func (w *World) Listen(ctx context.Context, host, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := w.Do(host, func() error {
		var err error
		l, err = (&net.ListenConfig{}).Listen(ctx, network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a packet socket inside the host's namespace.
func (w *World) ListenPacket(ctx context.Context, host, network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := w.Do(host, func() error {
		var err error
		c, err = (&net.ListenConfig{}).ListenPacket(ctx, network, addr)
		return err
	})
	return c, err
}

// Dial connects from inside the host's namespace.
func (w *World) Dial(ctx context.Context, host, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := w.Do(host, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// SetLink changes both directions of the pair a-b to l while running.
// Packets already in flight keep their delivery times.
func (w *World) SetLink(a, b string, l Link) error {
	if err := w.SetLinkDir(a, b, l); err != nil {
		return err
	}
	return w.SetLinkDir(b, a, l)
}

// SetLinkDir changes only the direction a -> b.
func (w *World) SetLinkDir(a, b string, l Link) error {
	i, ok := w.byName[a]
	if !ok {
		return fmt.Errorf("emu: unknown host %q", a)
	}
	j, ok := w.byName[b]
	if !ok {
		return fmt.Errorf("emu: unknown host %q", b)
	}
	if i == j {
		return fmt.Errorf("emu: set link %s-%s: same host", a, b)
	}
	if err := l.validate(fmt.Sprintf("link %s-%s", a, b)); err != nil {
		return err
	}
	w.mu.Lock()
	w.links[i][j] = l
	p := w.pipes[i][j].Load()
	w.mu.Unlock()
	if p != nil {
		p.setLink(l)
	}
	return nil
}

// Link returns the current properties of the direction a -> b.
func (w *World) Link(a, b string) (Link, error) {
	i, ok := w.byName[a]
	j, ok2 := w.byName[b]
	if !ok || !ok2 || i == j {
		return Link{}, fmt.Errorf("emu: no link %s-%s", a, b)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.links[i][j], nil
}

// Stats returns the counters of the direction a -> b.
func (w *World) Stats(a, b string) LinkStats {
	i, ok := w.byName[a]
	j, ok2 := w.byName[b]
	if !ok || !ok2 || i == j {
		return LinkStats{}
	}
	if p := w.pipes[i][j].Load(); p != nil {
		return p.stats()
	}
	return LinkStats{}
}

// Lateness sums the delivery threads' lateness counters (see Lateness).
func (w *World) Lateness() Lateness {
	var l Lateness
	for _, s := range w.scheds {
		l.Packets += s.late.packets.Load()
		l.Over500us += s.late.over500us.Load()
		l.Over2ms += s.late.over2ms.Load()
		l.SumNs += s.late.sumNs.Load()
	}
	return l
}

// Unrouted returns how many packets the emulator dropped because their
// destination was not a host of the world (or was the sender itself).
func (w *World) Unrouted() uint64 { return w.unknownDst.Load() }

// RTT returns the configured round-trip delay between a and b (the sum of
// both one-way delays, over every hop of a routed pair), without queueing
// or serialization.
func (w *World) RTT(a, b string) time.Duration {
	if path := w.Path(a, b); len(path) > 2 {
		var sum time.Duration
		for k := 0; k+1 < len(path); k++ {
			sum += w.RTT(path[k], path[k+1])
		}
		return sum
	}
	ab, err1 := w.Link(a, b)
	ba, err2 := w.Link(b, a)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(math.Round((ab.DelayMS + ba.DelayMS) * 1e6))
}

// Path returns the hosts a packet from a to b crosses, both ends included:
// [a b] for a direct pair, nil for unknown hosts.
func (w *World) Path(a, b string) []string {
	i, ok := w.byName[a]
	j, ok2 := w.byName[b]
	if !ok || !ok2 || i == j {
		return nil
	}
	path, ok := w.paths[[2]int{i, j}]
	if !ok {
		path = []int{i, j}
	}
	out := make([]string, len(path))
	for k, h := range path {
		out[k] = w.hosts[h].name
	}
	return out
}
