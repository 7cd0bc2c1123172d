package relay

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate"
	"github.com/mosto-net/mosto/internal/xlate/xlatetest"
)

const offloadKillChild = "MOSTO_RELAY_OFFLOAD_KILL_CHILD"

// startRelayChild starts a relay process (this test binary) in namespace
// ns; it prints its lines behind "KILLCHILD".
func startRelayChild(t *testing.T, ns string, args ...string) *testenv.Child {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestOffloadSurvivesKill$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), offloadKillChild+"="+strings.Join(args, ","))
	return testenv.StartChild(t, cmd, "relay child", "KILLCHILD", 30*time.Second)
}

// TestOffloadSurvivesKill: a relay offloads a flow, is killed with
// SIGKILL, and the flow keeps flowing through the pinned program (bytes
// intact, the origin answers every MiB's SHA-256); a restarted relay adopts the join (its
// tuples taken again), removes it once the flow ended, and its clean
// shutdown leaves no pin and no program behind.
func TestOffloadSurvivesKill(t *testing.T) {
	if offloadChildTest(t, offloadKillChild, offloadKillChildBody) {
		return
	}
	l := xlatetest.NewLine(t, false)
	pin := filepath.Join(xlatetest.BPFFS(t), "mosto", "a")
	childArgs := []string{l.RAddr1, l.P2Addr, pin}

	defer offloadOrigin(t, l.P2, l.P2Addr, digestChunks).Close()
	pinned := func() []xlate.PinnedEntry {
		es, err := xlate.ReadPinned(pin)
		if err != nil {
			t.Fatalf("read pins: %v", err)
		}
		return es
	}

	relay1 := startRelayChild(t, l.R, childArgs...)
	relay1.WaitLine(t, "ready adopted=0")
	c := dialService(t, l.P1, l.RAddr1)
	defer c.Close()
	c.SetDeadline(time.Now().Add(120 * time.Second))
	var echoed atomic.Int64
	got := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		io.Copy(io.MultiWriter(h, counter{&echoed}), c)
		got <- [32]byte(h.Sum(nil))
	}()
	// The origin answers the SHA-256 of every MiB it receives (a light
	// return direction: a full-duplex echo that keeps both directions busy
	// may never reach the handover's quiescent point); h hashes the
	// digests we expect back.
	h := sha256.New()
	var sent, digests int64
	killed := false
	chunk := make([]byte, 1<<20)
	send := func(n int64) {
		t.Helper()
		for ; n > 0; n -= int64(len(chunk)) {
			rand.Read(chunk)
			if _, err := c.Write(chunk); err != nil {
				t.Fatalf("send (%d bytes sent before, relay killed: %v): %v", sent, killed, err)
			}
			d := sha256.Sum256(chunk)
			h.Write(d[:])
			sent += int64(len(chunk))
			digests += sha256.Size
		}
	}
	// Entries in the map are not enough: the join is done (sockets
	// silenced) when the relay counts it.
	for joined := false; !joined; {
		if sent > 1<<30 {
			t.Fatalf("no join after %d bytes", sent)
		}
		send(1 << 20)
		select {
		case l := <-relay1.Lines:
			if l != "joined" {
				t.Fatalf("relay child said %q, want joined", l)
			}
			joined = true
		default:
		}
	}
	if n := len(pinned()); n != 2 {
		t.Fatalf("%d pinned entries after the join, want 2", n)
	}

	// SIGKILL: no Close, no unpinning.
	relay1.Kill()
	killed = true
	before := pinned()
	send(8 << 20)
	testenv.WaitFor(t, 60*time.Second, "the bytes sent after the kill answered", func() bool { return echoed.Load() == digests })
	after := pinned()
	if len(after) != 2 {
		t.Fatalf("entries after the kill: %+v", after)
	}
	was := map[xlate.Tuple]uint64{}
	for _, e := range before {
		was[e.In] = e.Stats.Bytes
	}
	for _, e := range after {
		if e.Stats.Bytes <= was[e.In] {
			t.Errorf("entry %v translated no byte after the kill (%d -> %d)", e.In, was[e.In], e.Stats.Bytes)
		}
	}

	relay2 := startRelayChild(t, l.R, childArgs...)
	relay2.WaitLine(t, "ready adopted=1 held=2")
	// The restarted relay holds the outgoing leg's tuple again.
	for _, e := range after {
		if e.In.Src.Addr().String() != l.P2Addr {
			continue
		}
		xlatetest.CheckTaken(t, l.R, e.In.Dst, e.In.Src)
	}
	send(4 << 20)
	c.CloseWrite()
	if <-got != [32]byte(h.Sum(nil)) {
		t.Fatalf("digests differ (%d bytes sent, %d digest bytes back, want %d)", sent, echoed.Load(), digests)
	}
	testenv.WaitFor(t, 30*time.Second, "the restarted relay to remove the ended join", func() bool { return len(pinned()) == 0 })

	// Clean shutdown: no pin, no program left.
	relay2.Stop(t, "TestOffloadSurvivesKill")
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir after a clean shutdown: %v, want removed", err)
	}
	xlatetest.CheckNoTCX(t, l.R, "after a clean shutdown")
	t.Logf("%d bytes echoed; %d of them sent while no relay process ran", sent, 8<<20)
}

// digestChunks answers the SHA-256 of every MiB read from c, then
// half-closes when c ends.
func digestChunks(c *net.TCPConn) {
	defer c.Close()
	b := make([]byte, 1<<20)
	for {
		if _, err := io.ReadFull(c, b); err != nil {
			break
		}
		d := sha256.Sum256(b)
		if _, err := c.Write(d[:]); err != nil {
			return
		}
	}
	c.CloseWrite()
}

type counter struct{ n *atomic.Int64 }

func (c counter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// offloadKillChildBody is the relay process: it serves until its stdin
// closes (then stops cleanly), or until it is killed.
func offloadKillChildBody(t *testing.T, args []string) {
	relayAddr, originAddr, pin := args[0], args[1], args[2]
	cfg := offloadConfig(relayAddr, originAddr, OffloadConfig{Mode: OffloadBytes, AfterBytes: 1 << 20, PinDir: pin, Linger: Duration(300 * time.Millisecond)})
	cfg.Loops = -1
	r := start(t, cfg)
	testenv.WaitFor(t, 10*time.Second, "offload ready", func() bool { return r.offloadReady() })
	st := r.offload.Load().sp.Stats()
	fmt.Printf("KILLCHILD ready adopted=%d held=%d\n", st.Adopted, st.Held)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if r.offload.Load().sp.Stats().Joined > 0 {
				fmt.Println("KILLCHILD joined")
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	io.Copy(io.Discard, os.Stdin)
	close(stop)
	<-watched
	if err := r.stop(t); err != nil {
		t.Errorf("Run: %v", err)
	}
}
