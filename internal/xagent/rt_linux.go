package xagent

import (
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// realtimeFile turns the calling goroutine's thread into a SCHED_FIFO
// thread of priority prio, locked to it for good (the thread ends with the
// goroutine), and returns a blocking duplicate of c: the control
// connection is then read by a blocking syscall on that thread, which the
// kernel wakes at once when an install arrives, ahead of the surrogate's
// server (the race of docs/router.md) and of CPU hogs. stop unblocks it.
func realtimeFile(c net.Conn, prio int) (f *os.File, stop func(), err error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, nil, fmt.Errorf("xagent: not a TCP connection")
	}
	runtime.LockOSThread() // never unlocked: the thread keeps its priority
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
	if err := unix.SchedSetAttr(0, attr, 0); err != nil {
		return nil, nil, fmt.Errorf("xagent: SCHED_FIFO: %w", err)
	}
	f, err = tc.File()
	if err != nil {
		return nil, nil, err
	}
	fd := int(f.Fd()) // Fd puts it in blocking mode
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, func() { unix.Shutdown(fd, unix.SHUT_RDWR) }, nil
}
