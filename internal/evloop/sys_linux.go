package evloop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loops make nonblocking socket calls with RawSyscall: none of them can
// block, so telling the scheduler about each one (and having its monitor
// hand the loop's P to another thread when one takes a few tens of
// microseconds on loopback) costs more than the call. Only epoll_wait, which
// does block, goes through the normal path.

func rawRead(fd int, p []byte) (int, unix.Errno) {
	r, _, e := syscall.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, unix.Errno(e)
	}
	return int(r), 0
}

func rawWrite(fd int, p []byte) (int, unix.Errno) {
	r, _, e := syscall.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, unix.Errno(e)
	}
	return int(r), 0
}

// rawSendMore writes p to the socket fd with MSG_MORE: the kernel holds a
// segment it could send now until the next write, shutdown or close pushes
// it, so a last write followed at once by the FIN leaves as one segment
// (data and FIN) instead of two. MSG_NOSIGNAL: a reset peer is an EPIPE
// error, not a signal.
func rawSendMore(fd int, p []byte) (int, unix.Errno) {
	r, _, e := syscall.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), unix.MSG_MORE|unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, unix.Errno(e)
	}
	return int(r), 0
}

// rawEpollWait takes the events ready on epfd without waiting.
func rawEpollWait(epfd int, events []unix.EpollEvent) (int, unix.Errno) {
	r, _, e := syscall.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, unix.Errno(e)
	}
	return int(r), 0
}

func rawClose(fd int) {
	syscall.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

func rawShutdownWrite(fd int) unix.Errno {
	_, _, e := syscall.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), unix.SHUT_WR, 0)
	return unix.Errno(e)
}

func rawSetsockoptInt(fd, level, opt, v int) unix.Errno {
	val := int32(v)
	_, _, e := syscall.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&val)), 4, 0)
	return unix.Errno(e)
}

// ResetClose closes fd so that the peer gets an RST instead of a FIN.
func ResetClose(fd int) {
	setLingerZero(fd)
	rawClose(fd)
}

func setLingerZero(fd int) {
	l := unix.Linger{Onoff: 1, Linger: 0}
	syscall.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_LINGER, uintptr(unsafe.Pointer(&l)), unsafe.Sizeof(l), 0)
}

// SetNoDelay sets TCP_NODELAY on fd.
func SetNoDelay(fd int, on bool) error {
	v := 0
	if on {
		v = 1
	}
	if e := rawSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, v); e != 0 {
		return fmt.Errorf("set TCP_NODELAY: %w", e)
	}
	return nil
}

// rawAccept accepts one connection from the nonblocking listening socket
// lfd as a nonblocking, close-on-exec socket and returns its peer address.
func rawAccept(lfd int, sa *unix.RawSockaddrAny) (int, netip.AddrPort, unix.Errno) {
	n := uint32(unix.SizeofSockaddrAny)
	r, _, e := syscall.RawSyscall6(unix.SYS_ACCEPT4, uintptr(lfd), uintptr(unsafe.Pointer(sa)), uintptr(unsafe.Pointer(&n)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, netip.AddrPort{}, unix.Errno(e)
	}
	return int(r), sockaddrAddrPort(sa), 0
}

// sockaddrAddrPort decodes an IPv4 or IPv6 socket address (zero value for
// anything else).
func sockaddrAddrPort(sa *unix.RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(p.Addr), port)
	case unix.AF_INET6:
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(p.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}

// LocalAddr returns the local address of socket fd.
func LocalAddr(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	_, _, e := syscall.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)))
	if e != 0 {
		return netip.AddrPort{}, fmt.Errorf("getsockname: %w", unix.Errno(e))
	}
	return sockaddrAddrPort(&sa), nil
}

// Dial opens a nonblocking TCP socket, lets control set its options (before
// the handshake, so buffer sizes shape window scaling) and starts
// connecting to addr. The connection completes (or fails) in the loop that
// is given the socket as an Upstream.
func Dial(addr netip.AddrPort, control func(fd int) error) (int, error) {
	family := unix.AF_INET
	if !addr.Addr().Unmap().Is4() {
		family = unix.AF_INET6
	}
	fd, _, e := syscall.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if e != 0 {
		return -1, fmt.Errorf("socket: %w", unix.Errno(e))
	}
	if control != nil {
		if err := control(int(fd)); err != nil {
			rawClose(int(fd))
			return -1, err
		}
	}
	var sa unix.RawSockaddrAny
	var n uintptr
	ip := addr.Addr().Unmap()
	if family == unix.AF_INET {
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sa))
		p.Family = unix.AF_INET
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&p.Port))[:], addr.Port())
		p.Addr = ip.As4()
		n = unix.SizeofSockaddrInet4
	} else {
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(&sa))
		p.Family = unix.AF_INET6
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&p.Port))[:], addr.Port())
		p.Addr = ip.As16()
		n = unix.SizeofSockaddrInet6
	}
	_, _, e = syscall.RawSyscall(unix.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&sa)), n)
	if e != 0 && e != unix.EINPROGRESS {
		rawClose(int(fd))
		return -1, fmt.Errorf("connect %s: %w", addr, unix.Errno(e))
	}
	return int(fd), nil
}

// FileConn turns a socket descriptor the loop handed over (Handover,
// ErrTaken) into a *net.TCPConn, which gets a duplicate of it, and closes
// fd.
func FileConn(fd int) (*net.TCPConn, error) {
	f := os.NewFile(uintptr(fd), "")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, errors.New("not a TCP connection")
	}
	return tc, nil
}

// socketError returns the pending error of fd (SO_ERROR).
func socketError(fd int) error {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if v != 0 {
		return unix.Errno(v)
	}
	return nil
}
