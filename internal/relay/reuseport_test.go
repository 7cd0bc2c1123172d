package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/relay"
	"github.com/mosto-net/mosto/internal/relay/relaytest"
	"github.com/mosto-net/mosto/internal/testenv"
)

// handoffChild marks the re-executed test binary running in a fresh network
// namespace; its value is net.ipv4.tcp_migrate_req there.
const handoffChild = "MOSTO_RELAY_HANDOFF_CHILD"

// TestReusePortHandoff is an upgrade without closing the port: an old and
// a new daemon serve one service port with socket.reuseport, the old one is
// stopped (drain) under a steady load of short flows, and the new one takes
// over. With net.ipv4.tcp_migrate_req=1 the kernel moves the connections
// waiting in the old listener's queues to the new one and no flow fails;
// with 0 (the default) those few are reset (counted and logged, never a
// hang). Runs in a private network namespace for the sysctl.
func TestReusePortHandoff(t *testing.T) {
	migrate := os.Getenv(handoffChild)
	if migrate == "" {
		testenv.RequirePrivileged(t)
		unshare := testenv.RequireCommand(t, "unshare")
		for _, m := range []string{"0", "1"} {
			t.Run("tcp_migrate_req="+m, func(t *testing.T) {
				script := `set -e; ip link set lo up; sysctl -q -w net.ipv4.tcp_migrate_req=$2; exec "$0" -test.run="^$1\$" -test.v`
				cmd := exec.CommandContext(t.Context(), unshare, "--net", "sh", "-c", script, os.Args[0], "TestReusePortHandoff", m)
				cmd.Env = append(os.Environ(), handoffChild+"="+m)
				out, err := cmd.CombinedOutput()
				t.Logf("child in a new netns:\n%s", out)
				if err != nil {
					t.Fatalf("child: %v", err)
				}
			})
		}
		return
	}
	testenv.CheckLeaks(t)
	o := testenv.NewServer(t, testenv.Echo)
	svc := fmt.Sprintf("127.0.0.1:%d", relay.FreePorts(t, 1)[0])
	cfg := func() *relay.Config {
		c := relaytest.Config("a")
		c.Hop.Listen = ""
		c.Keys.Current = nil
		c.Socket.ReusePort = true
		c.Timeouts.Drain = relay.Duration(5 * time.Second)
		c.Services = []relay.ServiceConfig{{Name: "svc", Listen: svc, Origin: o.Addr()}}
		return c
	}
	old := relaytest.Run(t, cfg())

	var ok, failed, hung atomic.Int64
	var firstErr atomic.Value
	// Flows dialed once Stop returned must all succeed; one dialed before
	// may still see the reset of the old listener's queue a moment after
	// (the client notices it asynchronously): it counts at the switch.
	var stopped atomic.Bool
	var failedLate atomic.Int64
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go handoffLoad(ctx, &wg, svc, &stopped, &ok, &failed, &failedLate, &hung, &firstErr)
	}
	testenv.WaitFor(t, 10*time.Second, "50 flows through the old daemon", func() bool { return ok.Load() >= 50 })
	newer := relaytest.Run(t, cfg()) // binds the same port beside the old daemon
	// The kernel spreads new connections over both listeners.
	testenv.WaitFor(t, 10*time.Second, "the new daemon serving flows beside the old one", func() bool {
		return relay.Flows(newer.Server, relay.RoleInP, relay.OutcomeOK) >= 10
	})
	beforeStop := ok.Load()
	if err := old.Stop(t); err != nil {
		t.Fatalf("old daemon: %v", err)
	}
	stopped.Store(true)
	failedAtSwitch := failed.Load()
	okAtSwitch := ok.Load()
	testenv.WaitFor(t, 10*time.Second, "50 flows after the old daemon stopped", func() bool { return ok.Load()-okAtSwitch >= 50 })
	stopLoad()
	wg.Wait()
	t.Logf("tcp_migrate_req=%s: %d flows ok (%d before the old daemon stopped), %d failed (%d of them by the time it stopped: %v), %d hung",
		migrate, ok.Load(), beforeStop, failed.Load(), failedAtSwitch, firstErr.Load(), hung.Load())
	if hung.Load() != 0 {
		t.Errorf("%d flows hung past their 5 s deadline", hung.Load())
	}
	if failedLate.Load() != 0 {
		t.Errorf("%d flows dialed after the old daemon had stopped failed; want 0 (the new one serves the port)", failedLate.Load())
	}
	if ok.Load()-okAtSwitch == 0 || relay.Flows(newer.Server, relay.RoleInP, relay.OutcomeOK) == 0 {
		t.Error("the new daemon carried no flow")
	}
	if migrate == "1" && failed.Load() != 0 {
		t.Errorf("with tcp_migrate_req=1, %d flows failed; want 0 (first: %v)", failed.Load(), firstErr.Load())
	}
}

// handoffLoad runs short echo flows against addr back to back until ctx
// ends, counting each outcome.
func handoffLoad(ctx context.Context, wg *sync.WaitGroup, addr string, stopped *atomic.Bool, ok, failed, failedLate, hung *atomic.Int64, firstErr *atomic.Value) {
	defer wg.Done()
	msg := bytes.Repeat([]byte("x"), 64)
	for ctx.Err() == nil {
		late := stopped.Load()
		err := handoffFlow(addr, msg)
		if err != nil && !relay.IsTimeout(err) && late {
			failedLate.Add(1)
		}
		switch {
		case err == nil:
			ok.Add(1)
		case relay.IsTimeout(err):
			hung.Add(1)
		default:
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err)
		}
	}
}

func handoffFlow(addr string, msg []byte) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo of %d bytes, want %d", len(got), len(msg))
	}
	return nil
}
