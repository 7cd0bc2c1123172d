//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
	"golang.org/x/sys/unix"
)

// TestJoinLoopback joins two connections on lo (a relay and both peers in
// one namespace, as `mosto bench proxy` runs): lo's send MSS is capped at
// half the peer's largest window (32768 of 65483), which the MSS check
// compared with the other leg's advertised MSS and refused every join on lo
// before session 12. Then 8 MB each way, SHA-256 checked.
func TestJoinLoopback(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			testenv.RequirePrivileged(t)
			l := xlatetest.NewLoopback(t, v6)
			s := openIn(t, l.R, Config{Interfaces: []string{"lo"}})
			defer s.Close()
			r := relayPair(t, l)
			sp := joinWhenQuiet(t, s, l.R, r.a, r.b)
			// Untranslated packets would stall the peers: fail, not hang.
			for _, c := range []*net.TCPConn{r.c1, r.c2} {
				c.SetDeadline(time.Now().Add(30 * time.Second))
			}
			const n = 8 << 20
			streamBoth(t, r, n)
			ab, ba, ok := sp.Stats()
			if !ok {
				t.Fatal("entries gone")
			}
			if ab.Bytes < n || ba.Bytes < n || !ab.FIN || !ba.FIN {
				t.Errorf("entry stats ab %+v ba %+v: want >= %d bytes each way and FIN both ways", ab, ba, n)
			}
			if st := s.Stats(); st.Joined != 1 || st.Errors != 0 {
				t.Errorf("splicer stats %+v", st)
			}
		})
	}
}

// TestJoinLoopbackRefusesMSS: on lo too, a join whose peer1 may send
// segments larger than peer2 accepts (peer2 announced an MSS of 1000,
// peer1 was offered lo's 65483) is refused with ReasonMSS, and the relayed
// connections go on working.
func TestJoinLoopbackRefusesMSS(t *testing.T) {
	testenv.RequirePrivileged(t)
	l := xlatetest.NewLoopback(t, false)
	s := openIn(t, l.R, Config{Interfaces: []string{"lo"}})
	defer s.Close()
	lc := &net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, 1000) }); err != nil {
			return err
		}
		return serr
	}}
	r := relayPairLC(t, l, lc)
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for {
		err = xlatetest.In(t, l.R, func() (err error) { _, err = s.Join(r.a, r.b); return })
		var re *RefusedError
		if errors.As(err, &re) && re.Reason == ReasonBusy && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		break
	}
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != ReasonMSS {
		t.Fatalf("Join = %v; want a refusal (mss)", err)
	}
	if got := s.Stats().Refused[ReasonMSS]; got != 1 {
		t.Errorf("refused (mss) counted %d times; want 1", got)
	}
	// Still relayed: peer1 -> relay -> peer2.
	msg := []byte("after the refusal")
	if _, err := r.c1.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	r.a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.a, buf); err != nil {
		t.Fatalf("relay read after the refusal: %v", err)
	}
	if _, err := r.b.Write(buf); err != nil {
		t.Fatal(err)
	}
	r.c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.c2, buf); err != nil || string(buf) != string(msg) {
		t.Fatalf("peer2 read %q, %v", buf, err)
	}
}
