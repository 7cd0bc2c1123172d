package emu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// netnsDir is where named namespaces live, as with `ip netns add`.
const netnsDir = "/run/netns"

// nsPath returns the bind-mount path of a named namespace.
func nsPath(name string) string { return filepath.Join(netnsDir, name) }

// ensureNetnsDir makes /run/netns a shared mount point, as iproute2 does, so
// that namespace bind mounts propagate to other mount namespaces.
func ensureNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", netnsDir, err)
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s shared: %w", netnsDir, err)
	}
	// Not a mount point yet: bind it onto itself first.
	if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", netnsDir, err)
	}
	if err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", netnsDir, err)
	}
	return nil
}

// createNetns creates a named network namespace like `ip netns add` and
// returns after fn ran inside it on a locked OS thread (fn may be nil).
func createNetns(name string, fn func() error) error {
	p := nsPath(name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() { errc <- createNetnsThread(p, fn) }()
	if err := <-errc; err != nil {
		unix.Unmount(p, unix.MNT_DETACH)
		os.Remove(p)
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	return nil
}

// createNetnsThread runs on its own goroutine: it unshares the thread's
// network namespace, bind-mounts it to p and runs fn in it. The thread is
// returned to the scheduler only if it could be switched back.
func createNetnsThread(p string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("unshare: %w", err)
	}
	restore := func() {
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else: the thread stays locked and exits with the goroutine.
	}
	defer restore()
	if err := unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	if fn != nil {
		return fn()
	}
	return nil
}

// deleteNetns removes a named namespace like `ip netns del`. The kernel frees
// it once no process or file descriptor uses it any more.
func deleteNetns(name string) error {
	p := nsPath(name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete netns %s: unmount: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete netns %s: %w", name, err)
	}
	return nil
}

// doInNetns runs fn on a locked OS thread switched into the namespace at
// path p. Sockets created by fn stay in that namespace.
func doInNetns(p string, fn func() error) error {
	ns, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		defer func() {
			if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			}
		}()
		errc <- fn()
	}()
	return <-errc
}

// nsInode returns the inode number identifying the namespace mounted at p.
func nsInode(p string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// killNetnsProcs kills (SIGKILL) every process whose network namespace is
// one of inodes, and returns how many it signalled.
func killNetnsProcs(inodes map[uint64]bool) int {
	if len(inodes) == 0 {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	n := 0
	for _, e := range ents {
		pid := 0
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid <= 0 || pid == self {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue
		}
		if inodes[st.Ino] {
			if unix.Kill(pid, unix.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}
