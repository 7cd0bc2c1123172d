package probe

import (
	"encoding/binary"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// oobSize is room for one SCM_TIMESTAMPNS control message.
var oobSize = unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{})))

// enableRxTimestamps asks the kernel to stamp every datagram c receives
// with its arrival time (SO_TIMESTAMPNS), so that the time a process takes
// to be scheduled and read it is not measured; it reports whether it could.
func enableRxTimestamps(c *net.UDPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return false
	}
	return serr == nil
}

// rxTimestamp returns the kernel's arrival time (ns since the Unix epoch,
// CLOCK_REALTIME) from the control messages of a datagram, or 0.
func rxTimestamp(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_TIMESTAMPNS {
			continue
		}
		switch d := m.Data; {
		case unsafe.Sizeof(unix.Timespec{}) == 16 && len(d) >= 16:
			return int64(binary.NativeEndian.Uint64(d))*1e9 + int64(binary.NativeEndian.Uint64(d[8:]))
		case unsafe.Sizeof(unix.Timespec{}) == 8 && len(d) >= 8:
			return int64(int32(binary.NativeEndian.Uint32(d)))*1e9 + int64(binary.NativeEndian.Uint32(d[4:]))
		}
	}
	return 0
}

// readQueued reads one datagram already queued on c without waiting
// (MSG_DONTWAIT); ok is false when none is.
func readQueued(c *net.UDPConn, buf, oob []byte) (n, oobn int, ok bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_DONTWAIT)
		return true // never wait for readiness
	}); err != nil || rerr != nil {
		return 0, 0, false
	}
	return n, oobn, true
}
