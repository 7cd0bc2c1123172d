package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
)

// RequirePrivileged skips t unless the process is root and can create a
// network namespace. When MOSTO_REQUIRE_PRIV=1 (CI sets it) a missing
// privilege fails the test instead, so privileged tests cannot silently vanish.
func RequirePrivileged(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("privileged network test skipped in -short mode")
	}
	reason := ""
	switch {
	case runtime.GOOS != "linux":
		reason = "needs Linux network namespaces"
	case os.Geteuid() != 0:
		reason = "needs root (network namespaces, TUN, nftables)"
	default:
		if _, err := exec.LookPath("ip"); err != nil {
			reason = "needs iproute2's ip command"
		}
	}
	if reason == "" {
		return
	}
	Unmet(t, "%s", reason)
}

// Unmet ends t because the machine cannot run it (too low a limit, a port
// or program missing): a skip, or with MOSTO_REQUIRE_PRIV=1 (CI) a failure,
// so a test cannot silently stop running where it is expected to.
func Unmet(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv("MOSTO_REQUIRE_PRIV") == "1" {
		t.Fatalf("MOSTO_REQUIRE_PRIV=1 but test cannot run: %s", reason)
	}
	t.Skipf("skipping: %s (set MOSTO_REQUIRE_PRIV=1 to make this a failure)", reason)
}

// Partial notes that a part of t cannot run on this machine (a program it
// uses is missing): t goes on without that part, except with
// MOSTO_REQUIRE_PRIV=1 (CI), where t fails, so that the part cannot
// silently stop running where it is expected to.
func Partial(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv("MOSTO_REQUIRE_PRIV") == "1" {
		t.Fatalf("MOSTO_REQUIRE_PRIV=1 but part of the test cannot run: %s", reason)
	}
	t.Logf("not run here: %s (set MOSTO_REQUIRE_PRIV=1 to make this a failure)", reason)
}

// RaiseFDLimit raises this process's RLIMIT_NOFILE towards want (past the
// hard limit where the process may, as root can) until t ends, and returns
// the soft limit in force. Child processes started meanwhile inherit it.
func RaiseFDLimit(t testing.TB, want uint64) uint64 {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	old := lim
	if lim.Cur >= want {
		return lim.Cur
	}
	lim.Cur = want
	if lim.Max < want {
		lim.Max = want
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		lim.Cur, lim.Max = old.Max, old.Max // without privilege: up to the hard limit
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return old.Cur
		}
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	return lim.Cur
}

// RequireCommand skips t (or fails it under MOSTO_REQUIRE_PRIV=1) when an
// external program such as nginx or haproxy is not installed.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	Unmet(t, "%s not installed (.ci/run installs it)", name)
	return ""
}
