package testenv

import (
	"os"
	"os/exec"
	"runtime"
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
	if os.Getenv("MOSTO_REQUIRE_PRIV") == "1" {
		t.Fatalf("MOSTO_REQUIRE_PRIV=1 but test cannot run: %s", reason)
	}
	t.Skipf("skipping: %s (set MOSTO_REQUIRE_PRIV=1 to make this a failure)", reason)
}

// RequireCommand skips t (or fails it under MOSTO_REQUIRE_PRIV=1) when an
// external program such as nginx or haproxy is not installed.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("MOSTO_REQUIRE_PRIV") == "1" {
		t.Fatalf("MOSTO_REQUIRE_PRIV=1 but %s is not installed (.ci/run installs it)", name)
	}
	t.Skipf("skipping: %s not installed", name)
	return ""
}
