package xagent

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// monoNow is CLOCK_MONOTONIC (bpf_ktime_get_ns's clock, which xlate's
// timestamp latch reads).
func monoNow() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// bootID is the kernel's boot id: two ends with the same one share
// CLOCK_MONOTONIC (network namespaces of one host).
func bootID() ([16]byte, error) {
	var id [16]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id, err
	}
	h, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err != nil || len(h) != 16 {
		return id, fmt.Errorf("xagent: boot id %q", b)
	}
	copy(id[:], h)
	return id, nil
}
