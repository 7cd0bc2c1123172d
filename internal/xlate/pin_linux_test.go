//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
	"golang.org/x/sys/unix"
)

// abandon drops this process's handles as a killed process would (no
// unpinning, held sockets closed by the kernel).
func (s *Splicer) abandon() {
	s.cancel()
	<-s.done
	s.closeObjs()
	s.mu.Lock()
	for t, fd := range s.held {
		unix.Close(fd)
		delete(s.held, t)
	}
	s.mu.Unlock()
}

// dialFrom dials addr from namespace ns (the relay's outgoing connections).
func dialFrom(t *testing.T, ns, addr string) (*net.TCPConn, error) {
	var c *net.TCPConn
	err := xlatetest.In(t, ns, func() error {
		nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err == nil {
			c = nc.(*net.TCPConn)
		}
		return err
	})
	return c, err
}

// onlyPort limits the relay namespace's ephemeral ports to p.
func onlyPort(t *testing.T, ns string, p uint16) {
	t.Helper()
	ps := strconv.Itoa(int(p))
	xlatetest.Sh(t, "ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range="+ps+" "+ps)
}

// endFlow closes a joined flow from peer1 first (peer2, the passive
// closer, keeps no TIME_WAIT socket) and waits for both EOFs.
func endFlow(t *testing.T, r relayed) {
	t.Helper()
	buf := make([]byte, 64)
	r.c1.CloseWrite()
	r.c2.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := r.c2.Read(buf); n != 0 || err == nil {
		t.Fatalf("peer2 read %d, %v: want EOF", n, err)
	}
	r.c2.Close()
	r.c1.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := r.c1.Read(buf); n != 0 || err == nil {
		t.Fatalf("peer1 read %d, %v: want EOF", n, err)
	}
}

// TestJoinReservesPort: while a join lives, the relay's local port of its
// outgoing leg stays taken, so a new connection to the same peer cannot
// reuse it (its packets would be translated into the joined flow); once
// the join is removed the port is free again.
func TestJoinReservesPort(t *testing.T) {
	testenv.CheckLeaks(t)
	testenv.RequirePrivileged(t)
	l := xlatetest.NewLine(t, false)
	s := openIn(t, l.R, Config{})
	defer s.Close()
	r := relayPair(t, l)
	sp := joinWhenQuiet(t, s, l.R, r.a, r.b)
	if st := s.Stats(); st.Held != 2 {
		t.Fatalf("stats %+v: want both joined sockets held", st)
	}
	p := sp.BA.In.Dst.Port() // the relay's port of leg b
	peer2 := net.JoinHostPort(l.P2Addr, "80")
	var ln net.Listener
	xlatetest.MustIn(t, l.P2, func() (err error) { ln, err = net.Listen("tcp", peer2); return })
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	onlyPort(t, l.R, p)
	if c, err := dialFrom(t, l.R, peer2); err == nil {
		c.Close()
		t.Fatalf("a new connection got the joined port %d: %v -> %v", p, c.LocalAddr(), c.RemoteAddr())
	} else if !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Fatalf("dial with only the joined port: %v, want EADDRNOTAVAIL", err)
	}
	// Still taken after the flow ended, while the entries linger.
	endFlow(t, r)
	if _, err := dialFrom(t, l.R, peer2); !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Fatalf("dial after the flow ended, join still installed: %v, want EADDRNOTAVAIL", err)
	}
	if !s.Remove(sp.AB.In) {
		t.Fatal("Remove found no join")
	}
	if st := s.Stats(); st.Held != 0 {
		t.Errorf("stats after Remove %+v: want no held socket", st)
	}
	c, err := dialFrom(t, l.R, peer2)
	if err != nil {
		t.Fatalf("dial after Remove: %v", err)
	}
	defer c.Close()
	if got := c.LocalAddr().(*net.TCPAddr).Port; got != int(p) {
		t.Errorf("dial after Remove used port %d, want %d (the only one)", got, p)
	}
}

// TestPinnedSurvivesProcess: with PinDir, a joined flow keeps flowing
// after the Splicer's process handles are gone (as after SIGKILL: no
// Close); a new Splicer on the same pins adopts the join, takes its tuples
// again, removes it once the flow ended, and its Close leaves no pin and no
// program attached.
func TestPinnedSurvivesProcess(t *testing.T) {
	testenv.RequirePrivileged(t)
	l := xlatetest.NewLine(t, false)
	dir := filepath.Join(xlatetest.BPFFS(t), "mosto", "relay")
	cfg := Config{PinDir: dir, CloseLinger: 300 * time.Millisecond, SweepInterval: 50 * time.Millisecond}
	s1 := openIn(t, l.R, cfg)
	r := relayPair(t, l)
	sp := joinWhenQuiet(t, s1, l.R, r.a, r.b)
	s1.abandon()
	pins, _ := os.ReadDir(dir)
	if len(pins) != 4 { // joins, counters, two links
		t.Fatalf("pins after the process left: %v, want the two maps and two links", pins)
	}
	moveBytes(t, r, 4<<20) // with no process behind the join

	s2 := openIn(t, l.R, cfg)
	defer s2.Close()
	if st := s2.Stats(); st.Adopted != 1 || st.Active != 1 || st.Held != 2 || st.ReserveFailed != 0 {
		t.Fatalf("adopting splicer stats %+v: want 1 adopted join, both tuples held", st)
	}
	if !s2.Joined(sp.AB.In) || !s2.Joined(sp.BA.In) {
		t.Fatal("adopted join not known by its tuples")
	}
	onlyPort(t, l.R, sp.BA.In.Dst.Port())
	if _, err := dialFrom(t, l.R, net.JoinHostPort(l.P2Addr, "80")); !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Errorf("dial from the adopted join's port: %v, want EADDRNOTAVAIL", err)
	}
	streamBoth(t, r, 2<<20) // through the adopted (updated) links, ending with FIN both ways
	deadline := time.Now().Add(20 * time.Second)
	for s2.Stats().Active != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("adopted join not removed after the flow ended: %+v", s2.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := s2.Stats(); st.Held != 0 || st.Removed != 1 {
		t.Errorf("after the flow ended: %+v, want 1 removed, nothing held", st)
	}
	s2.Close()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir after Close: %v, want removed", err)
	}
	xlatetest.CheckNoTCX(t, l.R, "after Close")
}

// moveBytes sends n random bytes each way through r without closing and
// checks them.
func moveBytes(t *testing.T, r relayed, n int) {
	t.Helper()
	type res struct {
		sum [32]byte
		err error
	}
	for _, d := range [][2]*net.TCPConn{{r.c1, r.c2}, {r.c2, r.c1}} {
		got := make(chan res, 1)
		go func() {
			sum, err := readSum(d[1], n)
			got <- res{sum, err}
		}()
		sent, err := writeSum(d[0], n)
		if err != nil {
			t.Fatalf("write %v -> %v: %v", d[0].LocalAddr(), d[0].RemoteAddr(), err)
		}
		g := <-got
		if g.err != nil || g.sum != sent {
			t.Fatalf("%v -> %v: %v, SHA-256 equal %v", d[0].LocalAddr(), d[0].RemoteAddr(), g.err, g.sum == sent)
		}
	}
}

func writeSum(w io.Writer, n int) ([32]byte, error) {
	h := sha256.New()
	_, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(rand.Reader, int64(n)))
	return [32]byte(h.Sum(nil)), err
}

func readSum(r *net.TCPConn, n int) ([32]byte, error) {
	h := sha256.New()
	r.SetReadDeadline(time.Now().Add(60 * time.Second))
	defer r.SetReadDeadline(time.Time{})
	_, err := io.CopyN(h, r, int64(n))
	return [32]byte(h.Sum(nil)), err
}
