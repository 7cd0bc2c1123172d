//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
	"golang.org/x/sys/unix"
)

// sendSeq reads the next sequence number c will send (its write_seq,
// through TCP_REPAIR; the socket leaves repair mode without a probe).
func sendSeq(t *testing.T, c *net.TCPConn) uint32 {
	t.Helper()
	var seq uint32
	raw, _ := c.SyscallConn()
	raw.Control(func(fd uintptr) {
		if err := setRepair(int(fd), 1); err != nil {
			t.Fatal(err)
		}
		defer setRepair(int(fd), unix.TCP_REPAIR_OFF_NO_WP)
		var st SockState
		if err := readQueueSeqs(int(fd), &st); err != nil {
			t.Fatal(err)
		}
		seq = st.SndNxt
	})
	return seq
}

// holeAt makes namespace ns drop every segment from src to port that
// starts at sequence number seq (the first one and each retransmission of
// it): the receiver holds what follows out of order behind a hole. The
// rule goes at cleanup or when the returned func is called.
func holeAt(t *testing.T, ns, src string, port int, seq uint32) func() {
	t.Helper()
	fam := "ip"
	if net.ParseIP(src).To4() == nil {
		fam = "ip6"
	}
	table := fmt.Sprintf("hole%d", port)
	xlatetest.Sh(t, "ip", "netns", "exec", ns, "nft", fmt.Sprintf(
		"add table inet %s { chain pre { type filter hook prerouting priority -300; %s saddr %s tcp dport %d tcp sequence %d drop; }; }",
		table, fam, src, port, seq))
	done := false
	del := func() {
		if !done {
			done = true
			xlatetest.Sh(t, "ip", "netns", "exec", ns, "nft", "delete table inet "+table)
		}
	}
	t.Cleanup(del)
	return del
}

// TestJoinOutOfOrder: the relay's socket from peer1 holds data out of
// order behind a hole (the segment at the hole is dropped before it
// reaches the relay, every time it is sent; what follows arrives and is
// SACKed to peer1). Neither its receive queue nor TCP_INFO show that data.
// Join refuses (ooo, counted) while the hole is open, and joins once it
// filled; every byte reaches peer2, and peer1 never detects SACK
// reneging.
//
// "unchecked" joins with the check off, to show what it prevents: no byte
// is lost, but peer1 takes peer2's ACKs below the data it saw SACKed as
// reneging and recovers only when its reneging timer fires (60 ms here on
// a veth with a sub-millisecond RTT, against well under 1 ms when the
// relay relays the same hole; the sender restarts from one segment).
func TestJoinOutOfOrder(t *testing.T) {
	for _, unchecked := range []bool{false, true} {
		name := "refused"
		if unchecked {
			name = "unchecked"
		}
		t.Run(name, func(t *testing.T) {
			testenv.RequirePrivileged(t)
			l := xlatetest.NewLine(t, false)
			s := openIn(t, l.R, Config{noOOOCheck: unchecked})
			defer s.Close()
			r := relayPair(t, l)
			testJoinOutOfOrder(t, l, s, r, unchecked)
		})
	}
}

func testJoinOutOfOrder(t *testing.T, l *xlatetest.Line, s *Splicer, r relayed, unchecked bool) {
	const n = 256 << 10
	data := make([]byte, n)
	rand.Read(data)
	// (Room for the whole write in flight: the send buffer keeps what the
	// relay has not acknowledged.)
	if err := r.c1.SetWriteBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	seq := sendSeq(t, r.c1)
	unhole := holeAt(t, l.R, l.P1Addr, 8080, seq)
	reneging := func() (v int64) {
		xlatetest.MustIn(t, l.P1, func() (err error) {
			v, err = testenv.ProcNetCounter("/proc/thread-self/net/netstat", "TcpExt:", "TCPSACKReneging")
			return
		})
		return v
	}
	reneg0 := reneging()
	// (The write completes once the hole closes.)
	wrote := make(chan error, 1)
	go func() {
		r.c1.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err := r.c1.Write(data)
		wrote <- err
	}()
	// Wait until the relay's socket holds data it cannot read.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var inq, rmem int
		raw, _ := r.a.SyscallConn()
		raw.Control(func(fd uintptr) {
			inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
			rmem, _, _ = meminfo(int(fd))
		})
		if inq != 0 {
			t.Fatalf("relay can read %d bytes: the hole was not kept", inq)
		}
		if rmem > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay's socket never held data out of order")
		}
		time.Sleep(2 * time.Millisecond)
	}
	var sp *Splice
	err := xlatetest.In(t, l.R, func() (err error) { sp, err = s.Join(r.a, r.b); return })
	if !unchecked {
		var re *RefusedError
		if !errors.As(err, &re) || re.Reason != ReasonOOO {
			t.Fatalf("join with data held behind a hole: %v; want refused (ooo)", err)
		}
		if got := s.Stats().Refused[ReasonOOO]; got != 1 {
			t.Errorf("refused (ooo) counted %d times, want 1", got)
		}
	} else if err != nil {
		t.Fatalf("join (unchecked): %v", err)
	}
	unhole()
	start := time.Now()
	got := make([]byte, n)
	type read struct {
		first, all time.Time
		err        error
	}
	readc := make(chan read, 1)
	go func() {
		var rd read
		r.c2.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, rd.err = io.ReadFull(r.c2, got[:1]); rd.err == nil {
			rd.first = time.Now()
			_, rd.err = io.ReadFull(r.c2, got[1:])
			rd.all = time.Now()
		}
		readc <- rd
	}()
	if !unchecked {
		// Still relayed: the hole fills at peer1's next retransmission;
		// the relay forwards what it can read then, and the join goes
		// ahead once that is acknowledged.
		buf := make([]byte, n)
		if _, err := io.ReadFull(r.a, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := r.b.Write(buf); err != nil {
			t.Fatal(err)
		}
		sp = joinWhenQuiet(t, s, l.R, r.a, r.b)
	}
	rd := <-readc
	if rd.err != nil {
		t.Fatalf("peer2: %v", rd.err)
	}
	t.Logf("peer2: first byte %v after the hole closed, all %d bytes %v later", rd.first.Sub(start), n, rd.all.Sub(rd.first))
	if err := <-wrote; err != nil {
		t.Fatalf("peer1: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("peer2 read other bytes")
	}
	// After the join: 1 MB more, end to end.
	if sp == nil {
		t.Fatal("not joined")
	}
	sent, recv, err := stream(r.c1, r.c2, 1<<20)
	if err != nil || sent != recv {
		t.Fatalf("after the join: %v, SHA-256 equal %v", err, sent == recv)
	}
	reneg := reneging() - reneg0
	t.Logf("peer1 detected SACK reneging %d times", reneg)
	if !unchecked && reneg != 0 {
		t.Errorf("peer1 detected SACK reneging %d times after a checked join", reneg)
	}
}
