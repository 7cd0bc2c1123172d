//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
	"golang.org/x/sys/unix"
)

// TestJoinTail joins while the relay's socket to peer1 still holds a tail
// it has not sent (peer1's window is closed: it does not read yet): the
// early join of Handover. That socket stays open; the program passes it
// peer1's ACKs (Entry.Tail), so it sends its tail once peer1 reads, and
// peer2's data, translated, follows it in order. Without the ACKs the tail
// is never sent and peer1 never gets past it. With loss, the socket
// retransmits its tail from those ACKs.
func TestJoinTail(t *testing.T) {
	for _, loss := range []bool{false, true} {
		name := "clean"
		if loss {
			name = "loss"
		}
		t.Run(name, func(t *testing.T) {
			testenv.RequirePrivileged(t)
			l := xlatetest.NewLine(t, false)
			s := openIn(t, l.R, Config{})
			defer s.Close()
			r := relayPair(t, l)
			if loss {
				// peer1 drops 3% of what reaches it from the relay's port:
				// tail segments and translated ones alike.
				xlatetest.Sh(t, "ip", "netns", "exec", l.P1, "nft", "add table inet tailloss { chain in { type filter hook input priority 0; tcp sport 8080 numgen random mod 100 < 3 drop; }; }")
			}
			setInt := func(c *net.TCPConn, opt, v int) {
				raw, _ := c.SyscallConn()
				raw.Control(func(fd uintptr) {
					if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, v); err != nil {
						t.Fatal(err)
					}
				})
			}
			// peer1's window closes after a little; the rest of the tail
			// waits in the relay's send queue.
			setInt(r.c1, unix.SO_RCVBUF, 32<<10)
			setInt(r.a, unix.SO_SNDBUF, 4<<20)
			const tailN, n = 1 << 20, 8 << 20
			tail := make([]byte, tailN)
			rand.Read(tail)
			r.a.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if k, err := r.a.Write(tail); err != nil {
				t.Fatalf("relay wrote %d of the tail: %v", k, err)
			}
			outq := func() (n int) {
				raw, _ := r.a.SyscallConn()
				raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
				return n
			}
			if q := outq(); q < tailN/2 {
				t.Fatalf("relay's send queue holds %d bytes: want most of the %d-byte tail", q, tailN)
			}
			// peer2 must be quiet at the join (its data so far acknowledged).
			var sp *Splice
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := xlatetest.In(t, l.R, func() (err error) {
					sp, err = s.lockedJoin(r.a, r.b, 0, 0, [2]bool{true, false})
					return err
				})
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("join: %v", err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !sp.AB.Tail || sp.BA.Tail || len(sp.tails) != 1 {
				t.Fatalf("entries: AB.Tail %v, BA.Tail %v, %d tail sockets: want a tail on leg a only", sp.AB.Tail, sp.BA.Tail, len(sp.tails))
			}
			tailDone := make(chan time.Duration, 1)
			go func() { tailDone <- s.finishTails(sp) }()

			// peer2 streams n bytes and FIN; peer1 reads the tail, then them.
			want := sha256.New()
			want.Write(tail)
			sent := make(chan error, 1)
			go func() {
				_, err := io.Copy(io.MultiWriter(r.c2, want), io.LimitReader(rand.Reader, n))
				if err == nil {
					err = r.c2.CloseWrite()
				}
				sent <- err
			}()
			r.c1.SetReadDeadline(time.Now().Add(60 * time.Second))
			got := sha256.New()
			m, err := io.Copy(got, r.c1)
			if err != nil {
				t.Fatalf("peer1 read %d of %d bytes: %v", m, tailN+n, err)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			if m != tailN+n || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
				t.Fatalf("peer1 read %d bytes (want %d), SHA-256 equal: %v", m, tailN+n, bytes.Equal(got.Sum(nil), want.Sum(nil)))
			}
			select {
			case d := <-tailDone:
				t.Logf("tail acknowledged %v after the join", d)
			case <-time.After(10 * time.Second):
				t.Fatal("the tail socket was not finished")
			}
			if st := s.Stats(); st.Tail == 0 || st.Errors != 0 {
				t.Errorf("splicer stats %+v: want ACKs passed to the tail, no errors", st)
			}
			if _, err := r.a.Write([]byte("x")); err == nil {
				t.Error("relay socket a still writable after its tail")
			}
		})
	}
}
