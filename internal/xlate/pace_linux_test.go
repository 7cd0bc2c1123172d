//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

import (
	"testing"

	"github.com/mosto-net/mosto/internal/testenv"

	"golang.org/x/sys/unix"
)

// TestDrainPaceCap: the drain pace caps the socket's SO_MAX_PACING_RATE at
// the fraction of the rate, leaves a socket already paced lower alone, and
// stop gives the old cap back (the mechanism TestHandoverDrainPace measures
// on the wire).
func TestDrainPaceCap(t *testing.T) {
	c, _ := testenv.TCPPair(t)
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	capOf := func(fd int) uint64 {
		t.Helper()
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE)
		if err != nil {
			t.Fatalf("SO_MAX_PACING_RATE: %v", err)
		}
		return v
	}
	if err := raw.Control(func(fd uintptr) {
		f := int(fd)
		old := capOf(f)
		p, ok := startDrainPace(f, 10_000_000, 0.95)
		if !ok {
			t.Fatal("startDrainPace refused an unpaced socket")
		}
		if got := capOf(f); got != 9_500_000 {
			t.Errorf("cap during the drain pace = %d, want 9500000", got)
		}
		p.stop()
		if got := capOf(f); got != old {
			t.Errorf("cap after stop = %d, want the old %d", got, old)
		}

		if _, ok := startDrainPace(f, 0, 0.95); ok {
			t.Error("startDrainPace set a cap without a rate")
		}
		if err := unix.SetsockoptUint64(f, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, 1_000_000); err != nil {
			t.Fatal(err)
		}
		if _, ok := startDrainPace(f, 10_000_000, 0.95); ok {
			t.Error("startDrainPace raised the cap of a socket already paced lower")
		}
		if got := capOf(f); got != 1_000_000 {
			t.Errorf("cap of a socket already paced lower = %d, want it left at 1000000", got)
		}
	}); err != nil {
		t.Fatal(err)
	}
}
