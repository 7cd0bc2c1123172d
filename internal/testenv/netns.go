package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// InFastOpenNetns re-runs the calling test in a new network namespace with
// loopback up and net.ipv4.tcp_fastopen=3 (the sysctl is per namespace, so
// the host's stays as it is), and reports whether this process is that
// child. The parent returns false after checking the child passed; the
// child (marked by the environment variable childEnv) returns true and
// runs the test body.
func InFastOpenNetns(t *testing.T, childEnv string) bool {
	t.Helper()
	if os.Getenv(childEnv) == "1" {
		return true
	}
	RequirePrivileged(t)
	unshare := RequireCommand(t, "unshare")
	script := `set -e; ip link set lo up; sysctl -q -w net.ipv4.tcp_fastopen=3; exec "$0" -test.run="^$1\$" -test.v`
	cmd := exec.CommandContext(t.Context(), unshare, "--net", "sh", "-c", script, os.Args[0], t.Name())
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("child in a new netns:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	return false
}

// TCPExt reads a TcpExt counter (/proc/net/netstat) of the calling
// process's network namespace.
func TCPExt(t testing.TB, name string) int64 {
	t.Helper()
	v, err := ProcNetCounter("/proc/net/netstat", "TcpExt:", name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ProcNetCounter reads counter name of section ("Tcp:", "TcpExt:"...) from
// a /proc/net/snmp-style file: pairs of lines, keys then values. Read
// /proc/thread-self/net/... for the calling thread's network namespace.
func ProcNetCounter(path, section, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		keys := strings.Fields(sc.Text())
		if !sc.Scan() {
			break
		}
		vals := strings.Fields(sc.Text())
		if len(keys) == 0 || keys[0] != section {
			continue
		}
		for i, k := range keys {
			if k == name && i < len(vals) {
				v, err := strconv.ParseInt(vals[i], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s %s %s: %w", path, section, name, err)
				}
				return v, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: %s %s not found", path, section, name)
}
