package offloadbench

import (
	"net"
	"testing"
)

// TestSenderSample reads TCP_INFO of a live loopback connection: the
// fields the Fig. 3 trace prints come from the kernel, and a nil
// connection reads as "unknown".
func TestSenderSample(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if a, ok := <-accepted; ok {
		defer a.Close()
	}
	if _, err := c.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	tc := c.(*net.TCPConn)
	s := senderSample(tc)
	if s.Cwnd == 0 || s.SndWnd == 0 {
		t.Errorf("senderSample = %+v: want a cwnd and a send window from TCP_INFO", s)
	}
	// tcpi_total_rto needs Linux 6.7 (-1 before); retransmissions are
	// always there.
	if rtos, retrans := senderStats(tc); retrans != 0 || rtos > 0 {
		t.Errorf("senderStats = %d RTOs, %d retransmissions: want none on a fresh loopback connection", rtos, retrans)
	}
	if s := senderSample(nil); s != (SenderSample{}) {
		t.Errorf("senderSample(nil) = %+v, want zero", s)
	}
	if rtos, retrans := senderStats(nil); rtos != -1 || retrans != -1 {
		t.Errorf("senderStats(nil) = %d, %d; want -1, -1", rtos, retrans)
	}
}
