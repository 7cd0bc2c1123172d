//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	tcpiOptTimestamps = 1
	tcpiOptSACK       = 2
	tcpiOptWScale     = 4
	tcpiOptUSecTS     = 64
	tcpRecvQueue      = 1
	tcpSendQueue      = 2
)

// ReadState reads the state of one TCP socket of this host (no sequence
// numbers: those need TCP_REPAIR, which Join enters).
func ReadState(fd int) (SockState, error) { return readState(fd, false) }

// readState reads a socket's state; with repair (the socket must be in
// TCP_REPAIR mode) also its sequence numbers.
func readState(fd int, repair bool) (SockState, error) {
	var st SockState
	la, err := unix.Getsockname(fd)
	if err != nil {
		return st, refuse(ReasonSocket, "getsockname: %v", err)
	}
	ra, err := unix.Getpeername(fd)
	if err != nil {
		return st, refuse(ReasonState, "getpeername: %v", err)
	}
	st.Local, st.Remote = sockaddrPort(la), sockaddrPort(ra)
	var info [256]byte
	n := uint32(len(info))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0); e != 0 {
		return st, refuse(ReasonSocket, "TCP_INFO: %v", e)
	}
	if n < 104 {
		return st, refuse(ReasonSocket, "TCP_INFO too short (%d bytes)", n)
	}
	st.State = TCPState(info[0])
	switch st.State {
	case StateEstablished, StateCloseWait, StateFinWait2:
	case 4: // fin-wait-1: the forwarded FIN is not acknowledged yet
		return st, refuse(ReasonBusy, "%s: FIN not acknowledged yet", st.Local)
	case 6, 9, 11: // time-wait, last-ack, closing: a FIN arrived while draining
		return st, refuse(ReasonBusy, "%s: closing (state %d)", st.Local, info[0])
	default:
		return st, refuse(ReasonState, "%s: TCP state %d, not established", st.Local, info[0])
	}
	opts := info[5]
	st.Timestamps = opts&tcpiOptTimestamps != 0
	st.SACK = opts&tcpiOptSACK != 0
	st.WScale = opts&tcpiOptWScale != 0
	st.USecTS = opts&tcpiOptUSecTS != 0
	if st.WScale {
		st.SndWScale = info[6] & 0xf
		st.RcvWScale = info[6] >> 4
	}
	ne := binary.NativeEndian
	st.SndMSS = ne.Uint32(info[16:])
	st.Unacked = ne.Uint32(info[24:])
	st.AdvMSS = ne.Uint32(info[84:])
	if pmtu := ne.Uint32(info[60:]); pmtu > 0 {
		hdr := uint32(20 + 20)
		if !st.Local.Addr().Is4() {
			hdr = 40 + 20
		}
		if pmtu > hdr {
			st.PathMSS = pmtu - hdr
		}
	}
	st.LastDataRecv = time.Duration(ne.Uint32(info[52:])) * time.Millisecond
	st.RTT = time.Duration(ne.Uint32(info[68:])) * time.Microsecond
	if n >= 168 { // tcpi_min_rtt, tcpi_delivery_rate
		st.MinRTT = time.Duration(ne.Uint32(info[148:])) * time.Microsecond
		st.DeliveryRate = ne.Uint64(info[160:])
	}
	st.RcvWnd = -1
	if n >= 236 { // tcpi_rcv_wnd, Linux 6.2+
		st.RcvWnd = int64(ne.Uint32(info[232:]))
	}
	if st.InQ, err = unix.IoctlGetInt(fd, unix.SIOCINQ); err != nil {
		return st, refuse(ReasonSocket, "SIOCINQ: %v", err)
	}
	if st.OutQ, err = unix.IoctlGetInt(fd, unix.SIOCOUTQ); err != nil {
		return st, refuse(ReasonSocket, "SIOCOUTQ: %v", err)
	}
	st.RmemAlloc, _, _ = meminfo(fd)
	if st.Unsent, err = unix.IoctlGetInt(fd, unix.SIOCOUTQNSD); err != nil {
		return st, refuse(ReasonSocket, "SIOCOUTQNSD: %v", err)
	}
	if st.Timestamps {
		ts, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_TIMESTAMP)
		if err != nil {
			return st, refuse(ReasonSocket, "TCP_TIMESTAMP: %v", err)
		}
		st.TSOffset = uint32(ts) - uint32(monoNow()/time.Millisecond)
	}
	// In repair mode (TCP_REPAIR_WINDOW is readable only then, whether
	// this call or the caller entered it) TCP_MAXSEG reads mss_clamp: the
	// MSS the peer announced.
	if _, err := getRepairWindow(fd); err == nil {
		if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG); err == nil && v > 0 {
			st.PeerMSS = uint32(v)
		}
	}
	if repair {
		if err := readQueueSeqs(fd, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// readQueueSeqs reads the next sequence numbers of the send and receive
// queues of a socket in repair mode into st.SndNxt and st.RcvNxt.
func readQueueSeqs(fd int, st *SockState) error {
	for _, q := range []struct {
		queue int
		dst   *uint32
	}{{tcpSendQueue, &st.SndNxt}, {tcpRecvQueue, &st.RcvNxt}} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q.queue); err != nil {
			return refuse(ReasonSocket, "TCP_REPAIR_QUEUE: %v", err)
		}
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
		if err != nil {
			return refuse(ReasonSocket, "TCP_QUEUE_SEQ: %v", err)
		}
		*q.dst = uint32(v)
	}
	return nil
}

func setRepair(fd, v int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, v)
}

func sockaddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// monoNow is CLOCK_MONOTONIC, the clock of TCP timestamps and of
// bpf_ktime_get_ns.
func monoNow() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// routeIfindex asks the kernel (rtnetlink, the calling thread's network
// namespace) which device the route to dst leaves from.
func routeIfindex(dst netip.Addr) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("netlink: %w", err)
	}
	defer unix.Close(fd)
	family, addr := unix.AF_INET, dst.AsSlice()
	if dst.Is6() && !dst.Is4In6() {
		family = unix.AF_INET6
	} else {
		a := dst.Unmap().As4()
		addr = a[:]
	}
	ne := binary.NativeEndian
	msg := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofRtMsg+4+len(addr))
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], unix.RTM_GETROUTE)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(msg[8:], 1)
	rt := msg[unix.NLMSG_HDRLEN:]
	rt[0] = byte(family)
	rt[1] = byte(len(addr) * 8)
	at := rt[unix.SizeofRtMsg:]
	ne.PutUint16(at[0:], uint16(4+len(addr)))
	ne.PutUint16(at[2:], unix.RTA_DST)
	copy(at[4:], addr)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("netlink recv: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, fmt.Errorf("netlink parse: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if e := int32(ne.Uint32(m.Data)); e != 0 {
					return 0, fmt.Errorf("route to %s: %w", dst, unix.Errno(-e))
				}
			}
		case unix.RTM_NEWROUTE:
			attrs, err := syscall.ParseNetlinkRouteAttr(&m)
			if err != nil {
				return 0, fmt.Errorf("netlink attrs: %w", err)
			}
			for _, a := range attrs {
				if a.Attr.Type == unix.RTA_OIF && len(a.Value) >= 4 {
					return int(ne.Uint32(a.Value)), nil
				}
			}
		}
	}
	return 0, errors.New("route to " + dst.String() + ": no output device")
}

// repairWindow is struct tcp_repair_window (TCP_REPAIR_WINDOW).
type repairWindow struct {
	SndWl1, SndWnd, MaxWindow, RcvWnd, RcvWup uint32
}

// getRepairWindow reads a socket's windows (it must be in repair mode).
func getRepairWindow(fd int) (repairWindow, error) {
	var w repairWindow
	n := uint32(unsafe.Sizeof(w))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW,
		uintptr(unsafe.Pointer(&w)), uintptr(unsafe.Pointer(&n)), 0); e != 0 {
		return w, e
	}
	return w, nil
}

// setRepairWindow sets a socket's windows (it must be in repair mode).
func setRepairWindow(fd int, w repairWindow) error {
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW,
		uintptr(unsafe.Pointer(&w)), unsafe.Sizeof(w), 0); e != 0 {
		return e
	}
	return nil
}
