//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

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

// line is a three-namespace test topology: p1 -- r -- p2 over two veth
// pairs, r owning both middle ends. The relay's sockets live in r.
type line struct {
	t              *testing.T
	p1, r, p2      string // namespace names
	p1Addr, rAddr1 string
	rAddr2, p2Addr string
}

func sh(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newLine builds the topology (IPv6 when v6) and removes it at cleanup.
func newLine(t *testing.T, v6 bool) *line {
	t.Helper()
	id := fmt.Sprintf("xl%d%04d", os.Getpid()%1000, rand.IntN(10000))
	l := &line{t: t, p1: id + "p1", r: id + "r", p2: id + "p2"}
	for _, ns := range []string{l.p1, l.r, l.p2} {
		sh(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	sh(t, "ip", "link", "add", id+"a", "netns", l.p1, "type", "veth", "peer", "name", id+"b", "netns", l.r)
	sh(t, "ip", "link", "add", id+"c", "netns", l.r, "type", "veth", "peer", "name", id+"d", "netns", l.p2)
	plen, fam := "24", "-4"
	l.p1Addr, l.rAddr1, l.rAddr2, l.p2Addr = "10.71.1.1", "10.71.1.2", "10.71.2.2", "10.71.2.1"
	if v6 {
		plen, fam = "64", "-6"
		l.p1Addr, l.rAddr1, l.rAddr2, l.p2Addr = "fd71:1::1", "fd71:1::2", "fd71:2::2", "fd71:2::1"
	}
	addr := func(ns, dev, a string) {
		if v6 {
			sh(t, "ip", "-n", ns, "addr", "add", a+"/"+plen, "dev", dev, "nodad")
		} else {
			sh(t, "ip", "-n", ns, "addr", "add", a+"/"+plen, "dev", dev)
		}
		sh(t, "ip", "-n", ns, "link", "set", dev, "up")
	}
	addr(l.p1, id+"a", l.p1Addr)
	addr(l.r, id+"b", l.rAddr1)
	addr(l.r, id+"c", l.rAddr2)
	addr(l.p2, id+"d", l.p2Addr)
	sh(t, "ip", "-n", l.p1, fam, "route", "add", "default", "via", l.rAddr1)
	sh(t, "ip", "-n", l.p2, fam, "route", "add", "default", "via", l.rAddr2)
	return l
}

// in runs fn on an OS thread moved into namespace ns; sockets fn creates
// belong to ns and stay usable from any goroutine. The thread is discarded
// afterwards.
func in(t testing.TB, ns string, fn func() error) error {
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

func mustIn(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := in(t, ns, fn); err != nil {
		t.Fatal(err)
	}
}
