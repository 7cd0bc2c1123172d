//go:build linux

package xlatetest

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// BPFFS mounts a bpffs on a fresh directory for the test (pins of a
// translation that outlives its process) and unmounts it at cleanup.
func BPFFS(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// CheckNoTCX fails t when an interface of namespace ns still has a tcx
// ingress program attached (after a clean stop: when says which).
func CheckNoTCX(t testing.TB, ns, when string) {
	t.Helper()
	MustIn(t, ns, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, ifi := range ifs {
			q, err := link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return err
			}
			if len(q.Programs) != 0 {
				t.Errorf("%s: %d tcx programs still attached %s", ifi.Name, len(q.Programs), when)
			}
		}
		return nil
	})
}

// CheckTaken fails t unless a connection from local to remote, dialed in
// namespace ns, is refused because local is taken (a joined tuple a
// process holds).
func CheckTaken(t testing.TB, ns string, local, remote netip.AddrPort) {
	t.Helper()
	err := In(t, ns, func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local), Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", remote.String())
		if err == nil {
			c.Close()
		}
		return err
	})
	if !errors.Is(err, unix.EADDRINUSE) && !errors.Is(err, unix.EADDRNOTAVAIL) {
		t.Errorf("dial from the joined tuple %v -> %v: %v, want it taken", local, remote, err)
	}
}
