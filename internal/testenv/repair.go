package testenv

import (
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// Queues of TCPQueueSeq (TCP_REPAIR_QUEUE values, linux/tcp.h).
const (
	RecvQueue = 1
	SendQueue = 2
)

// TCPQueueSeq reads the next sequence number of c's send or receive queue
// (RecvQueue, SendQueue) through TCP_REPAIR (root); the socket leaves
// repair mode before it returns. Tests compare a client's send sequence
// with the server's receive sequence to tell whether a relay translated it.
func TCPQueueSeq(c *net.TCPConn, queue int) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var seq int
	var serr error
	err = rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_TCP, unix.TCP_REPAIR, 1); serr != nil {
			return
		}
		defer unix.SetsockoptInt(int(fd), unix.SOL_TCP, unix.TCP_REPAIR, 0)
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_TCP, unix.TCP_REPAIR_QUEUE, queue); serr != nil {
			return
		}
		seq, serr = unix.GetsockoptInt(int(fd), unix.SOL_TCP, unix.TCP_QUEUE_SEQ)
	})
	return uint32(seq), errors.Join(err, serr)
}
