//go:build linux

// Package xlatetest builds namespace topologies for tests of joined
// connections (internal/xlate, the relay's offload, the router's handoff)
// and checks what pinned translations leave behind (BPFFS, CheckNoTCX,
// CheckTaken).
package xlatetest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Line is a three-namespace test topology: P1 -- R -- P2 over two veth
// pairs, R owning both middle ends (addresses RAddr1 towards P1, RAddr2
// towards P2). A relay's sockets live in R.
type Line struct {
	P1, R, P2      string // namespace names
	P1Addr, RAddr1 string
	RAddr2, P2Addr string
}

// Sh runs a command and fails t if it fails.
func Sh(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// NewLine builds the topology (IPv6 when v6) and removes it at cleanup.
// The caller checked privileges (testenv.RequirePrivileged).
func NewLine(t testing.TB, v6 bool) *Line {
	t.Helper()
	id := fmt.Sprintf("xl%d%04d", os.Getpid()%1000, rand.IntN(10000))
	l := &Line{P1: id + "p1", R: id + "r", P2: id + "p2"}
	for _, ns := range []string{l.P1, l.R, l.P2} {
		Sh(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		Sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	Sh(t, "ip", "link", "add", id+"a", "netns", l.P1, "type", "veth", "peer", "name", id+"b", "netns", l.R)
	Sh(t, "ip", "link", "add", id+"c", "netns", l.R, "type", "veth", "peer", "name", id+"d", "netns", l.P2)
	plen, fam := "24", "-4"
	l.P1Addr, l.RAddr1, l.RAddr2, l.P2Addr = "10.71.1.1", "10.71.1.2", "10.71.2.2", "10.71.2.1"
	if v6 {
		plen, fam = "64", "-6"
		l.P1Addr, l.RAddr1, l.RAddr2, l.P2Addr = "fd71:1::1", "fd71:1::2", "fd71:2::2", "fd71:2::1"
	}
	addr := func(ns, dev, a string) {
		if v6 {
			Sh(t, "ip", "-n", ns, "addr", "add", a+"/"+plen, "dev", dev, "nodad")
		} else {
			Sh(t, "ip", "-n", ns, "addr", "add", a+"/"+plen, "dev", dev)
		}
		Sh(t, "ip", "-n", ns, "link", "set", dev, "up")
	}
	addr(l.P1, id+"a", l.P1Addr)
	addr(l.R, id+"b", l.RAddr1)
	addr(l.R, id+"c", l.RAddr2)
	addr(l.P2, id+"d", l.P2Addr)
	Sh(t, "ip", "-n", l.P1, fam, "route", "add", "default", "via", l.RAddr1)
	Sh(t, "ip", "-n", l.P2, fam, "route", "add", "default", "via", l.RAddr2)
	return l
}

// In runs fn on an OS thread moved into namespace ns; sockets fn creates
// belong to ns and stay usable from any goroutine. The thread is discarded
// afterwards.
func In(t testing.TB, ns string, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
		f, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// MustIn is In, failing t on error.
func MustIn(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := In(t, ns, fn); err != nil {
		t.Fatal(err)
	}
}

// NewLoopback builds a Line whose three parties share one new namespace
// and talk over its lo only (127.0.0.1 or ::1; they differ by port), and
// removes it at cleanup. The caller checked privileges.
func NewLoopback(t testing.TB, v6 bool) *Line {
	t.Helper()
	ns := fmt.Sprintf("xo%d%04d", os.Getpid()%1000, rand.IntN(10000))
	Sh(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	Sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	a := "127.0.0.1"
	if v6 {
		a = "::1"
	}
	return &Line{P1: ns, R: ns, P2: ns, P1Addr: a, RAddr1: a, RAddr2: a, P2Addr: a}
}
