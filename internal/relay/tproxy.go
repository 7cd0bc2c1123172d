package relay

// Entry: transparent interception (seed 002, docs/tts.md). The proxy
// installs nftables TPROXY rules (internal/intercept) that steer in-scope
// flows crossing this host into an IP_TRANSPARENT listener; the original
// destination is the flow's target, and the upstream connection binds the
// client's address and port, so neither end sees the proxy.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/intercept"
)

// TProxyConfig is the transparent entry (`tproxy:`).
type TProxyConfig struct {
	// Listen is the transparent listener (IP_TRANSPARENT), e.g.
	// 0.0.0.0:15001; the rules deliver intercepted flows to its port.
	Listen string `yaml:"listen"`
	// Name names the nftables table (mosto_tp_<name>); default: the
	// proxy's id (characters other than letters, digits and '_' become
	// '_'). A restart with the same name replaces a crashed run's rules.
	Name string `yaml:"name"`
	// Scope: source and destination prefixes (or addresses) and
	// destination ports ("80,443,8000-8100"); empty: everything.
	Sources []string `yaml:"sources"`
	Dests   []string `yaml:"dests"`
	Ports   string   `yaml:"ports"`
	// Iface restricts interception to packets arriving on it.
	Iface string `yaml:"iface"`
	// FailClosed refuses in-scope flows (TCP reset) while the proxy is
	// not running instead of letting them pass untouched (fail-open).
	FailClosed bool `yaml:"fail_closed"`
	// NoSACK runs both legs of intercepted flows without SACK (the rules
	// strip SACK-permitted from their SYNs; intercept.Config.NoSACK): for
	// segments whose per-packet jitter is as large as their delay, where
	// RACK's time-based reordering window retransmits spuriously and the
	// dupACK threshold adapts instead (docs/tts.md, row 6). Not for lossy
	// segments.
	NoSACK bool `yaml:"no_sack"`
	// Congestion is the congestion control of both legs of intercepted
	// flows (TCP_CONGESTION on the transparent listener, whose accepted
	// connections inherit it, and on the upstream dial); empty: the
	// proxy's socket.congestion. Only the relay's own sending is
	// affected: its leg towards the client on downloads (towards the
	// server on uploads); the end hosts keep theirs. (On the seed's 200 ms
	// legs with 1000-packet queues bbr overfilled the queue and was no
	// better than CUBIC: docs/tts.md, rows 4-5 at 70 MB.)
	Congestion string `yaml:"congestion"`
	// Pacing turns on TCP's internal pacing on both legs
	// (SO_MAX_PACING_RATE: without an fq qdisc the kernel then paces in
	// TCP, at 2x cwnd/srtt in slow start and 1.2x after), and PacingMbit,
	// when > 0, caps the legs' sending at that rate (Mbit/s of TCP
	// payload and headers; it implies Pacing). Uncapped pacing makes
	// CUBIC's HyStart wait for a full RTT of ACK train instead of half
	// (tcp_cubic halves it only for unpaced sockets), so a long leg leaves
	// slow start at or past its BDP rather than ~10% below it, but then
	// overshoots a shallow queue; a cap at the leg's bottleneck rate keeps
	// the queue empty however far cwnd grows (docs/tts.md, rows 4-5 at
	// 70 MB). Off by default: a cap below the path's rate slows every
	// intercepted flow down to it.
	Pacing     bool    `yaml:"pacing"`
	PacingMbit float64 `yaml:"pacing_mbit"`
	// InitCwnd, when > 0, is the initial congestion window (segments) of
	// both legs of intercepted flows (intercept.Config.InitCwnd: the
	// legs' sockets are marked and routed through a copy of the main
	// table with `initcwnd`; the proxy's other connections and the
	// flows it forwards keep the kernel's 10). Set it to about the
	// bandwidth-delay product of the leg towards the client when the
	// relay is fed by a leg of equal or lower rate (its sending then
	// follows the data as it arrives, and CUBIC's HyStart cannot leave
	// slow start below the BDP: docs/tts.md, rows 4-5 at 70 MB). Too large
	// a value where the relay's upstream is faster than its downstream
	// sends a burst into the downstream queue. 0 (default): off.
	InitCwnd int `yaml:"initcwnd"`
	// WindowClamp, when > 0, bounds the receive window both legs
	// advertise (TCP_WINDOW_CLAMP before the handshake, bytes), so the
	// sender feeding the relay (the server on downloads) never has more
	// than that in flight. Linux's receive autotuning later raises the
	// clamp up to the largest window the window scale it chose can
	// express, so the lasting bound is 65535 x 2^(floor(log2(value))-15)
	// (3 MB: 4,194,240 B). Between the leg's BDP and BDP + its
	// bottleneck queue, it keeps that sender's slow start from
	// overshooting the queue (hundreds of losses per flow on the seed's
	// 200 ms legs, then a collapse of its window under jitter) without
	// costing rate (docs/tts.md, rows 4-5 at 70 MB). Below the BDP it
	// slows every intercepted flow. 0 (default): the kernel's
	// autotuning.
	WindowClamp Size `yaml:"window_clamp"`
	// WindowBDP, when > 0, makes the receive window each leg of an
	// intercepted flow advertises follow WindowBDP x the leg's measured
	// bandwidth-delay product: its peak arrival rate (segments received
	// per interval of half its minimum RTT, 10-200 ms, highest so far) times its minimum RTT (TCP_INFO), at least 256 KiB, raised as
	// the estimate grows and never lowered (TCP_WINDOW_CLAMP, with the
	// receive buffer locked at eight times it so that autotuning cannot
	// raise the clamp). The sender feeding the relay (the server on
	// downloads) then has at most WindowBDP x BDP in flight: its slow
	// start cannot overshoot its path's queue by more than
	// (WindowBDP - 1) x BDP, whatever the path's rate and RTT. A slow-start
	// burst arrives at the path's bottleneck rate, so the estimate reaches
	// that rate several rounds before the sender's window reaches the BDP
	// and the bound does not slow the ramp. 1.25 suits queues of at least
	// a third of the BDP (docs/tts.md, session 14). 0 (default): off.
	// Not with window_clamp.
	WindowBDP float64 `yaml:"window_bdp"`
	// HandshakeHold, when > 0, holds the relay's handshake ACK towards
	// the server (the upstream leg) and the flow's first bytes for this
	// long after the upstream connect (TCP_QUICKACK 0 before the connect:
	// Linux then delays the ACK of a SYN-ACK until the first data or its
	// delayed-ACK bound of 200 ms; the relay writes nothing for the hold).
	// The server's first RTT sample, from its SYN-ACK to that ACK, then
	// includes the hold: on a leg whose one-way jitter is as large as its
	// delay a single handshake sample can be a fifth of the mean RTT, and
	// the RTO computed from it (sample + 200 ms) expires before the first
	// flight's ACKs; with the hold it cannot (docs/tts.md, row 6). It
	// costs the hold once per intercepted flow. At most 200ms (longer
	// would let the kernel's timer send the ACK before the data anyway).
	// 0 (default): off.
	HandshakeHold Duration `yaml:"handshake_hold"`
	// Mark and RouteTable of the policy route; 0: intercept's defaults.
	Mark       uint32 `yaml:"mark"`
	RouteTable int    `yaml:"route_table"`
	Size       Size   `yaml:"size"` // size hint for chain choice
}

// interceptConfig turns the entry's config into intercept's.
func (c *TProxyConfig) interceptConfig(id string) (intercept.Config, error) {
	ic := intercept.Config{Name: c.Name, InIface: c.Iface, FailClosed: c.FailClosed, NoSACK: c.NoSACK, InitCwnd: c.InitCwnd, Mark: c.Mark, RouteTable: c.RouteTable}
	if ic.Name == "" {
		ic.Name = tableName(id)
	}
	_, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return ic, fmt.Errorf("listen: %w", err)
	}
	ports, err := intercept.ParsePorts(port)
	if err != nil || len(ports) != 1 || ports[0].Lo != ports[0].Hi {
		return ic, fmt.Errorf("listen: %q needs a fixed port", c.Listen)
	}
	ic.Port = ports[0].Lo
	if ic.Sources, err = intercept.ParsePrefixes(c.Sources); err != nil {
		return ic, fmt.Errorf("sources: %w", err)
	}
	if ic.Dests, err = intercept.ParsePrefixes(c.Dests); err != nil {
		return ic, fmt.Errorf("dests: %w", err)
	}
	if c.Ports != "" {
		if ic.Ports, err = intercept.ParsePorts(c.Ports); err != nil {
			return ic, fmt.Errorf("ports: %w", err)
		}
	}
	for _, r := range ic.Ports {
		if ic.Port >= r.Lo && ic.Port <= r.Hi {
			return ic, fmt.Errorf("ports: %s includes the listener's own port %d", r, ic.Port)
		}
	}
	return ic, ic.Validate()
}

func tableName(id string) string {
	var b strings.Builder
	for _, r := range id {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
		if b.Len() == 32 {
			break
		}
	}
	if b.Len() == 0 {
		return "proxy"
	}
	return b.String()
}

// socket returns the proxy's socket options with the entry's own.
func (c *TProxyConfig) socket(sc SocketConfig) SocketConfig {
	if c.Congestion != "" {
		sc.Congestion = c.Congestion
	}
	return sc
}

// control is the socket control of the entry's legs (kind: sockListen
// for the transparent listener, sockPoolDial for the upstream dial): the
// socket options, the window clamp, and the legs' mark when InitCwnd is
// set (the accepted connections inherit the listener's).
func (c *TProxyConfig) control(id string, sc SocketConfig, kind int) func(network, address string, rc syscall.RawConn) error {
	ctl := c.socket(sc).control(kind)
	if c.WindowClamp > 0 {
		ctl = windowClampControl(int(c.WindowClamp), ctl)
	}
	if c.HandshakeHold > 0 && kind == sockPoolDial {
		ctl = delayedAckControl(ctl)
	}
	if c.InitCwnd == 0 {
		return ctl
	}
	ic, err := c.interceptConfig(id)
	if err != nil { // Config.Validate checked it
		return func(string, string, syscall.RawConn) error { return err }
	}
	return intercept.MarkControl(ic.LegMark(), ctl)
}

// validate checks the entry (Config.Validate calls it).
func (c *TProxyConfig) validate(cfg *Config) error {
	if c.Listen == "" {
		return errors.New("listen: missing")
	}
	if len(c.Congestion) > 15 {
		return fmt.Errorf("congestion: %q is too long", c.Congestion)
	}
	if c.HandshakeHold < 0 || time.Duration(c.HandshakeHold) > maxHandshakeHold {
		return fmt.Errorf("handshake_hold: %v is not in [0, %v]", time.Duration(c.HandshakeHold), maxHandshakeHold)
	}
	if c.WindowBDP != 0 && !(c.WindowBDP >= 1 && c.WindowBDP <= 16) {
		return fmt.Errorf("window_bdp: %v is not 0 or in [1, 16]", c.WindowBDP)
	}
	if c.WindowBDP > 0 && c.WindowClamp > 0 {
		return errors.New("window_bdp and window_clamp exclude each other")
	}
	if c.WindowClamp < 0 || c.WindowClamp > 1<<30 {
		return fmt.Errorf("window_clamp: %d is not in [0, 1 GiB]", c.WindowClamp)
	}
	if !(c.PacingMbit >= 0 && c.PacingMbit*1e6/8 < unpacedCap) {
		return fmt.Errorf("pacing_mbit: %v is not in [0, 34000)", c.PacingMbit)
	}
	if err := checkHostPort(c.Listen, true); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if cfg.Workers > 1 {
		return errors.New("not supported with workers > 1 (one process owns the rules)")
	}
	_, err := c.interceptConfig(cfg.ID)
	return err
}

// bindTProxy opens the transparent listener.
func (s *Server) bindTProxy() error {
	c := s.cfg.TProxy
	if c == nil {
		return nil
	}
	ln, err := intercept.ListenTransparent(context.Background(), c.Listen, c.control(s.cfg.ID, s.cfg.Socket, sockListen))
	if err != nil {
		return fmt.Errorf("listen tproxy: %w", err)
	}
	s.accept.listeners = append(s.accept.listeners, &listener{ln: ln, kind: kindTProxy})
	return nil
}

// TProxyAddr returns the transparent listener's address, or nil.
func (s *Server) TProxyAddr() net.Addr { return s.addr(kindTProxy, 0) }

// startIntercept installs the interception rules; the returned function
// removes them (after the flows drained: their packets need the rules).
func (s *Server) startIntercept() (func(), error) {
	c := s.cfg.TProxy
	if c == nil {
		return func() {}, nil
	}
	ic, err := c.interceptConfig(s.cfg.ID)
	if err != nil {
		return nil, fmt.Errorf("tproxy: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := intercept.Install(ctx, ic, s.log)
	if err != nil {
		return nil, fmt.Errorf("tproxy: %w", err)
	}
	if err := s.onPathInstalled(in); err != nil {
		in.Remove()
		return nil, fmt.Errorf("tproxy: %w", err)
	}
	return func() {
		if err := in.Remove(); err != nil {
			s.log.Error("remove interception rules", "err", err)
		}
	}, nil
}

// serveTProxy opens the upstream side of an intercepted flow: to its
// original destination, from the client's address and port when this
// proxy is the flow's egress (else through the chain, and the origin sees
// the egress proxy). Both connections reset if the proxy dies mid-flow.
// A flow through a chain learns its size under its original destination
// (sizelearn.go); the returned keys are empty otherwise.
func (s *Server) serveTProxy(l *listener, c *net.TCPConn, in Intent) (*net.TCPConn, sizeKeys) {
	dst := in.Local // the original destination
	if ln := addrPort(l.ln.Addr()); dst.Port() == ln.Port() {
		// A connection to the listener itself, not an intercepted flow.
		s.refuse(refuseEntryProto, c, in.Client, fmt.Errorf("direct connection to the transparent listener %s", dst))
		return nil, sizeKeys{}
	}
	in.Target = Target{Host: dst.Addr().Unmap().String(), Port: dst.Port()}
	in.Size = int64(s.cfg.TProxy.Size)
	var up *net.TCPConn
	var err error
	direct := s.origin.egress.lookup(in.Target) == s.self
	if direct {
		s.m.directFor("self_egress").Inc()
		up, err = s.dialTransparent(in)
	} else {
		s.learnSize(&in, "", nil) // keyed by the original destination
		up, err = s.open(in, nil)
	}
	if err != nil {
		s.entryFailed(c, in, err)
		return nil, sizeKeys{}
	}
	intercept.AbortOnClose(c, true)
	intercept.AbortOnClose(up, true)
	if h := time.Duration(s.cfg.TProxy.HandshakeHold); h > 0 && direct {
		// The handshake ACK waits for the first write (or the kernel's
		// 200 ms bound): hold every write for h.
		t := time.NewTimer(h)
		select {
		case <-t.C:
		case <-s.flows.ctx.Done():
			t.Stop()
		}
	}
	if t := s.cfg.TProxy; t.Pacing || t.PacingMbit > 0 {
		for _, conn := range []*net.TCPConn{c, up} {
			if err := setPacing(conn, t.PacingMbit); err != nil {
				s.log.Debug("tproxy pacing", "err", err)
			}
		}
	}
	return up, in.learn
}

// maxHandshakeHold is Linux's bound on a delayed ACK (TCP_DELACK_MAX):
// the handshake ACK leaves by then whether data came or not.
const maxHandshakeHold = 200 * time.Millisecond

// delayedAckControl turns quick ACKs off (TCP_QUICKACK 0, the socket's
// "pingpong" mode) before the connect, so that the kernel delays the ACK
// of the SYN-ACK until the first write or 200 ms (tcp_rcv_synsent_state_process),
// then runs prev.
func delayedAckControl(prev func(network, address string, c syscall.RawConn) error) func(network, address string, c syscall.RawConn) error {
	return intercept.SockoptControl(syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 0, "tcp_quickack 0", prev)
}

// dialTransparent checks the destination policy and connects to the
// target from the client's address.
func (s *Server) dialTransparent(in Intent) (*net.TCPConn, error) {
	dst, err := s.origin.policy.resolve(context.Background(), s.origin.res, in.Target)
	if err != nil {
		return nil, err
	}
	// No deferred SYN (TCP_FASTOPEN_CONNECT): a server that speaks first
	// must see the connection at once.
	d := s.out.dialer
	d.Control = s.cfg.TProxy.control(s.cfg.ID, s.cfg.Socket, sockPoolDial)
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.flows.ctx, d.Timeout)
	defer cancel()
	up, err := intercept.DialTransparent(ctx, in.Client, netip.AddrPortFrom(dst.Addr(), dst.Port()), d)
	if err != nil {
		return nil, err
	}
	pm := s.m.peer("origin")
	pm.connect.Observe(time.Since(start).Seconds())
	pm.dial.Inc()
	if s.cfg.Socket.NoDelay != nil {
		up.SetNoDelay(*s.cfg.Socket.NoDelay)
	}
	s.track(up)
	return up, nil
}

// relayTransparent is relay for intercepted flows: their connections
// reset when the process dies (SO_LINGER 0, set by serveTProxy) until
// each direction ends normally (the pipe then clears it before the
// half-close, so an orderly end is a FIN with every byte delivered).
func (s *Server) relayTransparent(role role, down, up *net.TCPConn) {
	defer s.untrack(up)
	rm := s.m.roles[role]
	rm.active.Inc()
	defer rm.active.Dec()
	p := s.newPipe(rm, down, up)
	p.abortOnEnd = true
	stop := s.followFlow(down, up)
	defer stop()
	if m := s.onPathFlow(addrPort(down.RemoteAddr()), addrPort(down.LocalAddr())); m != nil {
		p.copied = func() { s.noteLegs(m, down, up) }
	}
	s.endFlow(role, s.runPipe(p))
}
