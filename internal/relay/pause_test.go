package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
	"github.com/mosto-net/mosto/internal/xlate"
	"golang.org/x/sys/unix"
)

type nopBytes struct{}

func (nopBytes) Add(float64) {}

// TestPauseBeforeFirstRead: the offload watcher may pause a flow before the
// client -> origin direction's first read: a flow that an event loop hands
// to the goroutine path after relaying more than offload.after_bytes is due
// at once, and the watcher starts with the copies. That first read must
// come back paused with nothing consumed, not reset the flow, and the
// resumed flow relays every byte. (It reset the flow: in the emulator's
// Fig. 4 chain with offload about half the runs lost a fetch, the client
// reading a reset or a truncated body, seen in captures as both legs of a
// relay reset 0.1-1 ms after its loop handed the flow over.)
func TestPauseBeforeFirstRead(t *testing.T) {
	client, down := testenv.TCPPair(t)
	up, origin := testenv.TCPPair(t)
	p := &pipe{down: down, up: up, upBytes: nopBytes{}, dnBytes: nopBytes{},
		bufs: &sync.Pool{New: newSmallBuf}, log: t.Logf}

	// The client's first bytes are queued; then the watcher pauses.
	first := []byte("first bytes, queued before the pause")
	if _, err := client.Write(first); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the first bytes queued at the relay", func() bool {
		raw, _ := down.SyscallConn()
		n := 0
		raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return n == len(first)
	})
	p.pausing.Store(true)
	down.SetReadDeadline(time.Now())
	up.SetReadDeadline(time.Now())

	errc := make(chan error, 1)
	p.startUpstream(errc)
	if err := <-errc; !errors.Is(err, errPaused) {
		t.Fatalf("client -> origin before its first read, paused: %v, want errPaused", err)
	}
	if p.aborted.Load() {
		t.Fatal("the pause reset the flow")
	}
	if err := p.copyHalf(p.down, p.up, p.dnBytes); !errors.Is(err, errPaused) {
		t.Fatalf("origin -> client, paused: %v, want errPaused", err)
	}

	// Resumed (a refused handover does this): the flow goes on intact.
	go testenv.Echo(origin)
	body := make([]byte, 1<<20)
	rand.Read(body)
	want := append(append([]byte{}, first...), body...)
	got := make(chan []byte, 1)
	client.SetDeadline(time.Now().Add(60 * time.Second))
	go func() {
		b, _ := io.ReadAll(client)
		got <- b
	}()
	go func() {
		client.Write(body)
		client.CloseWrite()
	}()
	errDown, errUp := (&offloader{}).resume(p, errPaused, errPaused, false, 0)
	if errDown != nil || errUp != nil {
		t.Fatalf("resumed flow: down %v, up %v", errDown, errUp)
	}
	down.Close() // as run does once both directions ended
	up.Close()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("echo through the resumed flow: %d bytes, want %d intact", len(b), len(want))
	}
}

// TestLegFailed: a handover error that is a broken leg (a peek or write
// meeting a reset) ends the flow with a reset; refusals and timeouts
// resume it.
func TestLegFailed(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("xlate: handover peek: %w", unix.ECONNRESET), true},
		{fmt.Errorf("xlate: handover write: %w", unix.EPIPE), true},
		{fmt.Errorf("xlate: handover forward FIN: %w", unix.ENOTCONN), true},
		{&xlate.RefusedError{Reason: xlate.ReasonRaced, Detail: "state moved"}, false},
		{&xlate.RefusedError{Reason: xlate.ReasonState, Detail: fmt.Sprint(unix.ENOTCONN)}, false},
		{context.DeadlineExceeded, false},
		{errors.New("xlate: map update: something else"), false},
	} {
		if got := legFailed(c.err); got != c.want {
			t.Errorf("legFailed(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
