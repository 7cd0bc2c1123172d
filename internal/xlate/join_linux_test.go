//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
	"golang.org/x/sys/unix"
)

// tcpSNMP reads a Tcp counter (/proc/net/snmp) of the calling thread's
// network namespace.
func tcpSNMP(name string) (int64, error) {
	return testenv.ProcNetCounter("/proc/thread-self/net/snmp", "Tcp:", name)
}

// relayed is one connection relayed by hand: c1 (peer1) <-> a (relay) and
// b (relay) <-> c2 (peer2).
type relayed struct {
	c1, c2, a, b *net.TCPConn
}

// openIn opens a Splicer in namespace ns (the caller closes it).
func openIn(t *testing.T, ns string, cfg Config) *Splicer {
	t.Helper()
	var s *Splicer
	xlatetest.MustIn(t, ns, func() (err error) { s, err = Open(t.Context(), cfg); return })
	return s
}

// relayPair opens the two legs and moves a few bytes each way through the
// relay, as a relay would before offloading.
func relayPair(t *testing.T, l *xlatetest.Line) relayed {
	t.Helper()
	return relayPairLC(t, l, &net.ListenConfig{})
}

// relayPairLC is relayPair with peer2 listening through lc.
func relayPairLC(t *testing.T, l *xlatetest.Line, lc *net.ListenConfig) relayed {
	t.Helper()
	var ln2, lnr net.Listener
	xlatetest.MustIn(t, l.P2, func() (err error) {
		ln2, err = lc.Listen(context.Background(), "tcp", net.JoinHostPort(l.P2Addr, "80"))
		return
	})
	defer ln2.Close()
	xlatetest.MustIn(t, l.R, func() (err error) { lnr, err = net.Listen("tcp", net.JoinHostPort(l.RAddr1, "8080")); return })
	defer lnr.Close()
	// connect dials addr from namespace ns and accepts the connection on ln.
	connect := func(ns string, ln net.Listener, addr string) (dialed, accepted *net.TCPConn) {
		t.Helper()
		xlatetest.MustIn(t, ns, func() error {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err == nil {
				dialed = c.(*net.TCPConn)
			}
			return err
		})
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return dialed, c.(*net.TCPConn)
	}
	var r relayed
	r.c1, r.a = connect(l.P1, lnr, net.JoinHostPort(l.RAddr1, "8080"))
	r.b, r.c2 = connect(l.R, ln2, net.JoinHostPort(l.P2Addr, "80"))
	for _, c := range []*net.TCPConn{r.c1, r.c2, r.a, r.b} {
		t.Cleanup(func() { c.Close() })
	}
	pass := func(from, to, dst *net.TCPConn, msg string) {
		t.Helper()
		buf := make([]byte, len(msg))
		if _, err := from.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(to, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := dst.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	pass(r.c1, r.a, r.b, "hello")
	got := make([]byte, 5)
	if _, err := io.ReadFull(r.c2, got); err != nil || string(got) != "hello" {
		t.Fatalf("peer2 read %q, %v", got, err)
	}
	pass(r.c2, r.b, r.a, "world")
	if _, err := io.ReadFull(r.c1, got); err != nil || string(got) != "world" {
		t.Fatalf("peer1 read %q, %v", got, err)
	}
	return r
}

// joinWhenQuiet retries Join while the legs are busy (the peers' delayed
// ACKs are still due), as the relay does at its quiescent point.
func joinWhenQuiet(t *testing.T, s *Splicer, ns string, a, b *net.TCPConn) *Splice {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var sp *Splice
		err := xlatetest.In(t, ns, func() (err error) { sp, err = s.Join(a, b); return })
		var re *RefusedError
		switch {
		case err == nil:
			return sp
		case errors.As(err, &re) && re.Reason == ReasonBusy && time.Now().Before(deadline):
			<-tick.C
		default:
			t.Fatalf("Join: %v", err)
		}
	}
}

// stream sends n random bytes from w to r and returns both hashes.
func stream(w *net.TCPConn, r io.Reader, n int) (sent, got [32]byte, err error) {
	errc := make(chan error, 1)
	go func() {
		h := sha256.New()
		_, err := io.Copy(h, r)
		copy(got[:], h.Sum(nil))
		errc <- err
	}()
	h := sha256.New()
	_, werr := io.Copy(io.MultiWriter(w, h), io.LimitReader(rand.Reader, int64(n)))
	copy(sent[:], h.Sum(nil))
	if werr == nil {
		werr = w.CloseWrite()
	}
	rerr := <-errc
	return sent, got, errors.Join(werr, rerr)
}

// streamBoth streams n random bytes each way through r at once, each
// direction ending with FIN, and fails t on an error or a differing
// SHA-256.
func streamBoth(t *testing.T, r relayed, n int) {
	t.Helper()
	type res struct {
		sent, got [32]byte
		err       error
	}
	down := make(chan res, 1)
	go func() {
		s, g, err := stream(r.c2, r.c1, n)
		down <- res{s, g, err}
	}()
	s, g, err := stream(r.c1, r.c2, n)
	if err != nil {
		t.Fatalf("peer1 -> peer2: %v", err)
	}
	if s != g {
		t.Error("peer1 -> peer2: SHA-256 differs")
	}
	d := <-down
	if d.err != nil {
		t.Fatalf("peer2 -> peer1: %v", d.err)
	}
	if d.sent != d.got {
		t.Error("peer2 -> peer1: SHA-256 differs")
	}
}

func TestJoinLive(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			testenv.RequirePrivileged(t)
			l := xlatetest.NewLine(t, v6)
			s := openIn(t, l.R, Config{})
			defer s.Close()
			r := relayPair(t, l)
			var rsts0 int64
			xlatetest.MustIn(t, l.R, func() (err error) { rsts0, err = tcpSNMP("OutRsts"); return })

			sp := joinWhenQuiet(t, s, l.R, r.a, r.b)

			// The relay's sockets are gone without a trace.
			if _, err := r.a.Write([]byte("x")); err == nil {
				t.Error("relay socket a still writable after Join")
			}
			const n = 8 << 20
			streamBoth(t, r, n)
			ab, ba, ok := sp.Stats()
			if !ok {
				t.Fatal("entries gone")
			}
			if ab.Bytes < n || ba.Bytes < n || !ab.FIN || !ba.FIN || !ab.TSLatched || !ba.TSLatched {
				t.Errorf("entry stats ab %+v ba %+v: want >= %d bytes each way, FIN both ways, timestamps latched", ab, ba, n)
			}
			// Timestamps and SACK stay negotiated end to end.
			for _, c := range []*net.TCPConn{r.c1, r.c2} {
				raw, _ := c.SyscallConn()
				raw.Control(func(fd uintptr) {
					info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
					if err != nil {
						t.Error(err)
						return
					}
					if info.Options&(tcpiOptTimestamps|tcpiOptSACK) != tcpiOptTimestamps|tcpiOptSACK {
						t.Errorf("peer options %#x lost timestamps or SACK", info.Options)
					}
				})
			}
			var rsts1 int64
			xlatetest.MustIn(t, l.R, func() (err error) { rsts1, err = tcpSNMP("OutRsts"); return })
			if rsts1 != rsts0 {
				t.Errorf("relay sent %d RSTs after the join", rsts1-rsts0)
			}
			st := s.Stats()
			if st.Joined != 1 || st.Active != 1 || st.Errors != 0 {
				t.Errorf("splicer stats %+v", st)
			}
		})
	}
}

// copyHalf copies src to dst until src fails (the read deadline that stops
// it, or EOF).
func copyHalf(dst, src *net.TCPConn, done chan<- error) {
	_, err := io.Copy(dst, src)
	done <- err
}

// copyClose copies src to dst, then passes the EOF on.
func copyClose(dst, src *net.TCPConn, done chan<- error) {
	_, err := io.Copy(dst, src)
	if err == nil {
		err = dst.CloseWrite()
	}
	done <- err
}

// TestHandoverBulk offloads a relay in the middle of bulk transfers both
// ways: the copies stop, Handover drains to the quiescent point and joins,
// and every byte arrives once, in order. Freeze: the same with the
// senders stopped at the window edge of the handover's start (the program
// lowering the relay's offered windows at egress).
func TestHandoverBulk(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
	}{{"drain", Config{}}, {"freeze", Config{Freeze: true}}} {
		t.Run(c.name, func(t *testing.T) { testHandoverBulk(t, c.cfg) })
	}
}

func testHandoverBulk(t *testing.T, cfg Config) {
	testenv.RequirePrivileged(t)
	l := xlatetest.NewLine(t, false)
	s := openIn(t, l.R, cfg)
	defer s.Close()
	r := relayPair(t, l)

	copies := make(chan error, 2)
	go copyHalf(r.b, r.a, copies)
	go copyHalf(r.a, r.b, copies)

	const n = 48 << 20
	type res struct {
		sent, got [32]byte
		err       error
	}
	down := make(chan res, 1)
	// peer1 reads through a counter that signals after 4 MB.
	half := make(chan struct{})
	go func() {
		s, g, err := stream(r.c2, &notifyConn{c: r.c1, after: 4 << 20, ch: half}, n)
		down <- res{s, g, err}
	}()
	up := make(chan res, 1)
	go func() {
		s, g, err := stream(r.c1, r.c2, n/4)
		up <- res{s, g, err}
	}()
	select {
	case <-half:
	case <-time.After(30 * time.Second):
		t.Fatal("no data through the relay")
	}
	// Stop the copies: every byte they read has been written. (The
	// upload may have ended already: its copy then returned at EOF, and
	// the handover forwards the FIN.)
	r.a.SetReadDeadline(time.Now())
	r.b.SetReadDeadline(time.Now())
	for range 2 {
		if err := <-copies; err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("copy stopped with %v", err)
		}
	}
	var sp *Splice
	xlatetest.MustIn(t, l.R, func() (err error) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		sp, err = s.Handover(ctx, r.a, r.b)
		return err
	})
	for name, ch := range map[string]chan res{"peer2 -> peer1": down, "peer1 -> peer2": up} {
		res := <-ch
		if res.err != nil {
			t.Fatalf("%s: %v", name, res.err)
		}
		if res.sent != res.got {
			t.Errorf("%s: SHA-256 differs", name)
		}
	}
	ab, ba, ok := sp.Stats()
	// peer1's upload may have ended before the handover (the relay then
	// forwarded its FIN); peer2's download is still running.
	if !ok || ba.Bytes == 0 || !ba.FIN {
		t.Errorf("entry stats %+v %+v %v: want peer2's bytes and FIN translated", ab, ba, ok)
	}
	t.Logf("after the handover (%+v): %d bytes peer2->peer1, %d bytes peer1->peer2 translated", sp.Phases, ba.Bytes, ab.Bytes)
	if cfg.Freeze {
		var n int
		xlatetest.MustIn(t, l.R, func() error {
			it := s.objs.Freezes.Iterate()
			var k xlateTuple
			var v xlateFreeze
			for it.Next(&k, &v) {
				n++
			}
			return it.Err()
		})
		if n != 0 {
			t.Errorf("%d freezes left after the handover", n)
		}
	}
}

// notifyConn closes ch once more than after bytes were read.
type notifyConn struct {
	c        *net.TCPConn
	after, n int
	ch       chan struct{}
}

func (c *notifyConn) Read(p []byte) (int, error) {
	n, err := c.c.Read(p)
	if c.n <= c.after && c.n+n > c.after {
		close(c.ch)
	}
	c.n += n
	return n, err
}

// TestHandoverRefusedResumes: legs whose options cannot be joined (peer2
// without SACK, or without timestamps) are refused with the reason counted,
// and the relay resumes copying with no byte lost or duplicated.
func TestHandoverRefusedResumes(t *testing.T) {
	for _, c := range []struct {
		sysctl string
		want   Reason
	}{{"net.ipv4.tcp_sack=0", ReasonSACK}, {"net.ipv4.tcp_timestamps=0", ReasonTimestamps}} {
		t.Run(string(c.want), func(t *testing.T) {
			testenv.RequirePrivileged(t)
			l := xlatetest.NewLine(t, false)
			xlatetest.Sh(t, "ip", "netns", "exec", l.P2, "sysctl", "-q", "-w", c.sysctl)
			s := openIn(t, l.R, Config{})
			defer s.Close()
			r := relayPair(t, l)
			copies := make(chan error, 2)
			go copyHalf(r.b, r.a, copies)
			go copyHalf(r.a, r.b, copies)
			const n = 16 << 20
			half := make(chan struct{})
			type res struct {
				sent, got [32]byte
				err       error
			}
			down := make(chan res, 1)
			go func() {
				s, g, err := stream(r.c2, &notifyConn{c: r.c1, after: 2 << 20, ch: half}, n)
				down <- res{s, g, err}
			}()
			<-half
			r.a.SetReadDeadline(time.Now())
			r.b.SetReadDeadline(time.Now())
			for range 2 {
				<-copies
			}
			err := xlatetest.In(t, l.R, func() error {
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				defer cancel()
				_, err := s.Handover(ctx, r.a, r.b)
				return err
			})
			var re *RefusedError
			if !errors.As(err, &re) || re.Reason != c.want {
				t.Fatalf("Handover = %v, want refusal %s", err, c.want)
			}
			// Resume relaying.
			r.a.SetReadDeadline(time.Time{})
			r.b.SetReadDeadline(time.Time{})
			go copyClose(r.b, r.a, copies)
			go copyClose(r.a, r.b, copies)
			// peer1 ends its (empty) upload so the relay can finish.
			r.c1.CloseWrite()
			d := <-down
			if d.err != nil || d.sent != d.got {
				t.Fatalf("after the refusal: err %v, SHA-256 equal %v", d.err, d.sent == d.got)
			}
			if st := s.Stats(); st.Refused[c.want] != 1 || st.Joined != 0 || st.Active != 0 {
				t.Errorf("stats %+v: want 1 refusal (%s), nothing joined", st, c.want)
			}
		})
	}
}

// TestRemoveUnderLiveFlow: removing the entries of a live join hands its
// packets back to the relay's stack, which has no socket for them and
// answers with a RST; the peers see a reset, never a hang.
func TestRemoveUnderLiveFlow(t *testing.T) {
	testenv.RequirePrivileged(t)
	kernelWarnings := kmsgFrom(t)
	defer func() {
		for _, w := range kernelWarnings() {
			t.Errorf("kernel log: %s", w)
		}
	}()
	l := xlatetest.NewLine(t, false)
	s := openIn(t, l.R, Config{})
	defer s.Close()
	r := relayPair(t, l)
	sp := joinWhenQuiet(t, s, l.R, r.a, r.b)
	// The join works...
	if _, err := r.c1.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(r.c2, got); err != nil || string(got) != "ping" {
		t.Fatalf("through the join: %q, %v", got, err)
	}
	// ...until its entries go.
	if !s.Remove(sp.AB.In) {
		t.Fatal("Remove found no join")
	}
	if st := s.Stats(); st.Active != 0 || st.Removed != 1 {
		t.Errorf("stats after Remove: %+v", st)
	}
	r.c1.Write([]byte("lost"))
	r.c1.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := r.c1.Read(got)
	if !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("peer1 read after Remove: %v, want a reset", err)
	}
}

// kmsgFrom starts reading the kernel log (/dev/kmsg) at its end; the
// returned function gives the warnings logged since by networking or BPF
// code ("WARNING: ... at net/...", "BUG:" lines naming tcp, skb or bpf).
// Without /dev/kmsg it returns none (logged).
func kmsgFrom(t *testing.T) func() []string {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Logf("kernel log not checked: %v", err)
		return func() []string { return nil }
	}
	if _, err := unix.Seek(fd, 0, unix.SEEK_END); err != nil {
		unix.Close(fd)
		t.Logf("kernel log not checked: %v", err)
		return func() []string { return nil }
	}
	return func() []string {
		defer unix.Close(fd)
		var warn []string
		buf := make([]byte, 8192)
		for {
			n, err := unix.Read(fd, buf)
			if err == unix.EPIPE || err == unix.EINTR { // overwritten records, a signal
				continue
			}
			if err != nil || n <= 0 {
				return warn
			}
			rec := string(buf[:n])
			if i := strings.IndexByte(rec, ';'); i >= 0 {
				rec = strings.TrimSpace(rec[i+1:])
			}
			ours := strings.Contains(rec, " net/") || strings.Contains(rec, "kernel/bpf") ||
				strings.Contains(rec, "tcp") || strings.Contains(rec, "skb") || strings.Contains(rec, "bpf")
			if (strings.HasPrefix(rec, "WARNING:") || strings.HasPrefix(rec, "BUG:")) && ours {
				warn = append(warn, rec)
			}
		}
	}
}

// TestJoinTupleReused: after a joined flow ended (FIN both ways; its
// entries linger), peer1 opens a new connection to the relay from the same
// address and port (a passive closer may reuse its port at once). It must
// reach the relay's listener, not peer2: translated, the SYN and the
// request after it went to peer2 as a new connection from the old tuple
// (TestProgramSYNRetires).
func TestJoinTupleReused(t *testing.T) {
	testenv.RequirePrivileged(t)
	l := xlatetest.NewLine(t, false)
	s := openIn(t, l.R, Config{})
	defer s.Close()
	r := relayPair(t, l)
	joinWhenQuiet(t, s, l.R, r.a, r.b)
	port := r.c1.LocalAddr().(*net.TCPAddr).Port
	// peer2 closes first, peer1 answers: peer1 closes passively (no
	// TIME_WAIT on its side).
	if err := r.c2.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	r.c1.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(r.c1); err != nil {
		t.Fatalf("peer1 reading to the FIN: %v", err)
	}
	r.c1.Close()
	r.c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(r.c2); err != nil {
		t.Fatalf("peer2 reading to the FIN: %v", err)
	}
	var ln2 net.Listener
	xlatetest.MustIn(t, l.P2, func() (err error) {
		ln2, err = net.Listen("tcp", net.JoinHostPort(l.P2Addr, "80"))
		return
	})
	defer ln2.Close()
	var lnr net.Listener
	xlatetest.MustIn(t, l.R, func() (err error) {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
			return serr
		}}
		lnr, err = lc.Listen(context.Background(), "tcp", net.JoinHostPort(l.RAddr1, "8080"))
		return
	})
	defer lnr.Close()
	// peer2 must not see a connection.
	stray := make(chan net.Conn, 1)
	go func() {
		if c, err := ln2.Accept(); err == nil {
			stray <- c
		}
	}()
	var c *net.TCPConn
	xlatetest.MustIn(t, l.P1, func() error {
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(l.P1Addr), Port: port}}
		// (peer1's socket may still wait for peer2's ACK of its FIN.)
		deadline := time.Now().Add(5 * time.Second)
		for {
			cc, err := d.Dial("tcp", net.JoinHostPort(l.RAddr1, "8080"))
			if err == nil {
				c = cc.(*net.TCPConn)
				return nil
			}
			if !errors.Is(err, unix.EADDRINUSE) || time.Now().After(deadline) {
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	defer c.Close()
	if _, err := c.Write([]byte("GET")); err != nil {
		t.Fatal(err)
	}
	lnr.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	a, err := lnr.Accept()
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	defer a.Close()
	got := make([]byte, 3)
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(a, got); err != nil || string(got) != "GET" {
		t.Fatalf("relay read %q, %v", got, err)
	}
	select {
	case sc := <-stray:
		sc.Close()
		t.Error("peer2 accepted a connection from the reused tuple")
	default:
	}
}
