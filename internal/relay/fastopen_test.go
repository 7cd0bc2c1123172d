package relay

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/testenv"
)

// fastOpenChild marks the re-executed test binary running inside a fresh
// network namespace with net.ipv4.tcp_fastopen=3.
const fastOpenChild = "MOSTO_RELAY_FASTOPEN_CHILD"

// TestFastOpen runs a chain with socket.fastopen in a private network
// namespace (the sysctl is per namespace): after the first flow got the
// cookies, the hop headers of later flows ride in the SYN (the kernel's
// TCPFastOpenPassive counter grows) and the bytes still arrive intact.
func TestFastOpen(t *testing.T) {
	if os.Getenv(fastOpenChild) != "1" {
		testenv.RequirePrivileged(t)
		unshare := testenv.RequireCommand(t, "unshare")
		script := `set -e; ip link set lo up; sysctl -q -w net.ipv4.tcp_fastopen=3; exec "$0" -test.run='^TestFastOpen$' -test.v`
		cmd := exec.CommandContext(t.Context(), unshare, "--net", "sh", "-c", script, os.Args[0])
		cmd.Env = append(os.Environ(), fastOpenChild+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("child in a new netns:\n%s", out)
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		return
	}
	o := newOrigin(t, echo)
	w := newWorld(t, o.addr(), func(c *Config) { c.Socket.FastOpen = true })
	hashTrip(t, w.a.ServiceAddr(0).String(), 10000) // gets the cookies
	before := tcpExt(t, "TCPFastOpenPassive")
	for i := range 3 {
		hashTrip(t, w.a.ServiceAddr(0).String(), 20000+i)
	}
	// Each flow has two hop connections (a->b, b->c) that carry data in
	// the SYN.
	if got := tcpExt(t, "TCPFastOpenPassive") - before; got < 6 {
		t.Errorf("TCPFastOpenPassive grew by %d over 3 flows; want >= 6 (hop headers in SYNs)", got)
	}
	// The EgP counts a flow just after the client saw its end.
	waitFor(t, 5*time.Second, "4 ok flows at the EgP", func() bool { return flows(w.c.Server, roleEgP, outcomeOK) == 4 })
}

// tcpExt reads a TcpExt counter of this network namespace.
func tcpExt(t testing.TB, name string) int64 {
	t.Helper()
	f, err := os.Open("/proc/net/netstat")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		keys := strings.Fields(sc.Text())
		if !sc.Scan() {
			break
		}
		vals := strings.Fields(sc.Text())
		if len(keys) == 0 || keys[0] != "TcpExt:" {
			continue
		}
		for i, k := range keys {
			if k == name && i < len(vals) {
				v, err := strconv.ParseInt(vals[i], 10, 64)
				if err != nil {
					t.Fatalf("TcpExt %s: %v", name, err)
				}
				return v
			}
		}
	}
	t.Fatalf("TcpExt %s not found", name)
	return 0
}
